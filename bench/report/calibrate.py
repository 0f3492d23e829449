"""``mlscale calibrate``: measure the constants of the cost models (`bench.report.model`).

Between rank 0 and a partner rank (a rank on another shared-memory node when
there is one, so that a calibration inside a two-node allocation measures the
network: ``scope`` ``inter-node``; else rank 1, ``intra-node``):

- ``pingpong``: one-way seconds of a blocking ping-pong at 8 B .. 16 MiB (the table
  messages are interpolated in); ``alpha_s`` and ``beta_s_per_byte`` are its fit
  ``t = overhead + alpha + n beta`` (beta: the slope over 1-16 MiB, alpha: the rest at 8 B);
- ``overhead_s``: the Python path of one message, a ``Sendrecv`` to ``MPI.PROC_NULL``
  (argument handling, no transfer).

On rank 0 alone (the partner sleeps), with one BLAS thread and with one per core:

- ``reduce``: seconds of an in-place float64 addition at 8 B .. 16 MiB (``gamma_s_per_byte``:
  its large-size slope), ``copy``: the same for a copy (``memcpy_bytes_per_s`` at 64 MB);
- ``gemm``: flop/s of square products by size and dtype (``gemm_flops_per_s``: float64 at 1024);
- ``conv``, ``attention``: flop/s of the suites' own kernels on one rank at a reference size,
  forward and forward + backward, by dtype;
- ``kernel_rows``: RBF Gram entries per second at the MNIST dimension (784), float64.

Rates are recorded as ``[one thread, all cores]`` pairs; ``cores`` says how many.
"""
import os
import socket
import time
from datetime import datetime, timezone

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from bench.provenance import mpi_library
from kernels.errors import InputError

PINGPONG_SIZES = [8 << k for k in range(22)]  # 8 B .. 16 MiB
SLOPE_FROM = 1 << 20
LOCAL_SIZES = [8 << (2 * k) for k in range(12)]  # 8 B .. 32 MiB, x4
GEMM_SIZES = (32, 64, 128, 256, 512, 1024)
DTYPES = ("float32", "float64")
#: (suite, variant, size): reference points of the suites whose kernel rate is calibrated.
SUITE_POINTS = (("conv", "forward", 256), ("conv", "forward_backward", 256), ("attention", "full", 1024))
KERNEL_DIM, KERNEL_COLUMNS, KERNEL_ROWS = 784, 2000, 64


def calibrate(comm):
    """Measure the model constants (see the module); return them as a dict on every rank.

    Communication: one ``Split_type`` and a ping-pong per size of `PINGPONG_SIZES`
    between rank 0 and its partner; the other ranks wait in a sleeping barrier.
    """
    if comm.size < 2:
        raise InputError("calibrate needs 2 ranks (it measures a ping-pong); use --np 2")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    home = node.allreduce(comm.rank, op=MPI.MIN)  # a node is named by its lowest world rank
    node.Free()
    homes = comm.allgather(home)
    away = [rank for rank, where in enumerate(homes) if where != homes[0]]
    partner = away[0] if away else 1
    pair = comm.Split(0 if comm.rank in (0, partner) else MPI.UNDEFINED, comm.rank)
    result = None
    if pair != MPI.COMM_NULL:
        result = _measure_pair(pair)
        pair.Free()
    if result is not None:
        result.update(scope="inter-node" if away else "intra-node")
    return _sleeping_bcast(comm, result)


def _sleeping_bcast(comm, value):
    """``comm.bcast(value, root=0)`` after a barrier that sleeps, so idle ranks leave their cores alone."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-3)
    return comm.bcast(value, root=0)


def _measure_pair(pair):
    times = [_one_way_seconds(pair, n, 50 if n < SLOPE_FROM else 10) for n in PINGPONG_SIZES]
    overhead = _proc_null_seconds(pair)
    result = None
    if pair.rank == 0:
        large = [(n, t) for n, t in zip(PINGPONG_SIZES, times) if n >= SLOPE_FROM]
        beta = float(np.polyfit([n for n, _ in large], [t for _, t in large], 1)[0])
        alpha = max(times[0] - overhead - PINGPONG_SIZES[0] * beta, 1e-9)  # > 0: below the clock's resolution
        result = dict(alpha_s=alpha, beta_s_per_byte=beta, overhead_s=overhead,
                      pingpong=[[n, t] for n, t in zip(PINGPONG_SIZES, times)])
        result.update(_local_rates())
        result.update(mpi_library=mpi_library(), host=socket.gethostname(),
                      timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _sleeping_bcast(pair, None)
    return result


def _one_way_seconds(comm, nbytes, iters):
    buffer = np.zeros(nbytes, np.uint8)
    partner = 1 - comm.rank
    samples = []
    for index in range(iters + 2):
        comm.Barrier()
        start = MPI.Wtime()
        if comm.rank == 0:
            comm.Send(buffer, partner)
            comm.Recv(buffer, partner)
        else:
            comm.Recv(buffer, partner)
            comm.Send(buffer, partner)
        if index >= 2:
            samples.append((MPI.Wtime() - start) / 2)
    return comm.allreduce(float(np.median(samples)), op=MPI.MAX)


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


def _seconds_per_call(function, repeats=5, least=0.02):
    """Median seconds of ``function()``, each sample looping until it lasts ``least`` seconds."""
    function()
    start = MPI.Wtime()
    function()
    once = max(MPI.Wtime() - start, 1e-7)
    loops = max(1, int(least / once))
    times = []
    for _ in range(repeats):
        start = MPI.Wtime()
        for _ in range(loops):
            function()
        times.append((MPI.Wtime() - start) / loops)
    return float(np.median(times))


def _local_rates():
    cores = os.cpu_count() or 1
    rates = dict(cores=cores, gemm={}, conv={}, attention={})
    for threads in sorted({1, cores}):
        with threadpool_limits(limits=threads):
            for dtype in DTYPES:
                rates["gemm"].setdefault(dtype, []).append(_gemm_rates(dtype))
                for suite, variant, size in SUITE_POINTS:
                    rates[suite].setdefault(dtype, {}).setdefault(variant, []).append(
                        _suite_rate(suite, variant, size, dtype))
            if threads == 1:
                rates.update(_memory_tables())
                rates["kernel_rows"] = _kernel_entries_per_s()
    if cores == 1:  # one thread is all cores
        for table in (rates["gemm"], *(v for s in ("conv", "attention") for v in rates[s].values())):
            for values in table.values():
                values.append(values[0])
    rates["gemm_sizes"] = list(GEMM_SIZES)
    rates["gemm_flops_per_s"] = rates["gemm"]["float64"][0][-1]
    return rates


def _gemm_rates(dtype):
    rng = np.random.default_rng(0)
    rates = []
    for n in GEMM_SIZES:
        a = rng.random((n, n)).astype(dtype)
        rates.append(2 * n**3 / _seconds_per_call(lambda: a @ a))
    return rates


def _memory_tables():
    reduce_table, copy_table = [], []
    warm, zero = np.ones(1), np.zeros(1)
    _seconds_per_call(lambda: np.add(warm, zero, out=warm))  # the first timed calls run slower: not in the table
    for nbytes in LOCAL_SIZES:
        vector, other = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))
        reduce_table.append([nbytes, _seconds_per_call(lambda: np.add(vector, other, out=vector))])
        copy_table.append([nbytes, _seconds_per_call(lambda: np.copyto(other, vector))])
    (n0, t0), (n1, t1) = reduce_table[-2:]
    source = np.ones(8 << 20)
    target = np.empty_like(source)
    memcpy = source.nbytes / _seconds_per_call(lambda: np.copyto(target, source), 3)
    return dict(reduce=reduce_table, copy=copy_table, gamma_s_per_byte=(t1 - t0) / (n1 - n0),
                memcpy_bytes_per_s=memcpy)


def _suite_rate(suite, variant, size, dtype):
    """Flop/s of ``suite``'s ``variant`` at ``size`` on one rank (its settings as the environment gives them)."""
    from bench.registry import get_case
    from kernels.backend import get_backend

    case, comm = get_case(suite), MPI.COMM_SELF
    state = case.setup(comm, size, variant, get_backend("numpy", comm), dtype)
    try:
        seconds = _seconds_per_call(lambda: case.run(state), repeats=3, least=0.05)
        return case.metrics(state, seconds).gflops * 1e9
    finally:
        case.teardown(state)


def _kernel_entries_per_s():
    from svm.solver.gram import make_kernel, squared_norms

    rng = np.random.default_rng(0)
    X = rng.random((KERNEL_COLUMNS, KERNEL_DIM))
    kernel = make_kernel("rbf", X)
    norms = squared_norms(X)
    rows = X[:KERNEL_ROWS]
    return KERNEL_ROWS * KERNEL_COLUMNS / _seconds_per_call(lambda: kernel.block(rows, X, norms))
