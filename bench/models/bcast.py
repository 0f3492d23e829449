"""Model of suite ``bcast`` (`bench.cases.bcast`): MPI_Bcast and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives.bcast import BCAST_SCHEDULES


class BcastModel(CollectiveModel):
    name = "bcast"
    algorithms = BCAST_SCHEDULES
    rooted = True

    def problem_size(self, size, ranks, scaling):
        """The root's vector: the same under weak scaling (what each rank receives or sends)."""
        return size

    def library(self, calib, nbytes, ranks):
        """MPI_Bcast: its calibrated call on two ranks, scaled by `bench.models.collective_terms.library`."""
        return collective_terms.library(calib, "bcast", nbytes, ranks, collective_terms.bcast)
