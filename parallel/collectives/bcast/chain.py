"""Broadcast along a pipelined chain: root -> 1 -> 2 -> ... -> p - 1, in segments.

On virtual ranks (root 0; `parallel.collectives.rooted`), each rank but the root
receives segment ``i`` from its left neighbour while it sends segment ``i - 1`` to its
right one, so once the first segment has reached the last rank every link is busy. A
segment is `SEGMENT_BYTES` (or the caller's ``segment_bytes``) rounded down to whole
items, at least one; the last may be shorter. Conventions and cost notation as in
`parallel.collectives.base`.
"""
import operator
from functools import partial

from parallel.collectives.base import allreduce_length
from parallel.collectives.bcast.base import input_buffer, root_or_in_place
from parallel.collectives.rooted import RootedCollective
from parallel.collectives.schedule import Schedule

#: Default segment size in bytes, measured as `parallel.collectives.bcast.auto` says. Minimum
#: microseconds of a 4 MiB vector with 64 KiB / 256 KiB / 512 KiB / 1 MiB segments: 3 ranks 2950 /
#: 1702 / 1436 / 1365, 4 ranks 1591 / 1124 / 1124 / 1240; of 8 MiB on 4 ranks, 256 KiB 5650, 512 KiB
#: 4470, 1 MiB 4094. 1 MiB was fastest or within 10 % at every size from 1 to 16 MiB on 3 and 4
#: ranks (on 8, four per core, 28 % behind 256 KiB at 2 MiB): in shared memory the copies share one
#: memory bus, so pipelining gains little while every message costs a hand-shake. A network, where
#: each link has its own bandwidth, wants smaller segments.
SEGMENT_BYTES = 1 << 20


def chain_schedule(rank, p, n, itemsize, in_place=False, segment_bytes=SEGMENT_BYTES):
    """Steps of `bcast_chain` on virtual rank ``rank`` (root 0) for ``n`` items of ``itemsize`` bytes
    (a `Schedule`)."""
    schedule = Schedule()
    if n == 0:
        return schedule
    width = max(segment_bytes // itemsize, 1)
    source = input_buffer(rank, in_place)
    segments = [(source, slice(start, min(start + width, n))) for start in range(0, n, width)]
    last = rank == p - 1
    for index in range(len(segments) + 1):  # receive segment index, send segment index - 1
        sends = [(segments[index - 1], rank + 1)] if index and not last else []
        recvs = [(segments[index], rank - 1)] if rank and index < len(segments) else []
        if sends or recvs:
            schedule.step(sends=sends, recvs=recvs)
    if source == "in":
        schedule.copy((source, slice(0, n)), ("out", slice(0, n)))
    return schedule


_CHAINS = {}  # segment bytes -> RootedCollective (each caches its own layouts and plans)


def bcast_chain(comm, sendbuf, recvbuf, root=0, segment_bytes=SEGMENT_BYTES):
    """Broadcast the root's vector along a pipelined chain of the ranks, in segments.

    Parameters
    ----------
    comm, sendbuf, recvbuf, root
        As `parallel.collectives.bcast.binomial.bcast_binomial`.
    segment_bytes : int
        Bytes per segment (rounded down to whole items, at least one item); the same on
        every rank. A non-positive one is a ``ValueError``.

    Returns
    -------
    recvbuf

    Notes
    -----
    With ``S = ceil(n / s)`` segments of ``s`` bytes, the last rank has the vector after
    ``(p - 2 + S) (alpha + s beta)``; every rank but the last sends ``n`` bytes in ``S``
    messages. For ``S >> p`` that is ``n beta`` plus ``(p - 2)`` segment times: close
    to the bandwidth bound, at ``S`` latencies per rank. Out of place the root copies
    its ``n`` bytes into ``recvbuf``. No scratch.
    """
    segment_bytes = operator.index(segment_bytes)
    if segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
    collective = _CHAINS.get(segment_bytes)
    if collective is None:
        collective = _CHAINS[segment_bytes] = RootedCollective(
            f"bcast_chain[segment={segment_bytes}]", partial(chain_schedule, segment_bytes=segment_bytes),
            allreduce_length, reduces=False)
    return collective(comm, root_or_in_place(comm, sendbuf, root), recvbuf, None, root)
