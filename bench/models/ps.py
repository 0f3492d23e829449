"""Model of suite ``ps`` (`bench.cases.ps`): parameter-server steps of the MLP (the MLP of suite ``dp``)."""
import math

import numpy as np

from bench.models import terms
from bench.models.base import Model
from bench.models.dp import ACTIVATIONS, DATA_SHAPES, PARAMETERS, dense_parameters, fitted_mlp_step, mlp_widths
from bench.settings import Setting, choice, integer
from kernels.errors import InputError
from parallel.data.param_server import MODES, check_roles

MODELS = ("mlp", "cnn")

SETTINGS = (
    Setting("PS_SERVERS", integer, 1, 1, "server ranks S (at most ranks - 1)"),
    Setting("PS_STALENESS", integer, 2, 0, "staleness bound s of variant ssp"),
    Setting("PS_MODEL", choice, "mlp", MODELS, "model (the MLP of suite dp, or the CNN)"),
)


class ParameterServerModel(Model):
    name = "ps"
    variants = MODES
    size_unit = "samples"
    declared_settings = SETTINGS

    def __init__(self, settings=None):
        super().__init__(settings)
        self.servers, self.staleness, self.model_name = (self.settings[s.name] for s in SETTINGS)

    def predict(self, variant, size, ranks, calib):
        """The MLP's forward and backward on a worker's ceil(n / W) samples, scaled and with the fixed cost
        of a step's Python calls as the calibrated one-rank ``dp`` steps give them (`bench.models.dp.fitted_mlp_step`:
        a step of the same MLP, its SGD update left to the servers); per server shard of P / S
        parameters, the busiest server receives W gradient shards and sends W parameter shards one by
        one (blocking: in sequence), and adds each gradient (SGD); a request and an end notice per worker.
        None for the CNN."""
        try:
            check_roles(ranks, self.servers)
        except InputError:
            return None
        if self.model_name != "mlp":
            return None
        widths, workers, item = mlp_widths(), ranks - self.servers, terms.itemsize(calib)
        parameters = dense_parameters(widths)
        shard = math.ceil(parameters / self.servers) * item
        fixed, forward, backward = fitted_mlp_step(calib, math.ceil(size / workers), widths[0], ranks, update_share=0)
        server = workers * (2 * terms.message(calib, shard) + 2 * terms.reduction(calib, shard)
                            + 2 * terms.message(calib, 16))
        return fixed + forward + backward + server

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """The MNIST sample on every rank (the bytes read, then scaled and split: 2 copies), the
        model and its shards, and the activations of a worker's ``ceil(n / W)`` samples
        (`bench.models.dp.ACTIVATIONS` per sample); the check's serial step (rank 0) runs the whole
        global batch of n samples."""
        samples, pixels = DATA_SHAPES["mnist"]
        workers = max(1, ranks - self.servers)
        batch = -(-problem // workers) + (problem if check else 0)
        item = np.dtype(dtype).itemsize
        return samples * pixels + item * (2 * samples * pixels + 8 * PARAMETERS[self.model_name]
                                          + ACTIVATIONS[self.model_name](pixels) * batch)
