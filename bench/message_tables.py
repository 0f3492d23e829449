"""The message tables `bench.calibrate` measures between rank 0 and its partner (see its module docstring).

Each entry of a table is a median over rounds that visit every entry in turn (a burst of load on a shared
machine spreads over many entries), each sample the mean of back-to-back calls after a barrier: the
``pingpong``, ``exchange``, ``exchange_fresh``, ``stream`` and ``allreduce`` tables, MPI's other collectives' calls
(``library``, `bench.library_tables`), the per-message ``overhead_s`` and the hand-written call's
``call_s``; what is measured is a `MessagePlan` (`FULL_MESSAGES`, `QUICK_MESSAGES`).
"""
import socket
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from mpi4py import MPI

from bench.library_tables import SIZES as LIBRARY_SIZES, library_callers
from bench.local_rates import ROUNDS, measure_interleaved
from bench.provenance import mpi_library
from bench.stability import table_spread

PINGPONG_SIZES = [8 << k for k in range(22)]  # 8 B .. 16 MiB
STREAM_SIZES = PINGPONG_SIZES[:20]  # 8 B .. 4 MiB
SLOPE_FROM = 1 << 20
#: Smallest seconds per byte recorded for a slope (beta, gamma): 1 PB/s, a floor no machine reaches.
MIN_SLOPE = 1e-15


@dataclass(frozen=True)
class MessagePlan:
    """What the message tables measure: their sizes, ``rounds`` per entry, back-to-back calls per sample
    (``calls``: below `SLOPE_FROM`, from it on; the window table takes a fifth of them, at least 1)."""

    sizes: tuple = tuple(PINGPONG_SIZES)
    stream_sizes: tuple = tuple(STREAM_SIZES)
    library_sizes: tuple = LIBRARY_SIZES
    rounds: int = ROUNDS
    calls: tuple = (50, 10)


FULL_MESSAGES = MessagePlan()
#: Every eighth size from 8 B and the two largest (the slope over 1-16 MiB needs two), one round.
QUICK_MESSAGES = MessagePlan(sizes=tuple(PINGPONG_SIZES[:-2:3]) + tuple(PINGPONG_SIZES[-2:]),
                             stream_sizes=tuple(STREAM_SIZES[::3]) + (STREAM_SIZES[-1],),
                             library_sizes=LIBRARY_SIZES[::5], rounds=1, calls=(10, 2))


def measure_pair(pair, plan):
    """The message tables (see the module) at the sizes of ``plan`` (a `MessagePlan`), each entry the median
    over its rounds, which visit every entry in turn; a sample is the mean of back-to-back calls after a
    barrier, the slower rank's (its first call also makes the pair's connection)."""
    def calls(n, fraction=1):
        return max(1, plan.calls[n >= SLOPE_FROM] // fraction)

    entries = {("pingpong", n): (_pingponger(pair, n), calls(n)) for n in plan.sizes}
    entries.update({("exchange", n): (_exchanger(pair, n), calls(n)) for n in plan.sizes})
    entries.update({("exchange_fresh", n): (_forwarder(pair, n), calls(n)) for n in plan.sizes})
    entries.update({("stream", n): (_windower(pair, n), calls(n, 5)) for n in plan.stream_sizes})
    entries.update({("allreduce", n): (_reducer(pair, n), calls(n)) for n in plan.sizes})
    with ExitStack() as stack:
        entries.update({(f"library.{suite}", n): (function, calls(n)) for (suite, n), function in
                        library_callers(pair, stack, plan.library_sizes).items()})
        samples = {key: [] for key in entries}
        for _ in range(plan.rounds):
            for key, (function, count) in entries.items():
                samples[key].append(_mean_seconds(pair, function, count))
    seconds = np.array([np.median(values) for values in samples.values()])
    pair.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    tables = {name: [] for name, _ in entries}
    for (table, n), value in zip(entries, seconds.tolist()):
        tables[table].append([n, value / {"pingpong": 2, "stream": _window()}.get(table, 1)])
    spreads = _larger_spreads(pair.allgather({table: table_spread(values for (name, _), values in samples.items()
                                                                  if name == table) for table in tables}))
    overhead = _proc_null_seconds(pair)
    if pair.rank != 0:
        return None
    large = [(n, t) for n, t in tables["pingpong"] if n >= SLOPE_FROM]
    # > 0 whatever the samples (a slope measured flat or falling on an oversubscribed node; its table's spread says so)
    beta = max(float(np.polyfit([n for n, _ in large], [t for _, t in large], 1)[0]), MIN_SLOPE)
    alpha = max(tables["pingpong"][0][1] - overhead - plan.sizes[0] * beta, 1e-9)  # > 0: below the clock
    library = {name.split(".", 1)[1]: tables.pop(name) for name in list(tables) if name.startswith("library.")}
    return dict(alpha_s=alpha, beta_s_per_byte=beta, overhead_s=overhead, call_s=_hand_written_call_seconds(),
                **tables, library=library, spread=spreads,
                mpi_library=mpi_library(), host=socket.gethostname(),
                timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _larger_spreads(per_rank):
    """The larger of each table's spread over the ranks' dicts of them (None when a table has none)."""
    return {table: None if any(spreads[table] is None for spreads in per_rank) else
            max(spreads[table] for spreads in per_rank) for table in per_rank[0]}


def _buffers(nbytes):
    """Separate send and receive buffers of ``nbytes``, written once (as OSU's; a rank that receives into
    the buffer it then sends from can take twice as long per message here), as mpi4py buffer specs."""
    return [np.ones(nbytes, np.uint8), MPI.BYTE], [np.ones(nbytes, np.uint8), MPI.BYTE]


def _pingponger(comm, nbytes):
    """A round trip of ``nbytes``: rank 0 sends first, rank 1 echoes from its own send buffer."""
    (send, recv), partner = _buffers(nbytes), 1 - comm.rank
    if comm.rank == 0:
        def run():
            comm.Send(send, partner)
            comm.Recv(recv, partner)
    else:
        def run():
            comm.Recv(recv, partner)
            comm.Send(send, partner)
    return run


def _exchanger(comm, nbytes):
    """Both ranks send ``nbytes`` to each other at once."""
    (send, recv), partner = _buffers(nbytes), 1 - comm.rank
    return lambda: comm.Sendrecv(send, partner, 0, recv, partner, 0)


def _forwarder(comm, nbytes):
    """Both ranks send ``nbytes`` to each other at once, each sending what it received in the call before (its
    two buffers swap roles every call): a send buffer this rank has just written, as a block a hand-written
    collective forwards or packs (dirty in this core's cache, which the partner reads across cores)."""
    buffers, partner = list(_buffers(nbytes)), 1 - comm.rank

    def run():
        comm.Sendrecv(buffers[0], partner, 0, buffers[1], partner, 0)
        buffers.reverse()
    return run


def _reducer(comm, nbytes):
    """``MPI_Allreduce`` (sum) of ``nbytes`` of float64 (8 at least) on both ranks."""
    send, recv = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))
    return lambda: comm.Allreduce(send, recv, op=MPI.SUM)


def _hand_written_call_seconds():
    """Seconds of a hand-written allreduce of 8 B on ``MPI.COMM_SELF``: its Python path (checks, plan) and a copy."""
    from parallel.collectives import ALLREDUCE_ALGORITHMS, release_plans

    send, recv, allreduce = np.ones(1), np.ones(1), ALLREDUCE_ALGORITHMS["recursive_doubling"]
    try:
        return measure_interleaved({"call": lambda: allreduce(MPI.COMM_SELF, send, recv)})["call"]
    finally:
        release_plans(MPI.COMM_SELF)


def _window():
    from bench.models.p2p import WINDOW

    return WINDOW


def _windower(comm, nbytes):
    """Rank 0 sends a window of messages of ``nbytes``, rank 1 receives them and acknowledges."""
    (send, recv), ack, window = _buffers(nbytes), [np.zeros(1, np.uint8), MPI.BYTE], _window()
    if comm.rank == 0:
        def run():
            MPI.Request.Waitall([comm.Isend(send, 1, 0) for _ in range(window)])
            comm.Recv(ack, 1, 1)
    else:
        def run():
            MPI.Request.Waitall([comm.Irecv(recv, 0, 0) for _ in range(window)])
            comm.Send(ack, 0, 1)
    return run


def _mean_seconds(comm, function, calls):
    """Mean seconds of ``calls`` back-to-back ``function()`` calls after a barrier; one call before it
    brings the buffers back into the caches (the other entries of a round evicted them)."""
    function()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(calls):
        function()
    return (MPI.Wtime() - start) / calls


def _proc_null_seconds(comm, calls=2000):
    """Seconds of one ``Sendrecv`` with ``MPI.PROC_NULL`` on both sides: the per-message software path."""
    send, recv = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    best = float("inf")
    for _ in range(3):
        start = MPI.Wtime()
        for _ in range(calls):
            comm.Sendrecv(send, MPI.PROC_NULL, 0, recv, MPI.PROC_NULL, 0)
        best = min(best, (MPI.Wtime() - start) / calls)
    return comm.allreduce(best, op=MPI.MAX)
