"""Model of suite ``alltoall`` (`bench.cases.alltoall`): MPI_Alltoall(v) and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives.alltoall import ALLTOALL_SCHEDULES


class AlltoallModel(CollectiveModel):
    name = "alltoall"
    algorithms = ALLTOALL_SCHEDULES

    def library(self, calib, nbytes, ranks):
        """MPI_Alltoall(v): its calibrated call on two ranks, scaled by `bench.models.collective_terms.library`."""
        return collective_terms.library(calib, "alltoall", nbytes, ranks, collective_terms.alltoall)
