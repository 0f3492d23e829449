"""Model of suite ``allgather`` (`bench.cases.allgather`): MPI_Allgather(v) and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives.allgather import ALLGATHER_SCHEDULES


class AllgatherModel(CollectiveModel):
    name = "allgather"
    algorithms = ALLGATHER_SCHEDULES

    def library(self, calib, nbytes, ranks):
        """MPI_Allgather(v): its calibrated call on two ranks, scaled by `bench.models.collective_terms.library`."""
        return collective_terms.library(calib, "allgather", nbytes, ranks, collective_terms.allgather)
