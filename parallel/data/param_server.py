"""Parameter server: sharded servers; synchronous, asynchronous and bounded-staleness (SSP) training.

Ranks ``0 .. servers - 1`` of ``comm`` are servers, the others workers. The flat
parameter vector (length n) is sharded by key range: server k owns elements
``block_range(n, servers, k)``, keeps them and applies SGD to them. One step of a
worker at clock c is::

    pull     (PULL, c) to every server; receive (version v_k, parameter shard k) from each
    compute  the gradient of its batch at clock c into the flat gradient vector
    push     (PUSH, v_k) and gradient shard k to every server k

A `ParameterServer.train` call ends with (DONE, c) from every worker to every
server; a server returns once every worker has said DONE for this call, so nothing
is left pending and repeated calls compose (clocks, versions and optimiser state
carry over). Servers receive requests with ``MPI.ANY_SOURCE`` and learn the sender
from the ``Status``.

Clocks and staleness. A worker's clock c counts the steps it has pushed. A server's
clock is the number of clocks every worker has completed on it: the minimum over
workers of the gradients received from them. A pull at clock c is answered, with
version v = the server clock, once ``c - v <= bound``: bound 0 in ``sync`` mode, s
in ``ssp`` (a worker runs ahead of the slowest by at most s clocks, else its pull
waits), none in ``async``. The staleness of a gradient is ``c - v``, the clocks
of other workers' updates the parameters it was computed on may lack: always 0 in
sync mode, at most s in ssp, unbounded in async. Servers record it for every
applied gradient shard.

Updates. ``sync``: a server sums the gradients of clock t from all workers (in
arrival order), applies one SGD step, then answers the pulls of clock t + 1; with
gradients scaled by the global batch size (``softmax_cross_entropy(...,
batch_size=B)``) this is serial SGD on the global batch. ``async`` and ``ssp``: a
server applies each gradient with one SGD step as it arrives.

Device arrays (CuPy): with parameter and gradient vectors in device memory and
``backend.comm(comm)``, the servers' shards, gradient sums and optimiser state
stay on the device; headers, versions and staleness counts are small host
arrays. A staging communicator copies a shard reply into host memory when the
``Isend`` is posted, so the server may update its shard before the reply is sent.

Cost per worker step, S servers, n parameters of w bytes: 3S messages sent (two
16-byte headers and n/S gradient elements per server) and 2S received (8-byte
version and n/S parameters), about ``5 S alpha + 2 n w beta``. A server handles
W workers per clock: about ``5 W alpha + 2 W (n / S) w beta``, the bottleneck when
W > S.
"""
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm.device import wait_all
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.optim import SGD

MODES = ("sync", "async", "ssp")
PULL, PUSH, DONE = 0, 1, 2
REQUEST_TAG, GRADIENT_TAG, VERSION_TAG, SHARD_TAG = 101, 102, 103, 104


def check_roles(ranks, servers):
    """Raise `InputError` unless ``ranks`` split into ``servers`` >= 1 servers and >= 1 worker."""
    if ranks < 2:
        raise InputError(f"a parameter server needs >= 2 ranks (>= 1 server and >= 1 worker), got {ranks}")
    if not 1 <= servers < ranks:
        raise InputError(f"the number of servers must be in [1, {ranks - 1}] on {ranks} ranks, got {servers}")


def staleness_bound(mode, staleness):
    """Return the bound on ``c - v`` of ``mode``: 0 (sync), ``staleness`` (ssp) or None (async)."""
    if mode not in MODES:
        raise InputError(f"unknown parameter-server mode {mode!r}; choose from {', '.join(MODES)}")
    if int(staleness) != staleness or staleness < 0:
        raise InputError(f"the staleness bound must be an integer >= 0, got {staleness}")
    return {"sync": 0, "ssp": int(staleness), "async": None}[mode]


@dataclass
class Statistics:
    """Summary over all ranks of the gradients applied so far (see `ParameterServer.statistics`).

    Attributes
    ----------
    gradient_shards : int
        Gradient shards applied, summed over servers (worker steps times servers).
    max_staleness, mean_staleness : int, float
        Largest and mean recorded staleness ``c - v`` (0 when none was recorded).
    comm_share : float
        Share of the workers' time spent waiting in pulls and pushes rather than computing.
    """

    gradient_shards: int
    max_staleness: int
    mean_staleness: float
    comm_share: float


class ParameterServer:
    """One rank's role in a sharded parameter server (servers first, then workers).

    Parameters
    ----------
    comm : MPI.Comm
        All servers and workers; at least 2 ranks.
    flat_params, flat_grads : ndarray, shape (n,)
        The same initial parameters on every rank, and the gradient vector the
        workers' ``compute_gradient`` fills (e.g. from `parallel.nn.models.flat_storage`).
        Workers receive pulled parameters into ``flat_params``; servers copy their shard.
    lr, momentum, weight_decay : float
        SGD settings the servers apply (`parallel.nn.optim.SGD`).
    mode : {"sync", "async", "ssp"}
    servers : int
        Server ranks, in ``[1, comm.size - 1]``.
    staleness : int
        Bound s of ``ssp`` mode (ignored by the other modes).

    Attributes
    ----------
    is_server : bool
    workers : int
        Number of workers W; ``worker_index`` is this worker's index (rank - servers).
    bound : int or None
        The staleness bound in force (see `staleness_bound`).
    shard : ndarray, shape (stop - start,)
        The server's parameters (servers only).
    staleness_counts : ndarray of int64
        Server: how many gradient shards were applied with each staleness 0, 1, 2...
    """

    def __init__(self, comm, flat_params, flat_grads, lr, mode="sync", servers=1, staleness=2,
                 momentum=0.0, weight_decay=0.0):
        check_roles(comm.size, servers)
        self.bound = staleness_bound(mode, staleness)
        if flat_params.ndim != 1 or flat_grads.shape != flat_params.shape or flat_grads.dtype != flat_params.dtype:
            raise InputError(f"need 1-D parameter and gradient vectors of one shape and dtype, got "
                             f"{flat_params.shape} {flat_params.dtype} and {flat_grads.shape} {flat_grads.dtype}")
        self.comm, self.mode, self.servers = comm, mode, servers
        self.workers = comm.size - servers
        self.is_server = comm.rank < servers
        self.worker_index = None if self.is_server else comm.rank - servers
        self.flat_params, self.flat_grads = flat_params, flat_grads
        self.ranges = [block_range(flat_params.size, servers, k) for k in range(servers)]
        self.staleness_counts = np.zeros(0, np.int64)
        self.wait_seconds = self.compute_seconds = 0.0
        self._calls = 0
        pairs = []
        if self.is_server:
            start, stop = self.ranges[comm.rank]
            xp = array_module(flat_params)
            self.shard = flat_params[start:stop].copy()
            self._gradient = xp.zeros_like(self.shard)
            self._incoming = xp.zeros_like(self.shard) if mode == "sync" else self._gradient
            pairs = [(self.shard, self._gradient)]
            self._pushes = np.zeros(self.workers, np.int64)
            self._dones = np.zeros(self.workers, np.int64)
            self._header = np.zeros(2, np.int64)
            self._waiting, self._replies, self._reply_versions = [], [], []
        else:
            self.clock = 0
            self._versions = np.zeros(servers, np.int64)
            self._headers = np.zeros((3, servers, 2), np.int64)
            self._pending = []
        self._optimizer = SGD(pairs, lr, momentum, weight_decay)  # on every rank: bad settings fail everywhere

    # ------------------------------------------------------------------ both roles
    def train(self, steps, compute_gradient=None):
        """Run ``steps`` steps on every worker while the servers serve; every rank calls this.

        ``compute_gradient(clock)`` (workers only) must fill ``flat_grads`` with the
        gradient at the parameters just pulled into ``flat_params``, for the worker's
        batch of step ``clock`` (0, 1, 2... over all calls). Every rank must pass the
        same ``steps``.
        """
        if int(steps) != steps or steps < 0:
            raise InputError(f"steps must be an integer >= 0, got {steps}")
        self._calls += 1
        if self.is_server:
            self._serve()
            return
        for _ in range(int(steps)):
            self._step(compute_gradient)
        requests = self._pending + self._send_headers(DONE, self.clock)
        self._pending = []
        start = MPI.Wtime()
        wait_all(requests)
        self.wait_seconds += MPI.Wtime() - start

    def gather_parameters(self):
        """Return the servers' current parameters, the whole vector, on every rank (one ``Allgatherv``)."""
        n = self.flat_params.size
        counts = [stop - start for start, stop in self.ranges] + [0] * self.workers
        offsets = [start for start, _ in self.ranges] + [n] * self.workers
        whole = array_module(self.flat_params).empty(n, self.flat_params.dtype)
        send = self.shard if self.is_server else self.flat_params[:0]
        self.comm.Allgatherv(send, [whole, (counts, offsets)])
        return whole

    def statistics(self):
        """Return the `Statistics` of all gradients applied so far; every rank calls this (3 allreduces)."""
        length = self.comm.allreduce(len(self.staleness_counts), op=MPI.MAX)
        counts = np.zeros(length, np.int64)
        counts[:len(self.staleness_counts)] = self.staleness_counts
        self.comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        times = np.array([self.wait_seconds, self.compute_seconds])
        self.comm.Allreduce(MPI.IN_PLACE, times, op=MPI.SUM)
        total = int(counts.sum())
        nonzero = np.flatnonzero(counts)
        return Statistics(
            gradient_shards=total,
            max_staleness=int(nonzero[-1]) if len(nonzero) else 0,
            mean_staleness=float(counts @ np.arange(length)) / total if total else 0.0,
            comm_share=float(times[0] / times.sum()) if times.sum() > 0 else 0.0,
        )

    # ------------------------------------------------------------------ workers
    def _send_headers(self, kind, values):
        """Post (kind, value) to every server; ``values`` is one int or one per server."""
        headers = self._headers[kind]
        headers[:, 0], headers[:, 1] = kind, values
        return [self.comm.Isend(headers[server], server, REQUEST_TAG) for server in range(self.servers)]

    def _step(self, compute_gradient):
        start = MPI.Wtime()
        requests = self._pending
        for server, (low, high) in enumerate(self.ranges):
            requests.append(self.comm.Irecv(self._versions[server:server + 1], server, VERSION_TAG))
            requests.append(self.comm.Irecv(self.flat_params[low:high], server, SHARD_TAG))
        requests += self._send_headers(PULL, self.clock)
        wait_all(requests)
        pulled = MPI.Wtime()
        compute_gradient(self.clock)
        self.compute_seconds += MPI.Wtime() - pulled
        self.wait_seconds += pulled - start
        self._pending = self._send_headers(PUSH, self._versions) + [
            self.comm.Isend(self.flat_grads[low:high], server, GRADIENT_TAG)
            for server, (low, high) in enumerate(self.ranges)]
        self.clock += 1

    # ------------------------------------------------------------------ servers
    @property
    def server_clock(self):
        """Clocks every worker has completed on this server (servers only)."""
        return int(self._pushes.min())

    def _serve(self):
        status = MPI.Status()
        while self._dones.min() < self._calls:
            self.comm.Recv(self._header, MPI.ANY_SOURCE, REQUEST_TAG, status)
            source = status.Get_source()
            kind, value = int(self._header[0]), int(self._header[1])
            if kind == PULL:
                self._waiting.append((source, value))
            elif kind == PUSH:
                self._receive_gradient(source, value)
            else:
                self._dones[source - self.servers] += 1
            self._answer_pulls()
        self._finish_replies()

    def _answer_pulls(self):
        """Send the shard to every waiting worker whose clock is within the bound."""
        clock = self.server_clock
        still_waiting = []
        for source, worker_clock in self._waiting:
            if self.bound is not None and worker_clock - clock > self.bound:
                still_waiting.append((source, worker_clock))
                continue
            version = np.array([clock], np.int64)
            self._reply_versions.append(version)
            self._replies += [self.comm.Isend(version, source, VERSION_TAG),
                              self.comm.Isend(self.shard, source, SHARD_TAG)]
        self._waiting = still_waiting

    def _finish_replies(self):
        """Wait for the shard replies in flight (before the shard changes)."""
        wait_all(self._replies)
        self._replies, self._reply_versions = [], []

    def _receive_gradient(self, source, version):
        worker = source - self.servers
        self.comm.Recv(self._incoming, source, GRADIENT_TAG)
        self._record(int(self._pushes[worker]) - version)
        self._pushes[worker] += 1
        if self.mode == "sync":
            self._gradient += self._incoming
            if self._pushes.min() < self._pushes.max():
                return
        self._finish_replies()
        self._optimizer.step()
        if self.mode == "sync":
            self._gradient[:] = 0

    def _record(self, staleness):
        if staleness >= len(self.staleness_counts):
            grown = np.zeros(staleness + 1, np.int64)
            grown[:len(self.staleness_counts)] = self.staleness_counts
            self.staleness_counts = grown
        self.staleness_counts[staleness] += 1
