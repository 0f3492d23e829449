"""Model of suite ``tp`` (`bench.cases.tp`): a Megatron MLP block split over the ranks."""
import math

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.settings import Setting, choice, integer
from kernels.distribution import block_counts
from kernels.errors import InputError
from parallel.collectives.allgather import ALLGATHER_SCHEDULES
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_SCHEDULES
from parallel.tensor.exchange import FAMILIES, TENSOR_COLLECTIVES

SETTINGS = (
    Setting("TP_HIDDEN", integer, 1024, 1, "model width h"),
    Setting("TP_FFN", integer, None, 1, "inner width f (default 4 h)"),
    Setting("TP_COLLECTIVES", choice, "mpi", TENSOR_COLLECTIVES,
            "algorithms of the allreduce / allgather / reduce-scatter: MPI's, or hand-written: ring; "
            "recursive (Rabenseifner, recursive doubling, recursive halving); auto (each one's auto)"),
)


def read_settings(settings):
    """Block sizes ``hidden`` and ``ffn`` and the ``collectives`` from the suite's ``settings``."""
    hidden = settings["TP_HIDDEN"]
    return dict(hidden=hidden, ffn=settings["TP_FFN"] or 4 * hidden, collectives=settings["TP_COLLECTIVES"])


class TensorParallelModel(Model):
    name = "tp"
    variants = ("allreduce", "sequence", "serial")
    size_unit = "tokens"
    declared_settings = SETTINGS
    settings_reader = staticmethod(read_settings)

    def check_ranks(self, ranks, variant):
        if variant == "serial" and ranks != 1:
            raise InputError(f"tp variant serial runs on one rank, not {ranks}")
        if self.config["ffn"] < ranks:
            raise InputError(f"tp: ffn {self.config['ffn']} cannot be split over {ranks} ranks")

    def predict(self, variant, size, ranks, calib):
        """Six GEMMs of (T, h) x (h, ceil(f / p)) (two forward, four backward; `terms.gemm`), the ReLU,
        and per pass one ``Allreduce`` of T h (allreduce) or an ``Allgatherv`` and a ``Reduce_scatter``
        of T h (sequence): MPI's (its library terms) or the hand-written family ``TP_COLLECTIVES``
        names (`collective_terms.allreduce` of the algorithm; the allgather and reduce-scatter from their
        schedules on the row blocks, `bench.models.collective_terms.hand_written`)."""
        hidden, ffn, collectives = self.config["hidden"], self.config["ffn"], self.config["collectives"]
        item, local = terms.itemsize(calib), math.ceil(ffn / ranks)
        compute = 6 * terms.gemm(calib, size, local, hidden, ranks) + 3 * terms.copy(calib, size * local * item)
        activations = size * hidden * item
        if variant == "serial":
            return compute
        names = FAMILIES.get(collectives, ("mpi",) * 3)
        if variant == "allreduce":
            return compute + 2 * collective_terms.allreduce(calib, activations, ranks, names[0], written=True)
        if collectives == "mpi":
            exchange = collective_terms.allgather(calib, activations, ranks) + collective_terms.reduce_scatter(calib, activations, ranks)
        else:
            blocks = tuple(rows * hidden for rows in block_counts(size, ranks))
            exchange = sum(collective_terms.hand_written(calib, builders[name], ranks, size * hidden, item, blocks)
                           for builders, name in ((ALLGATHER_SCHEDULES, names[1]), (REDUCE_SCATTER_SCHEDULES, names[2])))
        return compute + 2 * (exchange + collective_terms.allgather(calib, 8 * ranks, ranks))

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """x and dy (T x h, drawn in float64), y, dx and an allreduce buffer; this rank's
        ``ffn / p`` columns of both weights with gradients and ``T x ffn / p`` activations;
        the check runs the whole serial block (all weights, ``T x ffn`` activations)."""
        tokens, hidden, ffn = problem, self.config["hidden"], self.config["ffn"]
        share = -(-ffn // ranks)
        run = 5 * tokens * hidden + 4 * hidden * share + 3 * tokens * share
        reference = 4 * hidden * ffn + 3 * tokens * ffn + 2 * tokens * hidden
        return np.dtype(dtype).itemsize * (run + (reference if check else 0)) + 8 * tokens * hidden
