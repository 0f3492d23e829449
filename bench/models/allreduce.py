"""Model of suite ``allreduce`` (`bench.cases.allreduce`): MPI_Allreduce and the hand-written algorithms."""
import numpy as np

from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives import ALLREDUCE_ALGORITHMS
from parallel.collectives.nccl_wire import NCCL_WIRE_CHOICES


class AllreduceModel(CollectiveModel):
    """The collectives' settings and rules (`bench.models.collective`); the algorithms are priced by
    `bench.models.collective_terms.allreduce` (the hand-written ones as their steps are priced, in closed form;
    ``hierarchical`` as its ring inside one node)."""

    name = "allreduce"
    algorithms = dict.fromkeys(ALLREDUCE_ALGORITHMS)
    reduces = True
    wire_variants = NCCL_WIRE_CHOICES
    device_only_variants = dict({"nccl": "NCCL sums device buffers only (--backend cupy)"}, **{
        name: "its messages go over NCCL, between device buffers only (--backend cupy)" for name in NCCL_WIRE_CHOICES})

    def problem_size(self, size, ranks, scaling):
        """The vector every rank reduces: the same under weak scaling (each rank's share of the work)."""
        return size

    def predict(self, variant, size, ranks, calib):
        """`bench.models.collective_terms.allreduce` of ``size`` bytes by ``variant`` on ``ranks`` ranks, plus the
        Python call of the run (one rank: a copy)."""
        if variant == "nccl" or variant in self.wire_variants:  # NCCL's transport: not calibrated
            return None
        return calib["overhead_s"] + collective_terms.allreduce(calib, size, ranks, variant)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Send and receive buffers of ``problem`` bytes, one more for the algorithm's scratch on
        several ranks; the check draws each rank's input as int64, then sums them."""
        scratch = problem if ranks > 1 else 0
        reference = 8 * (problem // np.dtype(dtype).itemsize) + (3 if ranks > 1 else 1) * problem
        return 2 * problem + scratch + (reference if check else 0)
