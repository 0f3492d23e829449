"""Alpha-beta-gamma performance models: calibration and prediction.

``mlscale calibrate`` measures on two ranks of this machine:

- alpha: one-way latency of an 8-byte ping-pong (seconds per message);
- beta: seconds per byte, the slope of one-way ping-pong time over 1-16 MiB (large
  messages stream through memory rather than cache, as in large collectives);
- gamma: seconds per byte of an in-place float64 vector addition (the reduction);
- memcpy: bytes per second of a 64 MB copy (a reference for bandwidth figures);
- gemm: floating-point operations per second of one thread multiplying 1024 x 1024
  matrices (float64).

Cases declare their cost in these terms (`bench.case.Case.predict`); ``mlscale
report --model calib.json`` puts the prediction beside each measurement and
``--project 64,256,1024`` extrapolates to rank counts this machine cannot run.
"""
import json
import math
import socket
from datetime import datetime, timezone

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from bench.provenance import mpi_library
from kernels.errors import InputError

PINGPONG_SIZES = [8 << k for k in range(22)]  # 8 B .. 16 MiB
SLOPE_FROM = 1 << 20
KEYS = ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "memcpy_bytes_per_s", "gemm_flops_per_s")


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


def _seconds_per_call(function, repeats):
    function()
    times = []
    for _ in range(repeats):
        start = MPI.Wtime()
        function()
        times.append(MPI.Wtime() - start)
    return float(np.median(times))


def calibrate(comm):
    """Measure the model constants on ranks 0 and 1 of ``comm``; return them as a dict on every rank.

    Communication: one ping-pong per size of `PINGPONG_SIZES` between ranks 0
    and 1 (other ranks wait); local rates are measured on rank 0 with one BLAS thread.
    """
    if comm.size < 2:
        raise InputError("calibrate needs 2 ranks (it measures a ping-pong); use --np 2")
    pair = comm.Split(0 if comm.rank < 2 else MPI.UNDEFINED, comm.rank)
    result = None
    if pair != MPI.COMM_NULL:
        times = [_one_way_seconds(pair, n, 50 if n < SLOPE_FROM else 10) for n in PINGPONG_SIZES]
        if pair.rank == 0:
            large = [(n, t) for n, t in zip(PINGPONG_SIZES, times) if n >= SLOPE_FROM]
            beta = float(np.polyfit([n for n, _ in large], [t for _, t in large], 1)[0])
            with threadpool_limits(limits=1):
                result = dict(alpha_s=times[0], beta_s_per_byte=beta, **_local_rates())
            result.update(mpi_library=mpi_library(),
                          host=socket.gethostname(),
                          timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        pair.Free()
    return comm.bcast(result, root=0)


def _local_rates():
    vector = np.ones(1 << 21)  # 16 MiB of float64: memory-bound, as in large allreduces
    other = np.ones_like(vector)
    gamma = _seconds_per_call(lambda: np.add(vector, other, out=vector), 20) / vector.nbytes
    source = np.ones(8 << 20)
    target = np.empty_like(source)
    memcpy = source.nbytes / _seconds_per_call(lambda: np.copyto(target, source), 10)
    a = np.random.default_rng(0).random((1024, 1024))
    gemm = 2 * 1024**3 / _seconds_per_call(lambda: a @ a, 5)
    return dict(gamma_s_per_byte=gamma, memcpy_bytes_per_s=memcpy, gemm_flops_per_s=gemm)


def load_calibration(path):
    """Read a calibration JSON written by `calibrate`.

    Raises `InputError` naming ``path`` when it cannot be read or parsed, is not a
    JSON object, lacks one of `KEYS`, or holds a constant that is not a finite
    number > 0.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            calib = json.load(handle)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read calibration {path}: {error}") from None
    if not isinstance(calib, dict):
        raise InputError(f"{path} is not an mlscale calibration (a JSON object); run mlscale calibrate")
    missing = [key for key in KEYS if key not in calib]
    if missing:
        raise InputError(f"{path} is not an mlscale calibration (missing {missing[0]!r}); run mlscale calibrate")
    for key in KEYS:
        value = calib[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError(f"{path}: {key} must be a number > 0, got {json.dumps(value)}; run mlscale calibrate")
    return calib


def log2_ceil(p):
    """Rounds of a binomial tree over ``p`` ranks."""
    return max(0, (p - 1).bit_length())
