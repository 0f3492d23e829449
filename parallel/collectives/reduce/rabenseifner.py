"""Reduce to a root by recursive-halving reduce-scatter and a binomial gather of the blocks.

MPICH's ``reduce_intra_reduce_scatter_gather`` (Rabenseifner's reduce): on ``p' =
2**floor(log2 p)`` virtual ranks the vector is reduce-scattered by recursive halving
(`parallel.collectives.power_of_two.halving_steps`, as in Rabenseifner's allreduce), then
block groups are gathered up a binomial tree to virtual rank 0. Surplus ranks fold in
first as MPICH's reduce folds them (`parallel.collectives.power_of_two.Fold` with
``keeps=0``: of each pair the even rank stays, so the root, virtual rank 0 of
`parallel.collectives.rooted.RootedCollective`, always takes part and no final message to
it is needed). Conventions and cost notation as in `parallel.collectives.base`.
"""
from kernels.distribution import block_offsets
from parallel.collectives.base import allreduce_length
from parallel.collectives.power_of_two import Fold, block_group, halving_steps, trivial_schedule
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import Schedule


def rabenseifner_reduce_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `reduce_rabenseifner` on virtual rank ``rank`` (root 0) for ``n`` items (a `Schedule`).

    After the halving, virtual rank ``v`` holds block ``v`` in "out". At distance ``d = 1, 2, ...``
    a rank with bit ``d`` set sends the group of ``d`` blocks it holds to ``v - d`` and is done;
    the others receive that group next to their own, so virtual rank 0 ends with every block.
    """
    schedule = trivial_schedule(p, n, in_place)
    if schedule is not None:
        return schedule
    schedule = Schedule()
    fold = Fold(schedule, rank, p, n, in_place, keeps=0)
    if fold.rank is None:
        return schedule
    bounds = block_offsets(n, fold.size) + [n]
    halving_steps(schedule, fold, bounds)
    distance = 1
    while distance < fold.size:
        partner = fold.real_rank(fold.rank ^ distance)
        if fold.rank & distance:
            schedule.step(sends=[(("out", block_group(bounds, fold.rank, distance)), partner)])
            break
        schedule.step(recvs=[(("out", block_group(bounds, fold.rank ^ distance, distance)), partner)])
        distance <<= 1
    return schedule


_RABENSEIFNER = RootedCollective("reduce_rabenseifner", rabenseifner_reduce_schedule, allreduce_length)


def reduce_rabenseifner(comm, sendbuf, recvbuf, op="sum", root=0):
    """Reduce every rank's vector to ``root`` by a reduce-scatter and a gather (Rabenseifner).

    Parameters and return value as `parallel.collectives.reduce.binomial.reduce_binomial`
    (``recvbuf``, shape ``(n,)``, is workspace on the ranks other than ``root``: its contents
    afterwards are unspecified).

    Notes
    -----
    The vector is split into ``p'`` blocks (`block_range`; some empty when ``n < p'``). Cost on
    the critical path: ``2 log2 p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma`` (the halving
    sends and reduces ``(p'-1)/p' n``; the root receives ``(p'-1)/p' n`` in the gather); folding
    adds ``alpha + n beta + n gamma``. Bandwidth-optimal, the choice for long vectors; each
    rank reduces only ``(p'-1)/p' n`` bytes, against up to ``ceil(log2 p) n`` on the binomial
    tree's root. Scratch: at most ``n/2`` bytes (none out of place on two ranks: the first half
    lands in ``recvbuf``), ``n`` on a rank that folds a partner in place.
    """
    return _RABENSEIFNER(comm, sendbuf, recvbuf, op, root)
