"""Model of suite ``pp`` (`bench.cases.pp`): pipeline-parallel training steps of an MLP or the SimpleCNN."""
import numpy as np

from bench.models import terms
from bench.models.base import Model
from bench.settings import Setting, choice, integer
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.pipeline.schedule import BALANCES, PIPEDREAM, SCHEDULES

MODELS = ("mlp", "cnn")
CNN_LAYERS, CNN_PARAMETERS, CNN_ACTIVATIONS = 10, 21840, 50_000
#: Most samples the check's serial step runs (pp and hybrid).
CHECK_SAMPLES = 256


SETTINGS = (
    Setting("PP_MICROBATCHES", integer, 8, 1, "micro-batches m per step (the global batch is a multiple of m); "
                                              "1: naive model parallelism"),
    Setting("PP_MODEL", choice, "mlp", MODELS, "mlp (synthetic data) or cnn (the lecture's SimpleCNN on MNIST)"),
    Setting("PP_WIDTH", integer, 1024, 1, "layer width W (mlp)"),
    Setting("PP_LAYERS", integer, 8, 1,
            "linear layers L (mlp: 2 L - 1 layers with the ReLUs: at most that many ranks)"),
    Setting("PP_BALANCE", choice, None, BALANCES + ("parts",),
            "stage split: layer count, parameter count, measured time, or parts (cnn on 2 ranks: convolutions | "
            "dense); default layers (mlp), parts on 2 ranks else time (cnn)"),
)


class PipelineModel(Model):
    name = "pp"
    variants = SCHEDULES + (PIPEDREAM,)
    size_unit = "samples"
    declared_settings = SETTINGS

    def __init__(self, settings=None):
        super().__init__(settings)
        self.micro_batches, self.network, self.width, self.layers, self.balance = (self.settings[s.name]
                                                                                     for s in SETTINGS)

    def layer_count(self):
        """Layers of the network, ReLUs included (at most that many stages)."""
        return CNN_LAYERS if self.network == "cnn" else 2 * self.layers - 1

    def balance_on(self, ranks):
        """The balance of the stages on ``ranks`` ranks (the setting, else the default of the network)."""
        if self.balance is not None:
            return self.balance
        return "layers" if self.network == "mlp" else ("parts" if ranks == 2 else "time")

    def check_ranks(self, ranks, variant):
        if ranks > self.layer_count():
            hint = "" if self.network == "cnn" else f"; MLSCALE_PP_LAYERS={self.layers} gives {self.layer_count()} " \
                                                  f"(linear and ReLU)"
            raise InputError(f"pp: {ranks} stages need at least {ranks} layers; the {self.network} has "
                             f"{self.layer_count()}{hint}")
        if self.balance_on(ranks) == "parts" and (self.network != "cnn" or ranks != 2):
            raise InputError(f"pp: MLSCALE_PP_BALANCE=parts is the lecture's SimpleCNN split: MLSCALE_PP_MODEL=cnn "
                             f"on 2 ranks (got {self.network} on {ranks})")

    def predict(self, variant, size, ranks, calib):
        """MLP with ``layers`` balance: the busiest stage's Linear layers (`terms.dense_layers`) on one
        micro-batch of n / m samples, `terms.pipeline` of it (``m + p - 1`` slots for gpipe and 1f1b,
        ``m`` for PipeDream's steady state, an activation message each way per micro-batch), and the
        passes over the stage's B parameter bytes as `parallel.pipeline` makes them: every micro-batch's
        backward writes its weight gradients (a copy of B); gpipe and 1f1b add
        each micro-batch's gradient to the step's sum (a reduction of B), zero the sum and copy it out once
        a step, then one SGD update (``lr g`` into scratch, a copy of B; ``w -=`` it, a reduction of B);
        PipeDream updates after every micro-batch and, on several stages, stashes a copy of the weights
        first. None for the CNN and the other balances (stage times not modelled)."""
        if self.network != "mlp" or self.balance_on(ranks) != "layers" or size % self.micro_batches:
            return None
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        item, rows = terms.itemsize(calib), size // self.micro_batches
        linears = max(sum(1 for index in range(*block_range(self.layer_count(), ranks, rank)) if index % 2 == 0)
                      for rank in range(ranks))  # layers alternate Linear, ReLU
        forward, backward = terms.dense_layers(calib, (self.width, self.width), rows, ranks)
        stage_bytes = linears * (self.width + 1) * self.width * item
        update = terms.copy(calib, stage_bytes) + terms.reduction(calib, stage_bytes)  # SGD: lr g, then w -= it
        stage = linears * (forward + backward) + terms.copy(calib, stage_bytes)  # the weight gradients written
        if variant == PIPEDREAM:  # an update per micro-batch, and a stashed copy of the weights it overwrites
            stage += update + (terms.copy(calib, stage_bytes) if ranks > 1 else 0.0)
            return terms.pipeline(calib, stage, rows * self.width * item, self.micro_batches, ranks, flush=False)
        stage += terms.reduction(calib, stage_bytes)  # the micro-batch's gradient added to the step's sum
        step = terms.copy(calib, stage_bytes / 2) + terms.copy(calib, stage_bytes) + update  # zero, copy out, SGD
        return terms.pipeline(calib, stage, rows * self.width * item, self.micro_batches, ranks) + step

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """The whole model with gradients (every rank builds it, then keeps its stage and a copy of it),
        the batch (mlp: ``n x W`` drawn in float64; cnn: the MNIST sample and the batch) and the stage's
        activations of every micro-batch; pipedream's stashed weights (at most ``p - 1`` copies of a
        stage: counted as the model); the check's serial reference (rank 0) builds the model again and
        runs at most `CHECK_SAMPLES` samples (pipedream's replay keeps up to ``p + 1`` versions)."""
        stages = -(-self.layer_count() // ranks)
        item = np.dtype(dtype).itemsize
        if self.network == "cnn":
            params, per_sample, data = CNN_PARAMETERS, CNN_ACTIVATIONS, 5000 * 784 * (1 + item) + problem * 784 * item
            checked = 4 * CHECK_SAMPLES * CNN_ACTIVATIONS
        else:
            params, per_sample = self.layers * self.width * self.width, self.width * (1 + 2 * stages)
            data, checked = 8 * problem * self.width, 4 * self.layers * CHECK_SAMPLES * self.width
        stash = params if variant == PIPEDREAM else 0
        run = 4 * params + stash + problem * per_sample
        reference = (6 + (ranks + 1 if variant == PIPEDREAM else 0)) * params + checked
        return item * (run + (reference if check else 0)) + data
