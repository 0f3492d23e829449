"""What the suites of MPI's other collectives share: ``allgather``, ``reduce_scatter``, ``alltoall``,
``bcast`` and ``reduce``, each MPI's call against the hand-written algorithms of parallel.collectives.

As in nccl-tests, ``size`` is the bytes of the whole buffer: the gathered vector (allgather), the vector
reduced (reduce_scatter, reduce), the vector sent by each rank (alltoall), the vector broadcast (bcast).
Counts need not divide: the blocks follow `kernels.distribution.block_range`, and MPI's variant then
takes its ``v`` form (``Allgatherv``, ``Reduce_scatter`` with counts, ``Alltoallv``).

Settings (`bench.models.collective`): ``COLL_IN_PLACE`` (0: out of place, 1: in place, MPI_IN_PLACE),
``COLL_OP`` (``sum`` or ``max``, for the suites that reduce) and ``COLL_ROOT`` (bcast, reduce); each
point records them in ``params``.

Inputs are small integers drawn from a per-rank seed, so any order of reduction gives the exact
result, and each rank checks what it holds against NumPy's result regenerated from the seeds
(``wrong``: the elements that differ; a root's partners hold nothing to check). The same buffers
serve every run of a point (the hand-written algorithms run them on persistent requests from the
second run). In place, the timed runs reduce what the previous run left, as nccl-tests' do; the check
writes the input back and runs once more before it compares. Device buffers reach MPI and the hand-written algorithms
through `kernels.backend.Backend.staged` (host staging, or device arrays given to a CUDA-aware MPI);
``nccl`` (device only) is NCCL's own collective (`parallel.collectives.nccl`); a suite's ``wire_variants``
(allreduce: ``ring+nccl``...) run the hand-written algorithm with its messages over NCCL's send / recv
(`parallel.collectives.nccl_wire`), device buffers given straight to it.

Metrics: algbw = size / time and busbw = algbw times nccl-tests' factor of the collective
(`kernels.comm.traffic.BUS_FACTORS`).
"""
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from bench.case import Case, bandwidth_metrics
from kernels.distribution import block_offsets, block_range
from kernels.errors import InputError
from parallel.collectives import release_plans
from parallel.collectives.nccl import NcclCollective, unavailable_reason
from parallel.collectives.nccl_wire import nccl_wire, split_wire

SEED = 2026
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX}
NUMPY_OPS = {"sum": np.add, "max": np.maximum}


def rank_input(rank, count, dtype):
    """The input vector of ``rank``: integers in [0, 8) drawn from a per-rank seed."""
    return np.random.default_rng([SEED, rank]).integers(0, 8, count).astype(dtype)


def counts_and_offsets(n, p):
    """The ``block_range`` counts and offsets of ``n`` items over ``p`` ranks, as MPI's ``v`` calls take them."""
    offsets = block_offsets(n, p)
    return [stop - start for start, stop in zip(offsets, offsets[1:] + [n])], offsets


def reduced(count, ranks, dtype, op):
    """The reduction by ``op`` of every rank's `rank_input` of ``count`` items (one input held at a time)."""
    result = rank_input(0, count, dtype)
    for rank in range(1, ranks):
        NUMPY_OPS[op](result, rank_input(rank, count, dtype), out=result)
    return result


@dataclass
class CollectiveState:
    comm: object
    backend: object
    dtype: str
    variant: str
    count: int
    send: object  # the input (in place: kept to rewrite recv before each run)
    recv: object
    in_place: bool
    op: str
    root: int
    call: object = None  # call(send, recv) for MPI and the hand-written algorithms
    nccl: object = None
    wire: object = None  # the NcclWire a hand-written algorithm's messages take (``ring+nccl``...)


class CollectiveCase(Case):
    """A suite of one collective; subclasses set ``collective`` (a key of `BUS_FACTORS`) and the hooks.

    Hooks, all on host arrays of ``count`` items of the whole buffer: `send_input` (this rank's
    send buffer, out of place), `in_place_input` (what recvbuf holds before an in-place run),
    `receive_count`, `expected` (recvbuf after the run, or None: nothing to check here),
    `mpi` (MPI's call) and `hand_written` (the call of algorithm ``function``).
    """

    collective = ""
    algorithms = {}
    #: Whether NCCL's form of the collective needs equal blocks (allgather, reduce_scatter, alltoall).
    equal_blocks = False
    size_help = "bytes of the whole buffer, as nccl-tests counts it (any count: uneven blocks)"
    default_sizes = "8:16M"
    metrics_help = "algbw = size / time; busbw = algbw x nccl-tests' factor of the collective, GB/s"

    def iterations(self, size):
        return (50, 5) if size <= (1 << 20) else (20, 3)

    def send_input(self, comm, count, dtype):
        return rank_input(comm.rank, count, dtype)

    def in_place_input(self, comm, count, dtype):
        return self.send_input(comm, count, dtype)

    def receive_count(self, comm, count):
        return count

    def check_point(self, comm, count, variant, in_place):
        """Raise `InputError` for a point this suite cannot run (NCCL's blocks are equal)."""
        if variant == "nccl" and self.equal_blocks and count % comm.size:
            raise InputError(f"nccl {self.name} needs a count divisible by the ranks: {count} items over "
                             f"{comm.size} ranks (NCCL's blocks are equal)")

    def received(self, state, host_recv):
        """The part of this rank's ``recv`` (on the host) that `expected` describes: all of it by default."""
        return host_recv

    def expected(self, comm, count, dtype, in_place, op, root):
        raise NotImplementedError

    def mpi(self, comm, send, recv, op, root):
        raise NotImplementedError

    def hand_written(self, function, comm, send, recv, op, root):
        raise NotImplementedError

    def nccl_call(self, nccl, send, recv, op, root):
        """NCCL's collective on device arrays (see `parallel.collectives.nccl.NcclCollective`)."""
        raise NotImplementedError

    def setup(self, comm, size, variant, backend, dtype):
        itemsize = np.dtype(dtype).itemsize
        if size % itemsize:
            raise InputError(f"{self.name} size {size} is not a whole number of {dtype} elements")
        count, config = size // itemsize, self.model.config
        root, in_place = config.get("root", 0), config["in_place"]  # the model checked the root (check_ranks)
        self.check_point(comm, count, variant, in_place)
        source = self.in_place_input(comm, count, dtype) if in_place else self.send_input(comm, count, dtype)
        send = backend.from_host(source)
        if in_place:
            recv = backend.from_host(source.copy())
        else:
            recv = backend.xp.zeros(self.receive_count(comm, count), dtype)
        state = CollectiveState(comm, backend, dtype, variant, count, send, recv, in_place, config.get("op", "sum"),
                                root)
        if variant == "nccl":
            state.nccl = NcclCollective(comm, backend.xp)
        elif variant == "mpi":
            state.call = lambda s, r: self.mpi(comm, s, r, state.op, root)
        else:
            algorithm, over_nccl = split_wire(variant)
            function, state.wire = self.algorithms[algorithm], nccl_wire(comm, backend, variant) if over_nccl else None
            target = state.wire or comm
            state.call = lambda s, r: self.hand_written(function, target, s, r, state.op, root)
        return state

    def unavailable(self, comm, variant, backend):
        """As `Case.unavailable`; ``nccl`` on a device also needs NCCL in CuPy and one GPU per rank."""
        reason = super().unavailable(comm, variant, backend)
        if reason is None and (variant == "nccl" or split_wire(variant)[1]):
            return unavailable_reason(comm, backend.xp)
        return reason

    def run(self, state):
        if state.nccl is not None:  # device buffers straight to NCCL, never staged
            self.nccl_call(state.nccl, MPI.IN_PLACE if state.in_place else state.send, state.recv, state.op,
                           state.root)
        elif state.wire is not None:  # device buffers straight to the algorithm, its messages over NCCL
            state.call(MPI.IN_PLACE if state.in_place else state.send, state.recv)
        elif state.in_place:
            state.backend.staged(lambda recv: state.call(MPI.IN_PLACE, recv), state.recv)
        else:
            state.backend.staged(state.call, state.send, state.recv, outputs=(1,))

    def check(self, state):
        if state.in_place:  # the timed runs consumed the input: one more run from it
            state.recv[...] = state.send
            self.run(state)
        expected = self.expected(state.comm, state.count, state.dtype, state.in_place, state.op, state.root)
        if expected is None:
            return 0
        return int(np.count_nonzero(self.received(state, state.backend.to_host(state.recv)) != expected))

    def metrics(self, state, seconds):
        return bandwidth_metrics(self.collective, state.count * np.dtype(state.dtype).itemsize, state.comm.size,
                                 seconds)

    def params(self, state):
        return {key: getattr(state, key) for key in ("in_place", "op", "root") if key in self.model.config}

    def teardown(self, state):
        """Free the plans (persistent requests) kept for this point's buffers, and the NCCL communicator."""
        release_plans(state.comm)
        for nccl in (state.nccl, state.wire):
            if nccl is not None:
                nccl.close()


def own_block(comm, count):
    """This rank's ``block_range`` of ``count`` items, as a slice."""
    return slice(*block_range(count, comm.size, comm.rank))
