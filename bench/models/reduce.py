"""Model of suite ``reduce`` (`bench.cases.reduce`): MPI_Reduce and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import terms
from bench.models.collective import CollectiveModel
from parallel.collectives.reduce import REDUCE_SCHEDULES


class ReduceModel(CollectiveModel):
    name = "reduce"
    algorithms = REDUCE_SCHEDULES
    reduces = True
    rooted = True

    def library(self, calib, nbytes, ranks):
        """MPI_Reduce by `bench.models.terms`."""
        return terms.reduce(calib, nbytes, ranks)
