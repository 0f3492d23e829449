"""Model of suite ``allreduce`` (`bench.cases.allreduce`): MPI_Allreduce and the hand-written algorithms."""
import numpy as np

from bench.models import terms
from bench.models.collective import CollectiveModel
from parallel.collectives import ALLREDUCE_ALGORITHMS


class AllreduceModel(CollectiveModel):
    """The collectives' settings and rules (`bench.models.collective`); the algorithms are priced by
    `bench.models.terms.allreduce`, not from their steps (``hierarchical`` composes sub-communicators)."""

    name = "allreduce"
    algorithms = dict.fromkeys(ALLREDUCE_ALGORITHMS)
    reduces = True
    device_only_variants = {"nccl": "NCCL sums device buffers only (--backend cupy)"}

    def problem_size(self, size, ranks, scaling):
        """The vector every rank reduces: the same under weak scaling (each rank's share of the work)."""
        return size

    def predict(self, variant, size, ranks, calib):
        """`bench.models.terms.allreduce` of ``size`` bytes by ``variant`` on ``ranks`` ranks, plus the
        Python call of the run (one rank: a copy)."""
        if variant == "nccl":  # NCCL's own choice of algorithm and transport: not modelled
            return None
        return calib["overhead_s"] + terms.allreduce(calib, size, ranks, variant)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Send and receive buffers of ``problem`` bytes, one more for the algorithm's scratch on
        several ranks; the check draws each rank's input as int64, then sums them."""
        scratch = problem if ranks > 1 else 0
        reference = 8 * (problem // np.dtype(dtype).itemsize) + (3 if ranks > 1 else 1) * problem
        return 2 * problem + scratch + (reference if check else 0)
