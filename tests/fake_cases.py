"""Small cases that misbehave on purpose, loaded by the CLI tests as ``tests.fake_cases:NAME``."""
from bench.case import Case, Metrics


class _Tiny(Case):
    name = "fake"
    benchmark = "fake"
    variants = ("only",)
    size_unit = "items"
    default_sizes = "4"

    def iterations(self, size):
        return 2, 0

    def setup(self, comm, size, variant, backend, dtype):
        return comm

    def run(self, comm):
        comm.Barrier()

    def check(self, comm):
        return 0

    def metrics(self, comm, seconds):
        return Metrics(items_per_s=1 / seconds)


class RaisesOnRankOne(_Tiny):
    """Rank 1 raises inside the timed work while the others wait in a barrier."""

    def run(self, comm):
        if comm.rank == 1:
            raise RuntimeError("boom on purpose")
        comm.Barrier()


class SetupFailsOnLastRank(_Tiny):
    """The last rank cannot build its inputs; every rank must hear of it."""

    def setup(self, comm, size, variant, backend, dtype):
        if comm.rank == comm.size - 1:
            raise MemoryError("no room on purpose")
        return comm


class AlwaysWrong(_Tiny):
    """Its check finds one wrong element per rank."""

    def check(self, comm):
        return 1
