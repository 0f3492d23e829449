"""Allreduce on ``p' = 2**floor(log2 p)`` virtual ranks: recursive doubling and Rabenseifner.

Both pair ranks whose virtual ranks differ in one bit, so they need a power-of-two
rank count; other counts fold the surplus ranks in first (`Fold`, MPICH's scheme)
and hand them the result at the end. `Fold` and the recursive halving (`halving_groups`,
`halving_steps`) also serve `parallel.collectives.reduce_scatter.recursive_halving` and
`parallel.collectives.reduce.rabenseifner`. The steps are laid out once per shape
(`parallel.collectives.schedule`) and run from cached plans
(`parallel.collectives.plans`). Conventions and cost notation as in
`parallel.collectives.base`.
"""
from kernels.distribution import block_offsets
from parallel.collectives.base import allreduce_length
from parallel.collectives.plans import Collective
from parallel.collectives.schedule import Schedule


class Fold:
    """Fold ``p`` ranks onto ``p' = 2**floor(log2 p)`` virtual ranks (MPICH's scheme).

    Of the first ``2 (p - p')`` ranks, pairs ``(2i, 2i + 1)`` become one virtual rank
    ``i``: the rank of parity ``keeps`` receives its partner's whole input, reduces
    both into "out" and stands for both (``keeps=1``, MPICH's allreduce: the odd one;
    ``keeps=0``, MPICH's reduce: the even one, so rank 0 is virtual rank 0); the other
    waits in `unfold` for the result. Other ranks keep going as virtual rank
    ``rank - (p - p')``. ``rank`` is this rank's virtual rank (None when folded away),
    ``size`` is ``p'``. ``data`` is the buffer holding this rank's contribution
    now: "out" after a fold, else "in" (out of place the input is not copied: the
    algorithms' first step reads ``data`` and writes "out"). The partner's data
    lands in "out" while that is still free (`landing`), else in "tmp".
    """

    def __init__(self, schedule, rank, p, n, in_place, keeps=1):
        self.schedule, self.rank_in_comm, self.n, self.in_place, self.keeps = schedule, rank, n, in_place, keeps
        self.size = 1 << (p.bit_length() - 1)
        self.extra = p - self.size
        whole = slice(0, n)
        self.rank, self.data = rank - self.extra, "in"
        if rank < 2 * self.extra and rank % 2 != keeps:
            schedule.step(sends=[(("in", whole), rank ^ 1)])
            self.rank = None
        elif rank < 2 * self.extra:
            incoming = (self.landing(), whole)
            schedule.step(recvs=[(incoming, rank ^ 1)], ops=[("reduce", ("in", whole), incoming, ("out", whole))])
            self.rank, self.data = rank // 2, "out"

    def landing(self):
        """Where the partner's data can land: "out" while it holds nothing yet (out of place, before
        this rank wrote it), else "tmp"."""
        return "out" if self.data == "in" and not self.in_place else "tmp"

    def real_rank(self, virtual_rank):
        """Rank in ``comm`` of a virtual rank."""
        return 2 * virtual_rank + self.keeps if virtual_rank < self.extra else virtual_rank + self.extra

    def unfold(self):
        """Hand the finished "out" back to the ranks folded away."""
        rank, whole = self.rank_in_comm, ("out", slice(0, self.n))
        if rank < 2 * self.extra:
            if self.rank is not None:
                self.schedule.step(sends=[(whole, rank ^ 1)])
            else:
                self.schedule.step(recvs=[(whole, rank ^ 1)])


def block_group(bounds, virtual_rank, distance):
    """The slice of the ``distance`` consecutive blocks (``bounds``: their offsets and the length) whose
    aligned group holds block ``virtual_rank``."""
    first = virtual_rank // distance * distance
    return slice(bounds[first], bounds[first + distance])


def halving_groups(virtual_rank, size, bounds):
    """The recursive-halving steps of ``virtual_rank`` among ``size`` (a power of two) virtual ranks.

    Yields ``(partner, mine, theirs)`` for ``distance = size/2, ..., 1``: the partner's virtual rank
    ``virtual_rank ^ distance``, the group of ``distance`` blocks this rank keeps reducing and the
    partner's group, which it sends; after the last step ``mine`` is block ``virtual_rank`` alone.
    """
    for exponent in reversed(range(size.bit_length() - 1)):
        distance = 1 << exponent
        partner = virtual_rank ^ distance
        yield partner, block_group(bounds, virtual_rank, distance), block_group(bounds, partner, distance)


def halving_steps(schedule, fold, bounds):
    """Reduce-scatter by recursive halving on ``fold``'s virtual ranks, partials in "out" (full length).

    At the end "out" holds block ``fold.rank`` (of ``bounds``) reduced over all ranks; its other
    blocks hold partial results. The first step reads ``fold.data``; afterwards it is "out".
    """
    for partner, mine, theirs in halving_groups(fold.rank, fold.size, bounds):
        real = fold.real_rank(partner)
        incoming = ("out", mine) if fold.landing() == "out" else ("tmp", slice(0, mine.stop - mine.start))
        schedule.exchange((fold.data, theirs), real, incoming, real,
                          reduce=((fold.data, mine), incoming, ("out", mine)))
        fold.data = "out"


def trivial_schedule(p, n, in_place):
    """The schedule of one rank or an empty vector (a copy out of place), else None."""
    if n == 0 or p == 1:
        schedule = Schedule()
        if n and not in_place:
            schedule.copy(("in", slice(0, n)), ("out", slice(0, n)))
        return schedule
    return None


def recursive_doubling_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `allreduce_recursive_doubling` on ``rank`` for ``n`` items (a `Schedule`)."""
    schedule = trivial_schedule(p, n, in_place)
    if schedule is not None:
        return schedule
    schedule, whole = Schedule(), slice(0, n)
    fold = Fold(schedule, rank, p, n, in_place)
    if fold.rank is not None:
        distance = 1
        while distance < fold.size:
            partner = fold.real_rank(fold.rank ^ distance)
            data, incoming = (fold.data, whole), (fold.landing(), whole)
            schedule.exchange(data, partner, incoming, partner, reduce=(data, incoming, ("out", whole)))
            fold.data, distance = "out", distance << 1
    fold.unfold()
    return schedule


def rabenseifner_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `allreduce_rabenseifner` on ``rank`` for ``n`` items (a `Schedule`)."""
    schedule = trivial_schedule(p, n, in_place)
    if schedule is not None:
        return schedule
    schedule = Schedule()
    fold = Fold(schedule, rank, p, n, in_place)
    if fold.rank is not None:
        bounds = block_offsets(n, fold.size) + [n]
        halving_steps(schedule, fold, bounds)
        distance = 1
        while distance < fold.size:
            partner = fold.rank ^ distance
            real = fold.real_rank(partner)
            schedule.exchange(("out", block_group(bounds, fold.rank, distance)), real,
                              ("out", block_group(bounds, partner, distance)), real)
            distance <<= 1
    fold.unfold()
    return schedule


_RECURSIVE_DOUBLING = Collective("allreduce_recursive_doubling", recursive_doubling_schedule, allreduce_length)
_RABENSEIFNER = Collective("allreduce_rabenseifner", rabenseifner_schedule, allreduce_length)


def allreduce_recursive_doubling(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive doubling: ``log2 p'`` full-vector exchanges.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    For ``p`` not a power of two the first ``2 (p - p')`` ranks fold pairwise first
    and get the result back at the end (`Fold`). Cost per rank:
    ``log2 p' (alpha + n beta + n gamma)``; folding adds ``2 (alpha + n beta) + n gamma``
    to the critical path. Latency-optimal; best for small vectors. Scratch: ``n`` bytes (none
    out of place on two ranks: the partner's vector lands in ``recvbuf``).
    """
    return _RECURSIVE_DOUBLING(comm, sendbuf, recvbuf, op)


def allreduce_rabenseifner(comm, sendbuf, recvbuf, op="sum"):
    """Allreduce by recursive-halving reduce-scatter and recursive-doubling allgather.

    Parameters and return value as `parallel.collectives.ring.allreduce_ring`.

    Notes
    -----
    The vector is split into ``p'`` blocks (`block_range`; some are empty when
    ``n < p'``). At distance ``d = p'/2, ..., 1`` each virtual rank keeps the group of
    ``d`` blocks holding its own block and sends its partner the other group; the
    allgather retraces the steps with ``d = 1, ..., p'/2``. Extra ranks fold as in
    `allreduce_recursive_doubling`. Cost per rank:
    ``2 log2 p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma``; folding adds
    ``2 (alpha + n beta) + n gamma`` to the critical path. Scratch: at most ``n`` bytes, none out
    of place on two ranks (the first half lands in ``recvbuf``).
    """
    return _RABENSEIFNER(comm, sendbuf, recvbuf, op)
