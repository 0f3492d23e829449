"""``mlscale calibrate``: measure the constants of the cost models (`bench.report.model`).

Between rank 0 and a partner rank (a rank on another shared-memory node when
there is one, so that a calibration inside a two-node allocation measures the
network: ``scope`` ``inter-node``; else rank 1, ``intra-node``):

Each entry of the message tables is a median over rounds that visit every entry in
turn (a burst of load on a shared machine spreads over many entries), each sample
the mean of back-to-back calls after a barrier:

- ``pingpong``: one-way seconds of a blocking ping-pong at 8 B .. 16 MiB (the table
  messages are interpolated in); ``alpha_s`` and ``beta_s_per_byte`` are its fit
  ``t = overhead + alpha + n beta`` (beta: the slope over 1-16 MiB, alpha: the rest at 8 B);
- ``exchange``: seconds of one ``Sendrecv`` of n bytes each way with both ranks sending at
  once (a step of a ring, recursive doubling or halo exchange), back to back, 8 B .. 16 MiB;
- ``stream``: seconds per message of a window of `bench.models.p2p.WINDOW` non-blocking
  messages and its acknowledgement (LogGP's gap; OSU's osu_bw pattern), 8 B .. 4 MiB;
- ``allreduce``: seconds of one ``MPI_Allreduce`` (float64 sum) of n bytes, 8 B .. 16 MiB:
  the library's own algorithm, which the model of ``MPI_Allreduce`` scales to more ranks;
- ``library``: seconds of one call of each collective suite's ``mpi`` variant (allgather,
  reduce_scatter, alltoall, bcast, reduce; `bench.library_tables`), 8 B .. 8 MiB: MPI's own
  algorithms, which the models of those variants scale to more ranks;
- ``overhead_s``: the Python path of one message, a ``Sendrecv`` to ``MPI.PROC_NULL``
  (argument handling, no transfer); ``call_s``: a hand-written allreduce of 8 B on
  ``MPI.COMM_SELF`` (the Python path of one call of `parallel.collectives`: checks, plan, copy).

The local rates of `bench.local_rates` (GEMM, the suites' kernels, ``dp``
steps, memory tables, kernel rows) are measured twice:

- on rank 0 alone (the other ranks sleep), with one BLAS thread and with one per core:
  recorded as ``[one thread, all cores]`` pairs (``cores`` says how many; the memory
  tables with one thread only). ``gamma_s_per_byte`` is the
  large-size slope of ``reduce``, ``memcpy_bytes_per_s`` the rate of its largest copy;
- under ``busy``, on every rank of rank 0's node at once, each with ``threads`` =
  cores // ``ranks`` BLAS threads (as a sweep's ranks share the node's cores and memory
  bandwidth); absent when rank 0's node holds one rank.

``quick`` (``mlscale calibrate --quick``) measures the same tables at fewer sizes, in one
round of fewer calls (`QUICK_MESSAGES`, `bench.local_rates.QUICK`): a file of the same
schema, marked ``"quick": true``, in about a tenth of the time; its figures are rough (for
tests and a first look, not for judging model errors).
"""
import json
import os
import socket
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from mpi4py import MPI

from bench.faults import AGREED, agree, agreed_error, failure_of, sleeping_barrier
from bench.library_tables import SIZES as LIBRARY_SIZES, library_callers
from bench.provenance import mpi_library
from bench.stability import table_spread
from bench.local_rates import FULL, QUICK, ROUNDS, check_suites, local_rates, measure_interleaved
from kernels.errors import InputError

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


def calibrate(comm, quick=False):
    """Measure the model constants (see the module); return them as a dict on every rank.

    ``quick``: the same tables at fewer sizes and rounds (`QUICK_MESSAGES`, `bench.local_rates.QUICK`).

    A failure on some rank (a suite's settings in the environment, say) is raised on
    every rank: an `AgreedInputError` or a `RankError` (`bench.faults`).

    Communication: one ``Split_type``; one agreement (`bench.faults.agree`) on the suites' settings; ping-pongs, exchanges, windows and ``Allreduce`` calls per
    size between rank 0 and its partner (their buffers, 2 x 32 MiB per table, all held at once); barriers between the samples of the ranks of rank 0's node;
    the other ranks wait in a sleeping barrier.
    """
    if comm.size < 2:
        raise InputError("calibrate needs 2 ranks (it measures a ping-pong); use --np 2")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    home = node.allreduce(comm.rank, op=MPI.MIN)  # a node is named by its lowest world rank
    homes = comm.allgather(home)
    away = [rank for rank, where in enumerate(homes) if where != homes[0]]
    partner = away[0] if away else 1
    messages, rates = (QUICK_MESSAGES, QUICK) if quick else (FULL_MESSAGES, FULL)
    agree(comm, check_suites, rates)  # a bad suite setting ends every rank now, not after the message tables
    pair = comm.Split(0 if comm.rank in (0, partner) else MPI.UNDEFINED, comm.rank)
    result = None
    if pair != MPI.COMM_NULL:
        result = _measure_pair(pair, messages)
        pair.Free()
    cores = os.cpu_count() or 1
    busy, failure = None, None
    if home == homes[0] and node.size > 1:  # rank 0's node: every rank at once
        threads = max(1, cores // node.size)
        try:
            busy = dict(ranks=node.size, threads=threads, **agree(node, local_rates, threads, node, rates))
        except AGREED as error:
            failure = failure_of(error, comm.rank)
    node.Free()
    if comm.rank == 0 and failure is None:
        try:  # the other ranks sleep: a failure here reaches them through the broadcast below
            alone = _alone_rates(cores, rates)
            result.update(alone, spread={**result["spread"], **alone["spread"]},
                          scope="inter-node" if away else "intra-node", quick=quick)
        except Exception as error:  # noqa: BLE001 - raised on every rank below
            failure = failure_of(error, comm.rank)
        if busy is not None:
            result["busy"] = busy
    result, failure = _sleeping_bcast(comm, (result, failure))
    if failure is not None:
        raise agreed_error(failure)
    return result


def check_output_path(path):
    """Refuse, before anything is measured, an ``--out`` that cannot be written: a folder, a file in a missing
    folder, or a folder this process may not write (`InputError`, one line)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"calibrate --out {path} is a folder; give a file name, e.g. {os.path.join(path, 'calib.json')}")
    if not os.path.isdir(folder):
        raise InputError(f"calibrate --out {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"calibrate --out {path}: cannot write in {folder}")


def write_calibration(path, constants):
    """Write ``constants`` as JSON to ``path`` whole or not at all: a temporary file in the same folder, renamed
    over ``path`` once complete (a full disk leaves an earlier calibration at ``path`` as it was)."""
    folder = os.path.dirname(os.path.abspath(path))
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=".calib-", suffix=".json", dir=folder)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(handle, "w") as stream:
            json.dump(constants, stream, indent=2)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
        raise InputError(f"cannot write {path}: {error.strerror}") from None


def _sleeping_bcast(comm, value):
    """``comm.bcast(value, root=0)`` after a barrier that sleeps, so idle ranks leave their cores alone."""
    sleeping_barrier(comm)
    return comm.bcast(value, root=0)


def _measure_pair(pair, plan):
    """The message tables (see the module) at the sizes of ``plan`` (a `MessagePlan`), each entry the median
    over its rounds, which visit every entry in turn; a sample is the mean of back-to-back calls after a
    barrier, the slower rank's (its first call also makes the pair's connection)."""
    def calls(n, fraction=1):
        return max(1, plan.calls[n >= SLOPE_FROM] // fraction)

    entries = {("pingpong", n): (_pingponger(pair, n), calls(n)) for n in plan.sizes}
    entries.update({("exchange", n): (_exchanger(pair, n), calls(n)) for n in plan.sizes})
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


def _alone_rates(cores, plan):
    """`local_rates` (at ``plan``'s sizes) on this rank alone with one thread and with ``cores``, paired
    ``[one thread, all cores]``."""
    one = local_rates(1, plan=plan)
    every = local_rates(cores, plan=plan) if cores > 1 else one
    suites = {suite: {dtype: {variant: [rate, every[suite][dtype][variant]] for variant, rate in variants.items()}
                      for dtype, variants in one[suite].items()} for suite in ("conv", "attention")}
    (n0, t0), (n1, t1) = one["reduce"][-2:]
    largest, seconds = one["copy"][-1]
    return dict(cores=cores, gemm={dtype: [rates, every["gemm"][dtype]] for dtype, rates in one["gemm"].items()},
                gemm_thin={dtype: [rates, every["gemm_thin"][dtype]] for dtype, rates in one["gemm_thin"].items()},
                thin_rows=list(plan.thin_rows), thin_side=plan.thin_side,
                **suites, dp_step={dtype: [[rows, [t, every["dp_step"][dtype][i][1]]]
                                           for i, (rows, t) in enumerate(table)]
                                   for dtype, table in one["dp_step"].items()},
                reduce=one["reduce"], copy=one["copy"], kernel_rows=[one["kernel_rows"], every["kernel_rows"]],
                gamma_s_per_byte=max((t1 - t0) / (n1 - n0), MIN_SLOPE), memcpy_bytes_per_s=largest / seconds,
                gemm_sizes=list(plan.gemm_sizes), gemm_flops_per_s=one["gemm"]["float64"][-1],
                dp_rows=list(plan.dp_rows),
                spread=dict(one_thread=one["spread"], **(dict(all_cores=every["spread"]) if cores > 1 else {})))
