"""Allgather by recursive doubling on ``p' = 2**floor(log2 p)`` virtual ranks.

At distance ``d = 1, 2, ..., p'/2`` each virtual rank swaps the group of ``d`` virtual
ranks' blocks it holds with the partner whose virtual rank differs in bit ``d``, so
the groups double each step. MPICH runs this algorithm on powers of two only (its
non-power-of-two branch is marked experimental); other rank counts here fold as
MPICH's allreduce does (`parallel.collectives.power_of_two`): of the first
``2 (p - p')`` ranks each even one hands its block to the odd one above it, the pair
then acts as one virtual rank holding two adjacent blocks, and the even one gets the
whole vector at the end. Blocks follow `block_range` over ``p`` (uneven sizes; a
virtual rank's blocks are contiguous in ``recvbuf``, so every message is one view).
Conventions and cost notation as in `parallel.collectives.base`.
"""
from parallel.collectives.base import block_slices
from parallel.collectives.plans import Collective
from parallel.collectives.ring import allgather_length, own_block
from parallel.collectives.schedule import Schedule


def _first_block(virtual_rank, extra):
    """The first of a virtual rank's blocks: those of the pair ``2v, 2v + 1`` below ``extra``, else ``v + extra``."""
    return 2 * virtual_rank if virtual_rank < extra else virtual_rank + extra


def _real_rank(virtual_rank, extra):
    """The rank standing for a virtual rank (the odd one of a folded pair)."""
    return 2 * virtual_rank + 1 if virtual_rank < extra else virtual_rank + extra


def recursive_doubling_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `allgather_recursive_doubling` on ``rank`` for a full vector of ``n`` items (a `Schedule`;
    blocks of `block_range`, or of ``counts`` items)."""
    schedule = Schedule()
    if n == 0:
        return schedule
    slices = block_slices(n, p, counts)
    mine, whole = own_block(slices, rank, in_place), ("out", slice(0, n))
    size = 1 << (p.bit_length() - 1)
    extra = p - size
    if rank < 2 * extra and rank % 2 == 0:
        schedule.step(sends=[(mine, rank + 1)])
        schedule.step(recvs=[(whole, rank + 1)])
        return schedule
    # Out of place, a rank holding its own block alone sends it from "in" at the first step, copying it into
    # "out" meanwhile (an early copy): sending data just written costs more here (a clean buffer's cache
    # lines are not in the sender's core), 1.7-3.5x at 128 KiB-2 MiB on two ranks of one node.
    early = not in_place and size > 1 and rank >= 2 * extra
    if not in_place and not early:
        schedule.copy(mine, ("out", slices[rank]))
    if rank < 2 * extra:
        schedule.step(recvs=[(("out", slices[rank - 1]), rank - 1)])
    virtual = rank // 2 if rank < 2 * extra else rank - extra
    starts = [slices[_first_block(v, extra)].start for v in range(size)] + [n]
    distance = 1
    while distance < size:
        partner = virtual ^ distance
        ours, theirs = virtual // distance * distance, partner // distance * distance
        real = _real_rank(partner, extra)
        outgoing, incoming = ("out", slice(starts[ours], starts[ours + distance])), \
            ("out", slice(starts[theirs], starts[theirs + distance]))
        if distance == 1 and early:
            schedule.step([(mine, real)], [(incoming, real)], [("early_copy", mine, outgoing)])
        else:
            schedule.exchange(outgoing, real, incoming, real)
        distance <<= 1
    if rank < 2 * extra:
        schedule.step(sends=[(whole, rank - 1)])
    return schedule


_RECURSIVE_DOUBLING = Collective("allgather_recursive_doubling", recursive_doubling_schedule, allgather_length,
                                 reduces=False)


def allgather_recursive_doubling(comm, sendbuf, recvbuf, counts=None):
    """Gather every rank's block into the full vector on every rank (recursive doubling).

    Parameters and return value as `parallel.collectives.ring.allgather_ring` (``sendbuf``:
    this rank's block of `block_range`, shape ``(block_counts(n, p)[rank],)``, or
    ``MPI.IN_PLACE``; ``recvbuf``: shape ``(n,)``; ``counts``: the v-variant's blocks).

    Notes
    -----
    On a power of two, cost per rank ``log2 p alpha + (p-1)/p n beta`` (latency-optimal
    and bandwidth-optimal; message sizes double each step). Otherwise the ``p - p'``
    folded pairs add ``alpha + n/p beta`` (the even rank's block) and ``alpha + n beta``
    (the whole vector back) to the critical path; the exchanges move ``(p'-1)/p' n``
    bytes at most per virtual rank. Out of place one local copy of the own block
    (``n/p`` bytes; none on a folded even rank), made while the first step's messages are in flight where
    that step sends the own block alone (from ``sendbuf``). No scratch.
    """
    return _RECURSIVE_DOUBLING(comm, sendbuf, recvbuf, None, counts)
