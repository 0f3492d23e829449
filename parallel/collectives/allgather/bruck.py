"""Allgather by Bruck's algorithm: ``ceil(log2 p)`` steps on any rank count.

Each rank collects the blocks in rotated order (its own first, then those of
``rank + 1, rank + 2, ...``) at the front of a scratch vector, so what it has
collected is always one prefix: at step ``k`` it sends the first
``min(2**k, p - 2**k)`` collected blocks to ``rank - 2**k`` and appends as many from
``rank + 2**k``. A final rotation puts the blocks in rank order into ``recvbuf``.
Blocks follow `block_range` (uneven sizes: each block sits at its own offset of the
rotated layout, worked out once per shape). As MPICH's ``allgather_intra_brucks``;
conventions and cost notation as in `parallel.collectives.base`.
"""
from parallel.collectives.base import block_slices
from parallel.collectives.plans import Collective
from parallel.collectives.ring import allgather_length, own_block
from parallel.collectives.schedule import Schedule


def bruck_schedule(rank, p, n, itemsize=None, in_place=False, counts=None):
    """Steps of `allgather_bruck` on ``rank`` for a full vector of ``n`` items (a `Schedule`; blocks of
    `block_range`, or of ``counts`` items)."""
    schedule = Schedule()
    if n == 0:
        return schedule
    slices = block_slices(n, p, counts)
    # rotated[i]: offset in "tmp" of block (rank + i) % p. The blocks of ranks rank .. p-1 come first,
    # their ``head`` items, then those of 0 .. rank-1.
    head = n - slices[rank].start
    rotated = [part.start - slices[rank].start if index >= rank else head + part.start
               for index, part in enumerate(slices)]
    rotated = rotated[rank:] + rotated[:rank] + [n]
    own, first = own_block(slices, rank, in_place), ("tmp", slice(0, rotated[1]))
    if p == 1:
        schedule.copy(own, first)
    distance = 1
    while distance < p:
        count = min(distance, p - distance)
        incoming = ("tmp", slice(rotated[distance], rotated[distance + count]))
        if distance == 1:   # the own block sent from where it is, copied to the front meanwhile (an early copy)
            schedule.step([(own, (rank - 1) % p)], [(incoming, (rank + 1) % p)], [("early_copy", own, first)])
        else:
            schedule.exchange(("tmp", slice(0, rotated[count])), (rank - distance) % p, incoming, (rank + distance) % p)
        distance <<= 1
    after, before = slice(slices[rank].stop, n), slice(0, slices[rank].start)
    if not in_place:
        schedule.copy(("tmp", slice(0, rotated[1])), ("out", slices[rank]))
    schedule.step(ops=[("copy", ("tmp", slice(rotated[1], head)), ("out", after)),
                       ("copy", ("tmp", slice(head, n)), ("out", before))])
    return schedule


_BRUCK = Collective("allgather_bruck", bruck_schedule, allgather_length, reduces=False)


def allgather_bruck(comm, sendbuf, recvbuf, counts=None):
    """Gather every rank's block into the full vector on every rank (Bruck's algorithm).

    Parameters and return value as `parallel.collectives.ring.allgather_ring` (``sendbuf``:
    this rank's block of `block_range`, shape ``(block_counts(n, p)[rank],)``, or
    ``MPI.IN_PLACE``; ``recvbuf``: shape ``(n,)``; ``counts``: the v-variant's blocks).

    Notes
    -----
    Cost per rank: ``ceil(log2 p) alpha + (p-1)/p n beta`` on any rank count
    (latency-optimal without folding), plus local copies: the own block into the
    scratch vector and the rotation of the others into ``recvbuf``, ``n`` bytes in
    all (``n + n/p`` out of place, where the own block is copied into ``recvbuf`` too); the first step
    sends the own block from where it is (sending data just written costs more on one node) while it is
    copied into the scratch vector. Scratch: ``n`` bytes.
    """
    return _BRUCK(comm, sendbuf, recvbuf, None, counts)
