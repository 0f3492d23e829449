"""Model of suite ``reduce_scatter`` (`bench.cases.reduce_scatter`): MPI_Reduce_scatter and the hand-written
algorithms, priced from their own steps (`bench.models.collective`)."""
from bench.models import collective_terms
from bench.models.collective import CollectiveModel
from parallel.collectives.reduce_scatter import REDUCE_SCATTER_SCHEDULES


class ReduceScatterModel(CollectiveModel):
    name = "reduce_scatter"
    algorithms = REDUCE_SCATTER_SCHEDULES
    reduces = True

    def library(self, calib, nbytes, ranks):
        """MPI_Reduce_scatter: its calibrated call on two ranks, scaled by `bench.models.collective_terms.library`."""
        return collective_terms.library(calib, "reduce_scatter", nbytes, ranks, collective_terms.reduce_scatter)
