"""Model of suite ``reduce`` (`bench.cases.reduce`): MPI_Reduce and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives.reduce import REDUCE_SCHEDULES


class ReduceModel(CollectiveModel):
    name = "reduce"
    algorithms = REDUCE_SCHEDULES
    reduces = True
    rooted = True

    def problem_size(self, size, ranks, scaling):
        """The root's vector: the same under weak scaling (what each rank receives or sends)."""
        return size

    def library(self, calib, nbytes, ranks):
        """MPI_Reduce: its calibrated call on two ranks, scaled by `bench.models.collective_terms.library`."""
        return collective_terms.library(calib, "reduce", nbytes, ranks, collective_terms.reduce)
