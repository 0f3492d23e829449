"""Alltoall by Bruck's algorithm: ``ceil(log2 p)`` messages per rank, for small blocks.

Bruck et al. (IEEE TPDS, 1997), as MPICH's ``MPIR_Alltoall_intra_brucks``: rotate
the blocks so that position ``i`` holds the data for rank ``r + i``; at step ``k``
send every position whose index has bit ``k`` set to rank ``r + 2**k`` (packed into
one message) and receive the same positions from ``r - 2**k``; a position has moved
by ``i`` ranks once its last bit is done, so at the end position ``i`` holds rank
``r - i``'s block for ``r`` (the inverse rotation). Both rotations are index
arithmetic, no copies: a position is packed straight from the send block where it
starts and unpacked straight into its place in ``recvbuf`` at its last step.

Uneven blocks (`block_range`): a block from any rank to rank ``j`` has ``c_j``
items, so a position's size changes as it travels: before step ``k``, position
``i`` on rank ``q`` holds data for rank ``q + (i`` with bits below ``k`` cleared)
and has that rank's count. Packed offsets are worked out once, in the schedule.
Block layout and in place as in `parallel.collectives.alltoall.blocks`; cost
notation of `parallel.collectives.base`.
"""
from parallel.collectives.alltoall.blocks import AlltoallBlocks, alltoall_length
from parallel.collectives.plans import Collective


def _packed(views, start):
    """The non-empty ``views`` (``(buffer, slice)`` pairs) laid one after another in "tmp" from ``start``:
    the ``(view, packed view)`` pairs and the view of the whole message (None when all are empty)."""
    pairs, first = [], start
    for view in views:
        size = view[1].stop - view[1].start
        if size:
            pairs.append((view, ("tmp", slice(start, start + size))))
            start += size
    return pairs, ("tmp", slice(first, start)) if pairs else None


def bruck_schedule(rank, p, n, itemsize=None, in_place=False):
    """Steps of `alltoall_bruck` on ``rank`` for a send vector of ``n`` items (a `Schedule`)."""
    blocks = AlltoallBlocks(rank, p, n, in_place)
    schedule = blocks.start()
    width = blocks.counts[0]              # the largest block: a slot of scratch per position
    slots, outbox = blocks.scratch, blocks.scratch + p * width
    inbox = outbox + p // 2 * width       # at most p // 2 positions move per step
    where = [blocks.send((rank + i) % p) for i in range(p)]
    distance = 1
    while distance < p:
        moving = [i for i in range(1, p) if i & distance]
        dest, source = (rank + distance) % p, (rank - distance) % p
        targets = []
        for i in moving:
            if i < 2 * distance:          # no higher bit left: position i arrives, from rank r - i
                targets.append(blocks.recv((rank - i) % p))
            else:                         # data for rank source + (i without its bits below this step's)
                size = blocks.counts[(source + (i & -distance)) % p]
                targets.append(("tmp", slice(slots + i * width, slots + i * width + size)))
        packing, outgoing = _packed([where[i] for i in moving], outbox)
        unpacking, incoming = _packed(targets, inbox)
        schedule.step(ops=[("copy", view, packed) for view, packed in packing])
        schedule.step([(outgoing, dest)] if outgoing else [], [(incoming, source)] if incoming else [],
                      [("copy", packed, target) for target, packed in unpacking])
        for i, target in zip(moving, targets):
            where[i] = target
        distance <<= 1
    return schedule


_BRUCK = Collective("alltoall_bruck", bruck_schedule, alltoall_length, reduces=False)


def alltoall_bruck(comm, sendbuf, recvbuf):
    """Alltoall by Bruck's algorithm: ``ceil(log2 p)`` packed exchanges.

    Parameters and return value as
    `parallel.collectives.alltoall.pairwise.alltoall_pairwise`.

    Notes
    -----
    Cost per rank: ``ceil(log2 p) alpha + ceil(log2 p) n/2 beta`` (at most
    ``floor(p/2)`` blocks per message; store and forward, so each block travels up
    to ``ceil(log2 p)`` times), plus the pack and unpack copies of every message
    (``2 ceil(log2 p) n/2`` bytes copied) and the local copy of the own block.
    Fewest latencies: best for small blocks on many ranks. Scratch: a slot of
    ``ceil(n/p)`` items per position and two packed messages, about ``2 n`` bytes
    (``n`` more in place).
    """
    return _BRUCK(comm, sendbuf, recvbuf, None)
