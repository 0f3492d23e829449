"""The message tables `bench.calibrate` measures between rank 0 and its partner (see its module docstring).

Each entry of a table is a median over rounds that visit every entry in turn (a burst of load on a shared
machine spreads over many entries), each sample the mean of back-to-back calls after a barrier: the
``pingpong``, ``oneway``, ``exchange``, ``exchange_fresh``, ``stream`` and ``allreduce`` tables, MPI's other collectives' calls
(``library``, `bench.library_tables`), the per-message ``overhead_s`` and the hand-written call's
``call_s``; what is measured is a `MessagePlan` (`FULL_MESSAGES`, `QUICK_MESSAGES`).

The node's handoff state: right before each sample the pair times the handoff probe (`handoff_prober`: an
exchange of `HANDOFF_BYTES` each rank has just written, read across cores). On this 2-core VM it ran in one of
two states that flipped every few to 20 seconds: 85-190 us (median 91) or 400-700 us (median 467), while a
clean exchange of the same size held 84-100 us; MPI's out-of-place allgather of 2 MiB moved with it, 134-260
or 390-870 us, as its own copy of the send block is such a handoff. A table whose three rounds fell in both
states mixed them entry by entry (MPI_Allgather's table 3.3x faster than the sweep run after it at 1-4 MiB).
After the rounds, where the probes saw both states, the pair goes on probing and samples each entry that has
fewer than `min(rounds, 2)` samples in the state the probe finds, until every entry has them in both (or
``hunt`` times the entries have been sampled; `FULL_MESSAGES` 4, `QUICK_MESSAGES` none): in pass l here, the rounds alone left
some table without a sample in the other state in the p2p, allreduce and allgather calibrations, and the sweep
after each ran wholly in that state. Samples whose probe lies in the state most samples saw
(`bench.state_tables.reference_state`) make the tables; ``handoff_s`` is their probes' median,
``handoff_other_samples`` how many were not. ``other_state`` holds the tables of the other state
(`bench.state_tables.other_state_tables`) with their own ``alpha_s``, ``beta_s_per_byte`` and ``handoff_s``.
"""
import socket
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from mpi4py import MPI

from bench.library_tables import SIZES as LIBRARY_SIZES, library_callers
from bench.interleaved import ROUNDS, measure_interleaved
from bench.provenance import mpi_library
from bench.stability import table_spread
from bench.state_tables import HUNT_ROUNDS, other_state_tables, state_samples

PINGPONG_SIZES = [8 << k for k in range(22)]  # 8 B .. 16 MiB
STREAM_SIZES = PINGPONG_SIZES[:20]  # 8 B .. 4 MiB
SLOPE_FROM = 1 << 20
#: Smallest seconds per byte recorded for a slope (beta, gamma): 1 PB/s, a floor no machine reaches.
MIN_SLOPE = 1e-15
#: Bytes of the handoff probe's exchange (each way): 1 MiB, in the caches of a core.
HANDOFF_BYTES = 1 << 20
#: Back-to-back exchanges a handoff sample times (after one untimed).
HANDOFF_CALLS = 3


@dataclass(frozen=True)
class MessagePlan:
    """What the message tables measure: their sizes, ``rounds`` per entry, back-to-back calls per sample
    (``calls``: below `SLOPE_FROM`, from it on; the window table takes a fifth of them, at least 1) and at most
    ``hunt`` rounds' worth of samples seeking each handoff state (`bench.state_tables.state_samples`)."""

    sizes: tuple = tuple(PINGPONG_SIZES)
    stream_sizes: tuple = tuple(STREAM_SIZES)
    library_sizes: tuple = LIBRARY_SIZES
    rounds: int = ROUNDS
    calls: tuple = (50, 10)
    hunt: int = HUNT_ROUNDS


FULL_MESSAGES = MessagePlan()
#: Every eighth size from 8 B and the two largest (the slope over 1-16 MiB needs two), one round.
QUICK_MESSAGES = MessagePlan(sizes=tuple(PINGPONG_SIZES[:-2:3]) + tuple(PINGPONG_SIZES[-2:]),
                             stream_sizes=tuple(STREAM_SIZES[::3]) + (STREAM_SIZES[-1],),
                             library_sizes=LIBRARY_SIZES[::5], rounds=1, calls=(10, 2), hunt=0)


def measure_pair(pair, plan):
    """The message tables (see the module) at the sizes of ``plan`` (a `MessagePlan`), each entry the median
    over its rounds, which visit every entry in turn, of the samples in the reference handoff state (all of
    them for an entry with none there); a sample is the mean of back-to-back calls after a barrier, the slower
    rank's (its first call also makes the pair's connection)."""
    def calls(n, fraction=1):
        return max(1, plan.calls[n >= SLOPE_FROM] // fraction)

    entries = {("pingpong", n): (_pingponger(pair, n), calls(n)) for n in plan.sizes}
    entries.update({("oneway", n): (_sender(pair, n), calls(n)) for n in plan.sizes})
    entries.update({("exchange", n): (_exchanger(pair, n), calls(n)) for n in plan.sizes})
    entries.update({("exchange_fresh", n): (_forwarder(pair, n), calls(n)) for n in plan.sizes})
    entries.update({("stream", n): (_windower(pair, n), calls(n, 5)) for n in plan.stream_sizes})
    entries.update({("allreduce", n): (_reducer(pair, n), calls(n)) for n in plan.sizes})
    with ExitStack() as stack:
        entries.update({(f"library.{suite}", n): (function, calls(n)) for (suite, n), function in
                        library_callers(pair, stack, plan.library_sizes).items()})
        states = _state_samples(pair, entries, plan.rounds, plan.hunt)
    kept, others = states.kept(), states.others()
    tables, other_tables = _tables(pair, entries, kept), _tables(pair, entries, others)
    spreads = _larger_spreads(pair.allgather({table: table_spread(values for (name, _), values in kept.items()
                                                                  if name == table) for table in tables}))
    overhead = _proc_null_seconds(pair)
    if pair.rank != 0:
        return None
    result = dict(**_fit(tables, overhead, plan.sizes[0]), overhead_s=overhead, call_s=_hand_written_call_seconds(),
                  **_split_library(tables), spread=spreads, handoff_s=states.handoff(),
                  handoff_other_samples=states.other_count(), mpi_library=mpi_library(), host=socket.gethostname(),
                  timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    other = other_state_tables(tables, other_tables)
    if other is not None:
        result["other_state"] = dict(**_fit(other, overhead, plan.sizes[0]), **_split_library(other),
                                     handoff_s=states.handoff(reference=False))
    return result


def _tables(pair, entries, samples):
    """``{table: [[n, seconds], ...]}``: each entry's median of ``samples`` (by key), the slower rank's (None
    for an entry without samples), as the tables hold it (one way for the ping-pong, per message for windows)."""
    seconds = np.array([np.median(values) if values else -1.0 for values in samples.values()])
    pair.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    tables = {name: [] for name, _ in entries}
    for (table, n), value in zip(entries, seconds.tolist()):
        tables[table].append([n, value / {"pingpong": 2, "stream": _window()}.get(table, 1) if value >= 0 else None])
    return tables


def _fit(tables, overhead, smallest):
    """``alpha_s`` and ``beta_s_per_byte`` of the ping-pong table: beta the slope from `SLOPE_FROM` on, alpha the
    rest of its first entry (``smallest`` bytes) beyond ``overhead``."""
    large = [(n, t) for n, t in tables["pingpong"] if n >= SLOPE_FROM]
    # > 0 whatever the samples (a slope measured flat or falling on an oversubscribed node; its table's spread says so)
    beta = max(float(np.polyfit([n for n, _ in large], [t for _, t in large], 1)[0]), MIN_SLOPE)
    alpha = max(tables["pingpong"][0][1] - overhead - smallest * beta, 1e-9)  # > 0: below the clock
    return dict(alpha_s=alpha, beta_s_per_byte=beta)


def _split_library(tables):
    """``tables`` with MPI's collective calls (``library.SUITE``) under ``library``."""
    return {**{name: table for name, table in tables.items() if not name.startswith("library.")},
            "library": {name.split(".", 1)[1]: table for name, table in tables.items() if name.startswith("library.")}}


def handoff_prober(pair):
    """A callable timing the handoff probe on the two ranks of ``pair``: the slower rank's mean seconds of
    `HANDOFF_CALLS` exchanges of `HANDOFF_BYTES` that each rank has just written (`_forwarder`), after one
    untimed. Collective over ``pair``: a barrier, the exchanges and a reduction of one number."""
    forward = _forwarder(pair, HANDOFF_BYTES)
    return lambda: pair.allreduce(_mean_seconds(pair, forward, HANDOFF_CALLS), op=MPI.MAX)


def _state_samples(pair, entries, rounds, hunt=HUNT_ROUNDS):
    """`bench.state_tables.state_samples` of ``entries`` (``{key: (function, calls)}``): this rank's samples
    (`_mean_seconds`), each after the pair's handoff probe (`handoff_prober`)."""
    return state_samples(list(entries), handoff_prober(pair), lambda key: _mean_seconds(pair, *entries[key]), rounds,
                         hunt)


def node_handoff_prober(node, pair):
    """A callable giving every rank of ``node`` the handoff probe (`handoff_prober`) of ``pair`` (its first two
    ranks' communicator, ``MPI.COMM_NULL`` on the others). Collective over ``node``: the probe, a broadcast."""
    prober = handoff_prober(pair) if pair != MPI.COMM_NULL else None
    return lambda: node.bcast(prober() if prober is not None else None, root=0)


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


def _sender(comm, nbytes):
    """Rank 0 sends ``nbytes`` to rank 1, which acknowledges with an empty message: a step of a collective that
    sends one way (two buffers of ``nbytes`` in the caches, where the ping-pong's round trip holds four: here
    2x slower per message at 4-8 MiB, beyond the 32 MiB L3 cache's share)."""
    (send, recv), ack = _buffers(nbytes), [np.zeros(1, np.uint8), 0, MPI.BYTE]
    if comm.rank == 0:
        def run():
            comm.Send(send, 1)
            comm.Recv(ack, 1)
    else:
        def run():
            comm.Recv(recv, 0)
            comm.Send(ack, 0)
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
