"""Model of suite ``hybrid`` (`bench.cases.hybrid`): MLP blocks on a dp x tp x pp grid of the ranks."""
import math
import re

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model, balanced_dims
from bench.models.pp import CHECK_SAMPLES
from bench.settings import Setting, choice, integer
from kernels.errors import InputError
from parallel.hybrid import AXES, check_grid
from parallel.pipeline.schedule import SCHEDULES
from parallel.tensor.exchange import FAMILIES, TENSOR_COLLECTIVES


GRID_PATTERN = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)


def parse_grid(text):
    """``(dp, tp, pp)`` from ``DPxTPxPP`` text such as ``2x1x2``."""
    match = GRID_PATTERN.match(text)
    if not match or min(int(value) for value in match.groups()) < 1:
        raise InputError(f"MLSCALE_HYBRID_GRID={text!r}: expected DPxTPxPP with positive integers, e.g. 2x1x2")
    return tuple(int(value) for value in match.groups())


def grid_setting(variable, text, allowed):
    """`parse_grid` of non-empty text; None for empty text."""
    return parse_grid(text) if text else None


SETTINGS = (
    Setting("HYBRID_GRID", grid_setting, None, "DPxTPxPP", "shape of variant grid, e.g. 2x1x2"),
    Setting("HYBRID_HIDDEN", integer, 512, 1, "block width"),
    Setting("HYBRID_FFN", integer, 2048, 1, "block inner width (>= tp)"),
    Setting("HYBRID_BLOCKS", integer, 4, 1, "MLP blocks (>= pp)"),
    Setting("HYBRID_MICROBATCHES", integer, 4, 1, "micro-batches per replica and step"),
    Setting("HYBRID_SCHEDULE", choice, "1f1b", SCHEDULES, "pipeline schedule"),
    Setting("HYBRID_COLLECTIVES", choice, "mpi", TENSOR_COLLECTIVES,
            "the tp blocks' allreduce: MPI's, or hand-written: ring; recursive (Rabenseifner); auto"),
)


def grid_for(variant, ranks, grid=None):
    """The ``(dp, tp, pp)`` shape of ``variant`` on ``ranks`` ranks (``grid``: the shape of variant ``grid``)."""
    if variant == "grid":
        if grid is None:
            raise InputError("hybrid variant 'grid' needs MLSCALE_HYBRID_GRID=DPxTPxPP, e.g. 2x1x2")
        return grid
    named = variant.split("_")
    factors = balanced_dims(ranks, len(named))
    if len(named) > 1 and min(factors) < 2:
        raise InputError(f"hybrid {variant}: {ranks} ranks do not split over {len(named)} axes with at least "
                         f"2 ranks each")
    shape = dict(zip(named, factors))
    return tuple(shape.get(axis, 1) for axis in AXES)


class HybridModel(Model):
    name = "hybrid"
    variants = ("dp", "tp", "pp", "dp_tp", "dp_pp", "tp_pp", "dp_tp_pp", "grid")
    size_unit = "samples"
    declared_settings = SETTINGS

    def __init__(self, settings=None):
        super().__init__(settings)
        (self.grid, self.hidden, self.ffn, self.blocks, self.micro_batches, self.schedule,
         self.collectives) = (self.settings[s.name] for s in SETTINGS)

    def check_ranks(self, ranks, variant):
        check_grid(ranks, *grid_for(variant, ranks, self.grid), self.hidden, self.ffn, self.blocks)

    def predict(self, variant, size, ranks, calib):
        """A (dp, tp, pp) step: per micro-batch of ceil(n / dp) / m samples a stage runs its ceil(blocks / pp)
        blocks (six GEMMs of the ffn / tp shard, `terms.dense_layers`, and two tensor allreduces of
        the block's activations: MPI's or the algorithm ``HYBRID_COLLECTIVES`` names), each block's weight
        gradients written (a copy) and added to the step's sum (a reduction); `terms.pipeline` over the stages;
        then the gradient allreduce over dp, the sums copied to the layers and the SGD update with momentum
        (three in-place passes and a scaled copy)."""
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        dp, tp, pp = grid_for(variant, ranks, self.grid)
        item, m = terms.itemsize(calib), self.micro_batches
        rows = math.ceil(math.ceil(size / dp) / m)
        blocks = math.ceil(self.blocks / pp)
        forward, backward = terms.dense_layers(calib, (self.hidden, self.ffn, self.hidden), rows, ranks, split=tp)
        algorithm = FAMILIES.get(self.collectives, ("mpi",))[0]
        tensor = 2 * collective_terms.allreduce(calib, rows * self.hidden * item, tp, algorithm, written=True) \
            if tp > 1 else 0.0
        block_gradients = (2 * self.hidden * math.ceil(self.ffn / tp) + self.ffn + self.hidden) * item
        summed = terms.copy(calib, block_gradients) + terms.reduction(calib, block_gradients)
        stage = blocks * (forward + backward + tensor + summed)
        gradients = blocks * block_gradients
        exchange = collective_terms.allreduce(calib, gradients, dp) if dp > 1 else 0.0
        update = terms.copy(calib, gradients) + 3 * terms.reduction(calib, gradients) + terms.copy(calib, gradients)
        return terms.pipeline(calib, stage, rows * self.hidden * item, m, pp) + exchange + update

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """This rank's shard of its stage's blocks (``blocks / pp`` blocks of ``2 hidden ffn / tp``
        weights) with gradients and copies, the batch (``n x hidden``, drawn in float64), and
        the activations of its replica's ``n / dp`` samples; the check (rank 0) builds the whole
        serial model twice (with flat copies) and steps at most `CHECK_SAMPLES` samples."""
        dp, tp, pp = grid_for(variant, ranks, self.grid)
        hidden, ffn = self.hidden, self.ffn
        blocks = -(-self.blocks // pp)
        run = 4 * blocks * 2 * hidden * -(-ffn // tp) + problem * hidden
        run += 2 * -(-problem // dp) * (hidden + -(-ffn // tp)) * blocks
        reference = 7 * self.blocks * 2 * hidden * ffn + 2 * CHECK_SAMPLES * (hidden + ffn) * self.blocks
        return np.dtype(dtype).itemsize * (run + (reference if check else 0)) + 8 * problem * hidden
