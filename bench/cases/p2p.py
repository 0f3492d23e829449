"""Suite ``p2p``: point-to-point latency (ping-pong) and bandwidth (a window of messages).

Ranks form pairs (r, r + p/2), as in OSU's multi-pair tests; on 2 ranks this is
osu_latency / osu_bw. Payloads are bytes filled with a known pattern, checked on
arrival: both ranks of a pair send from their own pattern buffer and receive into
another (the echo of a ping-pong comes from the receiver's send buffer, as in OSU).

The exchange is bound once in `setup`: host arrays go to ``Send`` / ``Recv`` as
``[array, MPI.BYTE]`` (no datatype lookup per call, as OSU's ``[buf, n, MPI.BYTE]``),
so one timed run costs the messages and two Python calls; device arrays go through
`kernels.backend.Backend.staged` (host staging or a CUDA-aware MPI).
"""
import functools
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from bench.case import Case, bandwidth_metrics
from bench.models.p2p import WINDOW, PointToPointModel
from kernels.errors import InputError

ACK_TAG, DATA_TAG = 1, 2


@dataclass
class _State:
    comm: object
    backend: object
    variant: str
    size: int
    partner: int
    sender: bool
    send: np.ndarray
    recv: np.ndarray
    exchange: object  # run() calls it: one ping-pong or one window, bound in setup


class PointToPoint(Case):
    model_class = PointToPointModel
    benchmark = "p2p"
    size_help = "message size in bytes"
    default_sizes = "8:1M"
    metrics_help = "latency: one-way latency in us (metric latency_us); bandwidth: algbw = busbw in GB/s"
    description = ("Point-to-point latency (ping-pong) and bandwidth (a window of 64 messages in flight) between "
                   "rank pairs (r, r + p/2), as OSU's multi-pair tests do; on 2 ranks this is osu_latency and "
                   "osu_bw. Payloads carry a known byte pattern that the receiver checks.")
    dtypes = ("uint8",)

    def check_ranks(self, ranks, variant):
        if ranks < 2 or ranks % 2:
            raise InputError(f"p2p pairs ranks, so it needs an even rank count >= 2, not {ranks}")

    def iterations(self, size):
        return (100, 10) if size <= 65536 else (20, 3)

    def setup(self, comm, size, variant, backend, dtype):
        half = comm.size // 2
        sender = comm.rank < half
        partner = comm.rank + half if sender else comm.rank - half
        send = backend.from_host(_pattern(size))
        recv = backend.xp.zeros(size, np.uint8)
        exchange = (_ping_pong if variant == "latency" else _window)(comm, partner, sender)
        if isinstance(send, np.ndarray):
            bound = functools.partial(exchange, [send, MPI.BYTE], [recv, MPI.BYTE])
        else:
            bound = functools.partial(backend.staged, exchange, send, recv, outputs=(1,))
        return _State(comm, backend, variant, size, partner, sender, send, recv, bound)

    def run(self, state):
        state.exchange()

    def check(self, state):
        if state.variant == "bandwidth" and state.sender:
            return 0
        return int(np.count_nonzero(state.backend.to_host(state.recv) != _pattern(state.size)))

    def metrics(self, state, seconds):
        if state.variant == "latency":
            return bandwidth_metrics("sendrecv", 2 * state.size, 2, seconds,
                                     metric="latency_us", metric_value=seconds / 2 * 1e6)
        return bandwidth_metrics("sendrecv", WINDOW * state.size, 2, seconds)

    def params(self, state):
        return {"pairs": state.comm.size // 2, "window": WINDOW if state.variant == "bandwidth" else 1}


def _pattern(size):
    """The payload: ``size`` bytes ``(i + 7) % 251``."""
    return ((np.arange(size) + 7) % 251).astype(np.uint8)


def _ping_pong(comm, partner, sender):
    """One round trip ``exchange(send, recv)``: the sender sends first, the receiver echoes
    from its own send buffer (OSU's osu_latency)."""
    send_to, receive_from = comm.Send, comm.Recv
    if sender:
        def exchange(send, recv):
            send_to(send, partner, DATA_TAG)
            receive_from(recv, partner, DATA_TAG)
    else:
        def exchange(send, recv):
            receive_from(recv, partner, DATA_TAG)
            send_to(send, partner, DATA_TAG)
    return exchange


def _window(comm, partner, sender):
    """One window ``exchange(send, recv)``: `WINDOW` messages in flight, then a 1-byte
    acknowledgement (a host buffer: it carries no data), as OSU's osu_bw."""
    ack = [np.zeros(1, np.uint8), MPI.BYTE]
    if sender:
        def exchange(send, recv):
            MPI.Request.Waitall([comm.Isend(send, partner, DATA_TAG) for _ in range(WINDOW)])
            comm.Recv(ack, partner, ACK_TAG)
    else:
        def exchange(send, recv):
            MPI.Request.Waitall([comm.Irecv(recv, partner, DATA_TAG) for _ in range(WINDOW)])
            comm.Send(ack, partner, ACK_TAG)
    return exchange
