"""Small cases that misbehave on purpose, loaded by the CLI tests as ``tests.fake_cases:NAME``."""
from bench.case import Case, Metrics
from kernels.errors import InputError


class TinyCase(Case):
    """A case that does nothing but a barrier: the base of the misbehaving ones here and elsewhere."""

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


class RaisesOnRankOne(TinyCase):
    """Rank 1 raises inside the timed work while the others wait in a barrier."""

    def run(self, comm):
        if comm.rank == 1:
            raise RuntimeError("boom on purpose")
        comm.Barrier()


class InputErrorInRunOnEveryRank(TinyCase):
    """Every rank finds its input unusable inside the timed work (svm's three classes on two ranks)."""

    def run(self, comm):
        raise InputError("three classes on purpose")


class SetupFailsOnLastRank(TinyCase):
    """The last rank cannot build its inputs; every rank must hear of it."""

    def setup(self, comm, size, variant, backend, dtype):
        if comm.rank == comm.size - 1:
            raise MemoryError("no room on purpose")
        return comm


class AlwaysWrong(TinyCase):
    """Its check finds one wrong element per rank."""

    def check(self, comm):
        return 1


class InputErrorInRunOnRankOne(TinyCase):
    """Rank 1 finds its input unusable inside the timed work (as a one-class svmlight file would)."""

    def run(self, comm):
        if comm.rank == 1:
            raise InputError("one class only on purpose")
        comm.Barrier()


class InputErrorInCheckOnRankOne(TinyCase):
    """Rank 1 refuses its input while checking (a NaN feature, say); the others check fine."""

    def check(self, comm):
        if comm.rank == 1:
            raise InputError("NaN feature on purpose")
        return 0


class CheckRaisesOnLastRank(TinyCase):
    """The last rank's check fails unexpectedly."""

    def check(self, comm):
        if comm.rank == comm.size - 1:
            raise ZeroDivisionError("check on purpose")
        return 0


class TeardownFailsOnLastRank(TinyCase):
    """The last rank cannot release its state."""

    def teardown(self, comm):
        if comm.rank == comm.size - 1:
            raise RuntimeError("teardown on purpose")


class NotACase:
    """Named as a suite, but not a `bench.case.Case`."""


class CheckFailsBeforeACollective(TinyCase):
    """Rank 1 raises in check while the others go on into a collective of the check (as svm's does)."""

    def check(self, comm):
        if comm.rank == 1:
            raise InputError("cannot evaluate on purpose")
        comm.Barrier()
        return 0


class SetupFailsBeforeASplit(TinyCase):
    """The last rank fails in setup while the others build a sub-communicator."""

    def setup(self, comm, size, variant, backend, dtype):
        if comm.rank == comm.size - 1:
            raise ValueError("setup on purpose")
        return comm.Split(0, comm.rank)


class CheckFailsEverywhere(TinyCase):
    """Every rank finds the result unusable; the point's state must still be torn down (``torn_down``)."""

    torn_down = []

    def check(self, comm):
        raise InputError("unusable on purpose")

    def teardown(self, comm):
        self.torn_down.append(comm.size)


class SlowSetup(TinyCase):
    """Every point spends at least ``FAKE_SETUP_SECONDS`` (default 1) in set-up: a sweep of several points
    outlasts a short --time-limit."""

    def setup(self, comm, size, variant, backend, dtype):
        import os
        import time

        time.sleep(float(os.environ.get("FAKE_SETUP_SECONDS", "1")))
        return comm


class HangsAfterTheFirstPoint(TinyCase):
    """Sizes after the first sleep in set-up for good: a job that only a signal ends."""

    def setup(self, comm, size, variant, backend, dtype):
        import time

        while size > 1:
            time.sleep(0.1)
        return comm


class Jittery(TinyCase):
    """Runs alternate between 2 ms and 50 ms of sleep: the samples' spread is about 1.8; it falls to 0.25 only
    if the 2 ms sleeps took 39 ms (load only lengthens runs)."""

    def iterations(self, size):
        return 4, 0

    def setup(self, comm, size, variant, backend, dtype):
        return {"comm": comm, "runs": 0}

    def run(self, state):
        import time

        state["runs"] += 1
        time.sleep(0.05 if state["runs"] % 2 else 0.002)

    def check(self, state):
        return 0

    def metrics(self, state, seconds):
        return Metrics(items_per_s=1 / seconds)
