"""Hybrid parallelism: data x tensor x pipeline parallel training of a stack of Megatron MLP blocks.

Grid
    The ``dp * tp * pp`` ranks of ``comm`` form one `ProcessGrid` with dims
    ``(dp, pp, tp)``; the tensor axis varies fastest, so tensor-parallel partners
    (which talk in every layer) are consecutive ranks, usually on one node. Axis
    communicators: ``dp_comm`` links the replicas of one (stage, tensor shard),
    ``pp_comm`` the stages of one pipeline (its rank is the stage), ``tp_comm`` the
    ranks of one stage.
Model
    ``blocks`` Megatron MLP blocks ``hidden -> ffn -> hidden`` in sequence; block
    ``k`` is a `ParallelMLP` over ``tp_comm`` from seed ``seed + 2 k`` (its second
    layer from ``seed + 2 k + 1``), equal to the serial blocks of `serial_model`.
    The last block's ``hidden`` outputs are the logits of a softmax cross-entropy.
Pipeline
    Stage ``s`` holds blocks ``block_range(blocks, pp, s)`` and runs a
    `parallel.pipeline.stage.Pipeline` over ``pp_comm``: each tensor-parallel rank sends
    the whole (replicated) activation to the rank with its tensor index in the next
    stage (no scatter-gather optimisation: ``tp`` copies of the same message).
Data
    The global batch of ``n`` samples is split over the ``dp`` replicas by
    `block_range`; each replica cuts its shard into ``m`` micro-batches, so every
    shard must be a non-zero multiple of ``m``. The loss divisor is ``n``; after the
    schedule each stage sums its flat gradient over ``dp_comm`` (one ``Allreduce``),
    which gives every replica the serial mean gradient of the global batch.

Communication per step and rank, ``b = n / (dp m)`` rows per micro-batch, ``B``
bytes per element, ``h = hidden``, ``f = ffn``, ``k`` blocks on the stage:

- pipeline (inner stages): ``2 m`` messages of ``b h B`` bytes sent and received,
  ``2 m alpha + 2 m b h B beta`` each way (the end stages half of it);
- tensor: ``2 m k`` allreduces of ``b h B`` bytes over ``tp`` ranks (forward and
  backward of each block), each ``2 (tp-1) alpha + 2 (tp-1)/tp b h B beta``;
- data: one allreduce over ``dp`` ranks of the stage's ``k (2 h f / tp + f / tp + h)``
  local parameters (ring: ``2 (dp-1) alpha + 2 (dp-1)/dp`` times their bytes ``beta``).
"""
import numpy as np

from kernels.distribution import ProcessGrid, block_counts, block_range
from kernels.errors import InputError
from parallel.nn.layers import Linear, ReLU, Sequential
from parallel.pipeline.stage import Pipeline
from parallel.tensor.tensor_parallel import ParallelMLP
from parallel.nn.optim import GradientStep

AXES = ("dp", "tp", "pp")


def block_seed(seed, block):
    """Seed of block ``block``'s first layer (the second layer uses the next integer)."""
    return seed + 2 * block


def serial_model(hidden, ffn, blocks, seed=0, dtype=np.float32):
    """The serial model a `HybridTrainer` equals: ``blocks`` blocks ``Linear, ReLU, Linear`` in a `Sequential`."""
    return Sequential([Sequential([Linear(hidden, ffn, rng=block_seed(seed, k), dtype=dtype), ReLU(),
                                   Linear(ffn, hidden, rng=block_seed(seed, k) + 1, dtype=dtype)])
                       for k in range(blocks)])


def check_grid(ranks, dp, tp, pp, hidden, ffn, blocks):
    """Raise `InputError` unless a ``dp x tp x pp`` grid of this model fits ``ranks`` ranks."""
    if min(dp, tp, pp) < 1 or dp * tp * pp != ranks:
        raise InputError(f"hybrid: a dp x tp x pp = {dp}x{tp}x{pp} grid needs {dp * tp * pp} ranks, "
                         f"not {ranks}")
    if min(hidden, ffn) < 1 or pp > blocks or tp > ffn:
        raise InputError(f"hybrid: {blocks} blocks of width {hidden} -> {ffn} do not fit pp={pp}, tp={tp} "
                         f"(need blocks >= pp and ffn >= tp)")


class HybridTrainer(GradientStep):
    """Train the `serial_model` stack on a dp x tp x pp grid of the ranks of ``comm``.

    Parameters
    ----------
    comm : MPI.Comm
        ``dp * tp * pp`` ranks; every rank calls every method together.
    dp, tp, pp : int
        Data-parallel replicas, tensor-parallel ranks per stage, pipeline stages.
    hidden, ffn, blocks : int
        Block widths and number of blocks (``blocks >= pp``, ``ffn >= tp``).
    micro_batches : int
        Micro-batches per replica and step.
    schedule : {"gpipe", "1f1b"}
    seed : int
    dtype : numpy dtype
    backend : kernels.backend.Backend, optional
        Where the blocks live (moved with `parallel.nn.layers.Layer.to` before the
        pipeline allocates its buffers); default: the host. Pass
        ``backend.comm(comm)`` as ``comm`` for a device backend.
    collectives : str
        The blocks' tensor allreduce: ``"mpi"`` or a hand-written family
        (`parallel.tensor.exchange.TENSOR_COLLECTIVES`).

    Attributes
    ----------
    grid : ProcessGrid
        dims ``(dp, pp, tp)``; ``dp_comm``, ``pp_comm``, ``tp_comm`` are its axes.
    replica, stage, tp_rank : int
        This rank's grid coordinates.
    blocks : list of ParallelMLP
        This stage's blocks (this rank's tensor shards), global indices `block_indices`.
    pipeline : parallel.pipeline.stage.Pipeline
    """

    def __init__(self, comm, dp, tp, pp, hidden, ffn, blocks, micro_batches=1, schedule="1f1b", seed=0,
                 dtype=np.float32, backend=None, collectives="mpi"):
        check_grid(comm.size, dp, tp, pp, hidden, ffn, blocks)
        self.shape, self.micro_batches = (dp, tp, pp), micro_batches
        self.grid = ProcessGrid(comm, (dp, pp, tp))
        self.dp_comm, self.pp_comm, self.tp_comm = self.grid.axis_comms
        self.replica, self.stage, self.tp_rank = self.grid.coords
        self.block_indices = range(*block_range(blocks, pp, self.stage))
        self.blocks = [ParallelMLP(self.tp_comm, hidden, ffn, block_seed(seed, k), dtype, collectives=collectives)
                       for k in self.block_indices]
        if backend is not None:
            for block in self.blocks:
                block.to(backend)
        self.pipeline = Pipeline(self.pp_comm, self.blocks, (hidden,), micro_batches, schedule, dtype,
                                 data_comm=self.dp_comm)

    def parameters(self):
        """This rank's ``(param, grad)`` pairs (for the optimiser)."""
        return self.pipeline.parameters()

    def check_batch(self, n):
        """Raise `InputError` unless each replica's shard of ``n`` samples is a multiple (>= 1) of ``micro_batches``."""
        dp, m = self.shape[0], self.micro_batches
        shards = block_counts(n, dp)
        if min(shards) < m or any(shard % m for shard in shards):
            raise InputError(f"hybrid: a global batch of {n} samples gives the {dp} replicas {shards} samples; "
                             f"each needs a non-zero multiple of {m} micro-batches")

    def shard(self, n):
        """The rows of a global batch of ``n`` samples this rank's replica trains on."""
        return slice(*block_range(n, self.shape[0], self.replica))

    def compute_gradients(self, x, y):
        """Leave in this rank's layers its shard of the serial mean gradient of the global batch ``x, y``.

        ``x`` (n, hidden) and ``y`` (n,) are the whole global batch, the same on every rank.
        Returns this rank's share of the mean loss (non-zero on the last stage of
        tensor rank 0 only, so that a sum over all ranks gives the mean loss).
        """
        self.check_batch(len(x))
        rows = self.shard(len(x))
        loss = self.pipeline.compute_gradients(x[rows], y[rows], batch_size=len(x))
        return loss if self.tp_rank == 0 else 0.0

    def tensor_seconds(self):
        """Seconds this rank has spent in its blocks' tensor-parallel allreduces so far."""
        return sum(block.comm_seconds for block in self.blocks)

    def shard_of(self, serial, kind="params"):
        """The parts of the ``kind`` ("params" or "grads") arrays of `serial_model` ``serial`` this rank
        holds, in `parameters` order."""
        return [getattr(serial.layers[k], kind)[name][block.serial_slices[name]]
                for k, block in zip(self.block_indices, self.blocks) for name in block.params]

    def free(self):
        """Release the grid's communicators (call on every rank)."""
        self.grid.free()
