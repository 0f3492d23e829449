"""Reduce-scatter by recursive halving on a power-of-two rank count, pairwise exchange on others.

On ``p = 2**k`` ranks this is the first half of Rabenseifner's allreduce
(`parallel.collectives.power_of_two.halving_groups`): ``log2 p`` steps, each sending half of
what is left to reduce. Its blocks over ``p`` are then the `block_range` blocks, so every
rank ends with its own. On other rank counts the ``p'`` virtual ranks of a fold would own
blocks that are not those of ``block_range(n, p, rank)``, so these counts take MPICH's
pairwise exchange (`parallel.collectives.reduce_scatter.pairwise`) instead. Sum and max
commute, so the order in which partial results meet does not matter. Buffers as in
`parallel.collectives.ring.reduce_scatter_ring`; conventions and cost notation as in
`parallel.collectives.base`.
"""
from parallel.collectives.base import block_slices
from parallel.collectives.plans import Collective
from parallel.collectives.power_of_two import halving_groups, trivial_schedule
from parallel.collectives.reduce_scatter.pairwise import pairwise_steps
from parallel.collectives.ring import reduce_scatter_length
from parallel.collectives.schedule import Schedule


def _halving_steps(schedule, rank, p, slices, out, in_place):
    """Recursive halving on ``p = 2**k`` ranks into view ``out``, partials in "tmp".

    Partials are kept in "tmp" at their offset from the start of the first group this rank keeps
    (half the vector), so the other blocks of an in-place ``recvbuf`` stay as they were. Incoming
    halves land where they are reduced at the first step, in "out" at the last step out of place
    (``recvbuf`` holds nothing yet), and otherwise in "tmp" after the partials.
    """
    steps = list(halving_groups(rank, p, [part.start for part in slices] + [slices[-1].stop]))
    first = steps[0][1]
    width = first.stop - first.start

    def partial(part):
        return "tmp", slice(part.start - first.start, part.stop - first.start)

    for index, (partner, mine, theirs) in enumerate(steps):
        last = index == len(steps) - 1
        target = out if last else partial(mine)
        if last and not in_place:
            incoming = out
        elif index == 0 and not last:
            incoming = target
        else:
            spare = width if index else 0
            incoming = ("tmp", slice(spare, spare + mine.stop - mine.start))
        held = ("in", mine) if index == 0 else partial(mine)
        outgoing = ("in", theirs) if index == 0 else partial(theirs)
        schedule.exchange(outgoing, partner, incoming, partner, reduce=(held, incoming, target))


def recursive_halving_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `reduce_scatter_recursive_halving` on ``rank`` for ``n`` items (a `Schedule`; blocks of
    `block_range`, or of ``counts`` items)."""
    schedule = trivial_schedule(p, n, in_place)
    if schedule is not None:
        return schedule
    schedule, slices = Schedule(), block_slices(n, p, counts)
    mine = slices[rank]
    out = ("out", mine if in_place else slice(0, mine.stop - mine.start))
    if p & (p - 1):
        pairwise_steps(schedule, rank, p, slices, out)
    else:
        _halving_steps(schedule, rank, p, slices, out, in_place)
    return schedule


_RECURSIVE_HALVING = Collective("reduce_scatter_recursive_halving", recursive_halving_schedule,
                                reduce_scatter_length)


def reduce_scatter_recursive_halving(comm, sendbuf, recvbuf, op="sum", counts=None):
    """Reduce ``n`` items over all ranks and leave block ``comm.rank`` on each rank (recursive halving).

    Parameters and return value as `parallel.collectives.ring.reduce_scatter_ring` (in place, the
    blocks of ``recvbuf`` other than this rank's are left as they were).

    Notes
    -----
    On ``p = 2**k`` ranks, at distance ``d = p/2, ..., 1`` each rank keeps the group of ``d``
    blocks holding its own block and sends its partner (rank ``rank ^ d``) the other group.
    Cost per rank: ``log2 p alpha + (p-1)/p n beta + (p-1)/p n gamma``; scratch: at most
    ``3/4 n`` bytes (half the vector for the partials, a quarter for an incoming group), ``n/2``
    on four ranks out of place and on two in place, none on two out of place. On other rank
    counts, pairwise exchange: ``(p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma``, scratch one
    block.
    """
    return _RECURSIVE_HALVING(comm, sendbuf, recvbuf, op, counts)
