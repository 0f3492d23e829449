"""Expert-parallel mixture of experts: experts spread over the ranks, ``Alltoallv`` dispatch and combine.

The layer, gate, capacity and auxiliary loss are those of `parallel.expert.layer`
and `parallel.expert.routing`; `parallel.expert.layer.SerialMoE` is the reference.
With ``p`` ranks (``E`` divisible by ``p``, else `InputError`) rank ``r`` owns
experts ``r E/p .. (r+1) E/p - 1``.

Parallel pass (`ParallelMoE`, tokens sharded: each rank routes its own ``n_r``
tokens). Forward: one ``Alltoall`` of the row counts per (destination, expert),
one ``Alltoallv`` of the kept rows to the experts' owners (exact counts, no
padding to capacity), the experts, one ``Alltoallv`` of their outputs back, the
combine, and one ``Allreduce`` of ``3E + 2`` float64 statistics (aux loss, loads,
drops). Backward: the same two ``Alltoallv`` (output gradients out, input
gradients back) and one ``Allreduce`` of the gate gradients (``(hidden + 1) E``
numbers). With ``R_out`` rows this rank sends to other ranks' experts (at most
``k n_r``) and ``R_in`` rows it takes from other ranks, ``w`` bytes per number,
each pass costs ``~2 (p-1) alpha + (R_out + R_in) hidden w beta`` in the
all-to-alls (plus ``(p-1) alpha`` for the counts, forward) and one small
allreduce. ``bytes_sent`` counts the all-to-all rows and counts exactly and the
allreduces as a ring would send them (`kernels.comm.traffic`, through a `kernels.comm.counting.CountingComm`).
Memory per rank: the ``(k n_r, hidden)`` output and gradient buffers of the
combine, the received rows and the experts' activations (``R_in + kept own rows``
by ``ffn``).

All-to-alls (``alltoall``): ``"mpi"`` (``MPI_Alltoall`` / ``MPI_Alltoallv``) or a hand-written
algorithm of `parallel.collectives.alltoall.ALLTOALLV_ALGORITHMS` (``pairwise``,
``scattered``, ``auto``), which then runs the counts' exchange (even blocks) and both
row exchanges (the v-variant, counts that change with the routing); counted as MPI's
calls. Bruck's algorithm cannot take the routing's counts (its packing needs every pair's
count on every rank): an `InputError`.

Devices: with the layer moved to the device (``layer.to(backend)``) and
``backend.comm(comm)``, the rows travel from device buffers (staged through host
memory without a CUDA-aware MPI); the counts are host arrays.
"""
import functools

import numpy as np

from kernels.backend import array_module
from kernels.comm.counting import CountedCommunication, CountingComm
from kernels.errors import InputError
from parallel.collectives.alltoall import ALLTOALLV_ALGORITHMS
from parallel.expert.layer import MoELayer, SerialMoE

#: The ``alltoall`` choices of `ParallelMoE`.
MOE_ALLTOALLS = ("mpi",) + tuple(ALLTOALLV_ALGORITHMS)


class ParallelMoE(CountedCommunication, MoELayer):
    """Expert-parallel MoE: rank ``r`` owns experts ``r E/p .. (r+1) E/p - 1`` and routes its own tokens.

    Parameters as in `SerialMoE`, plus ``comm`` (the expert-parallel group; ``E``
    divisible by ``comm.size``) and ``alltoall`` (`MOE_ALLTOALLS`). ``forward(x_local)``: this rank's tokens (n_r,
    hidden), any ``n_r >= 0``; returns their ``y``. ``backward(dy_local)`` returns
    their ``dx``. ``params`` / ``grads`` hold the replicated gate (its gradient
    summed over the ranks) and the owned experts, named as in the serial layer.
    After forward: ``aux_loss``, ``dropped``, ``expert_load``, ``tokens`` (global).
    """

    def __init__(self, comm, hidden, ffn, experts, top_k=1, capacity_factor=1.0, seed=0, dtype=np.float32,
                 aux_loss_weight=0.0, alltoall="mpi"):
        if alltoall not in MOE_ALLTOALLS:
            raise InputError(f"ParallelMoE: alltoall {alltoall!r} cannot take the routing's counts; choose from "
                             f"{', '.join(MOE_ALLTOALLS)}")
        if experts % comm.size:
            raise InputError(f"ParallelMoE: {experts} experts cannot be spread evenly over {comm.size} ranks")
        self.local_experts = experts // comm.size
        first = comm.rank * self.local_experts
        super().__init__(hidden, ffn, experts, range(first, first + self.local_experts), top_k, capacity_factor,
                         seed, dtype, aux_loss_weight)
        self.comm, self.counter, self.alltoall = comm, CountingComm(comm), alltoall

    def serial_reference(self):
        """A `SerialMoE` with the same settings (call its forward with every rank's token count)."""
        return SerialMoE(self.hidden, self.ffn, self.num_experts, self.top_k, self.capacity_factor, self.seed,
                         self.dtype, self.aux_loss_weight)

    def _shards(self, x):
        return [x]

    def _alltoallv(self, send, send_rows, recv_rows):
        xp = array_module(send)
        recv = xp.empty((int(recv_rows.sum()), self.hidden), dtype=self.dtype)
        send = xp.ascontiguousarray(send)
        if self.alltoall == "mpi":
            layout = [(rows * self.hidden, (np.cumsum(rows) - rows) * self.hidden) for rows in (send_rows, recv_rows)]
            self.counter.Alltoallv([send, layout[0]], [recv, layout[1]])
        else:
            counts = tuple(tuple(int(r) * self.hidden for r in rows) for rows in (send_rows, recv_rows))
            to_others = sum(counts[0]) - counts[0][self.comm.rank]
            self.counter.run("send", to_others * send.itemsize,
                             functools.partial(ALLTOALLV_ALGORITHMS[self.alltoall], counts=counts),
                             send.reshape(-1), recv.reshape(-1), outputs=(1,))
        return recv

    def _to_experts(self, rows, counts):
        if counts is not None:
            send_counts = counts[0].reshape(self.comm.size, self.local_experts).astype(np.int64)
            self._recv_counts = np.empty_like(send_counts)
            if self.alltoall == "mpi":
                self.counter.Alltoall(send_counts, self._recv_counts)
            else:
                self.counter.run("send", send_counts.nbytes // self.comm.size * (self.comm.size - 1),
                                 ALLTOALLV_ALGORITHMS[self.alltoall], send_counts.reshape(-1),
                                 self._recv_counts.reshape(-1))
            self._send_rows = send_counts.sum(axis=1)
        return self._alltoallv(rows[0], self._send_rows, self._recv_counts.sum(axis=1)), self._recv_counts

    def _from_experts(self, rows):
        return [self._alltoallv(rows, self._recv_counts.sum(axis=1), self._send_rows)]

    def _sum(self, array):
        return self.counter.sum_in_place(array)
