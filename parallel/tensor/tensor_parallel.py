"""Tensor (Megatron-style) parallelism: column- and row-parallel linear layers and the parallel MLP.

A linear layer ``Y = X W + b`` (``W`` of shape ``(in, out)``, `parallel.nn.layers.Linear`)
is split over the ``p`` ranks of ``comm`` in one of two ways:

Column-parallel
    Rank ``r`` holds the columns ``block_range(out, p, r)`` of ``W`` and ``b`` and
    computes its slice of ``Y`` from the whole ``X``. Conjugate operators: the
    input is replicated (identity forward) and ``dX`` is a sum over the column
    blocks (allreduce backward).
Row-parallel
    Rank ``r`` holds the rows ``block_range(in, p, r)`` of ``W`` (and the whole ``b``)
    and computes a partial ``X_r W_r`` from its slice of ``X``. Conjugate operators:
    the partial products are summed (allreduce forward) and ``dX_r = dY W_r^T``
    needs no exchange (identity backward). ``b`` is added once, after the sum.

`ParallelMLP` chains them (column -> ReLU -> row, the Megatron block): one
allreduce of ``T x hidden`` numbers per pass, none in between.

Sequence parallelism (``sequence_parallel=True``): the ``T`` tokens of ``X`` and
``Y`` are sharded along the first axis, rank ``r`` holding rows
``block_range(T, p, r)`` (any ``T``, also ``T < p``; another layout is an
`InputError` on every rank). The column layer allgathers ``X`` (``Allgatherv``)
forward and reduce-scatters ``dX`` (``Reduce_scatter``) backward; the row layer
reduce-scatters ``Y`` forward and allgathers ``dY`` backward. The gathered input is
kept for the weight gradient (Megatron re-gathers it to save memory).

Splits: features need not be divisible by ``p`` (Megatron requires it; here the
`block_range` blocks differ by at most one), but every rank must hold at least one
feature of the split axis: ``features < p`` is an `InputError`. All gradients equal
the slices of the serial layer's gradients that the rank holds (see
``serial_slices``); the replicated row bias gets the full gradient on every rank.

Communication cost per rank, ``n = T * width * itemsize`` bytes of the exchanged
activation (width ``in`` for the column layer's ``dX``, ``out`` for the row
layer's ``Y``), ring algorithms: an allreduce costs ``2 (p-1) alpha + 2 (p-1)/p n
beta``, an allgather or a reduce-scatter ``(p-1) alpha + (p-1)/p n beta`` (the
sequence-parallel column forward and row backward add one ``Allgather`` of one
integer per rank: the token counts). The layers' ``counter``, a
`kernels.comm.counting.CountingComm`, adds up these nominal ring bytes by the
convention of `kernels.comm.traffic` (``2 (p-1)/p n`` per allreduce, ``(p-1)/p n``
per allgather or reduce-scatter, the token counts not included: a check of the
layout, made on the raw communicator), whatever algorithm runs: MPI's, or the
hand-written family ``collectives`` names (`parallel.tensor.exchange`).
"""
import numpy as np

from kernels.comm.counting import CountedCommunication, CountingComm
from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.nn.layers import Linear, ReLU, Sequential
from parallel.tensor.exchange import TensorExchange


def serial_mlp(hidden, ffn, seed=0, dtype=np.float32):
    """The serial Megatron block ``Sequential([Linear(hidden, ffn, rng=seed), ReLU(),
    Linear(ffn, hidden, rng=seed + 1)])``."""
    return Sequential([Linear(hidden, ffn, rng=seed, dtype=dtype), ReLU(),
                       Linear(ffn, hidden, rng=seed + 1, dtype=dtype)])


def token_shard(comm, tokens):
    """The slice of ``tokens`` rows that ``comm.rank`` holds under sequence parallelism (`block_range`)."""
    return slice(*block_range(tokens, comm.size, comm.rank))


class _ParallelLinear(CountedCommunication, Linear):
    """Shared set-up: build the serial `Linear` from ``rng`` and keep this rank's block of one axis."""

    def __init__(self, comm, in_features, out_features, rng, dtype, sequence_parallel, counter, collectives,
                 split_axis):
        split = (in_features, out_features)[split_axis]
        if min(in_features, out_features) < 1 or split < comm.size:
            raise InputError(f"{type(self).__name__}: cannot split {split} {('input', 'output')[split_axis]} "
                             f"features over {comm.size} ranks (each rank needs at least one; "
                             f"got in={in_features}, out={out_features})")
        super().__init__(in_features, out_features, rng=rng, dtype=dtype)
        self.block = slice(*block_range(split, comm.size, comm.rank))
        weight_rows = self.block if split_axis == 0 else slice(None)
        weight_cols = self.block if split_axis == 1 else slice(None)
        bias_block = self.block if split_axis == 1 else slice(None)
        #: Where this rank's parameters sit in the serial layer's (``serial.params[name][index]``).
        self.serial_slices = {"weight": (weight_rows, weight_cols), "bias": bias_block}
        self._set_params(weight=np.ascontiguousarray(self.params["weight"][weight_rows, weight_cols]),
                         bias=self.params["bias"][bias_block].copy())
        self.comm = comm
        self.sequence_parallel = bool(sequence_parallel)
        self.counter = counter if counter is not None else CountingComm(comm)
        self.exchange = TensorExchange(self.counter, collectives)


class ColumnParallelLinear(_ParallelLinear):
    """Linear layer split by output columns: rank ``r`` holds ``W[:, block_range(out, p, r)]`` and ``b[block]``.

    Parameters
    ----------
    comm : MPI.Comm
        The tensor-parallel group (all ranks call every method together).
    in_features, out_features : int
        Serial layer sizes; ``out_features >= p``.
    rng : int or numpy.random.Generator
        Seed of the serial `Linear` whose columns this rank keeps.
    dtype : numpy dtype
    sequence_parallel : bool
        Input rows sharded by token (allgather forward, reduce-scatter backward)
        instead of replicated (identity forward, allreduce backward).
    counter : kernels.comm.counting.CountingComm, optional
        ``comm`` counted, shared (a block's layers add into one); a new one by default.
    collectives : str
        ``"mpi"`` or a hand-written family (`parallel.tensor.exchange.TENSOR_COLLECTIVES`).

    Shapes: ``forward(x)``: ``x`` (T, in) replicated, or (T_r, in) sharded; returns
    (T, out_r). ``backward(dy_local)``: (T, out_r); returns ``dx`` (T, in) summed over
    the ranks, or this rank's (T_r, in) rows of it.
    """

    def __init__(self, comm, in_features, out_features, rng=0, dtype=np.float32, sequence_parallel=False,
                 counter=None, collectives="mpi"):
        super().__init__(comm, in_features, out_features, rng, dtype, sequence_parallel, counter, collectives,
                         split_axis=1)

    def forward(self, x):
        x = x.astype(self.dtype, copy=False)
        return super().forward(self.exchange.allgather_rows(x) if self.sequence_parallel else x)

    def backward(self, dy_local):
        partial = super().backward(dy_local.astype(self.dtype, copy=False))
        return self.exchange.reduce_scatter_rows(partial) if self.sequence_parallel else \
            self.exchange.sum_in_place(partial)


class RowParallelLinear(_ParallelLinear):
    """Linear layer split by input rows: rank ``r`` holds ``W[block_range(in, p, r), :]`` and the whole ``b``.

    Parameters as in `ColumnParallelLinear`, with ``in_features >= p``.

    Shapes: ``forward(x_local)``: (T, in_r); returns ``y`` (T, out) summed over the
    ranks, or this rank's (T_r, out) rows of it. ``backward(dy)``: (T, out)
    replicated, or (T_r, out) sharded; returns ``dx`` (T, in_r).
    """

    def __init__(self, comm, in_features, out_features, rng=0, dtype=np.float32, sequence_parallel=False,
                 counter=None, collectives="mpi"):
        super().__init__(comm, in_features, out_features, rng, dtype, sequence_parallel, counter, collectives,
                         split_axis=0)

    def forward(self, x_local):
        x_local = x_local.astype(self.dtype, copy=False)
        weight = self.params["weight"]
        if x_local.ndim != 2 or x_local.shape[1] != weight.shape[0]:
            raise InputError(f"RowParallelLinear: expected input of shape (batch, {weight.shape[0]}) on rank "
                             f"{self.comm.rank}, got {x_local.shape}")
        self._x = x_local
        partial = x_local @ weight
        y = self.exchange.reduce_scatter_rows(partial) if self.sequence_parallel else \
            self.exchange.sum_in_place(partial)
        y += self.params["bias"]
        return y

    def backward(self, dy):
        dy = dy.astype(self.dtype, copy=False)
        return super().backward(self.exchange.allgather_rows(dy) if self.sequence_parallel else dy)


class ParallelMLP(CountedCommunication, Sequential):
    """Megatron MLP block: `ColumnParallelLinear` (hidden -> ffn), ReLU, `RowParallelLinear` (ffn -> hidden).

    Equal to the serial ``Sequential([Linear(hidden, ffn, rng=seed), ReLU(),
    Linear(ffn, hidden, rng=seed + 1)])`` (`serial_reference`): the first layer's
    weights come from seed ``seed``, the second's from ``seed + 1``. Parameter names
    are the serial block's (``"0.weight"``, ``"0.bias"``, ``"2.weight"``, ``"2.bias"``);
    the arrays are this rank's blocks (``serial_slices``). One `CountingComm` serves
    both layers: ``bytes_sent`` and ``comm_seconds`` cover the whole block.

    Parameters
    ----------
    comm : MPI.Comm
    hidden, ffn : int
        Model width and inner width; ``ffn >= p`` (split over the ranks, any remainder).
    seed : int
    dtype : numpy dtype
    sequence_parallel : bool
        ``x`` and ``y`` (and ``dy``, ``dx``) sharded along the token axis
        (`token_shard`) instead of replicated.
    collectives : str
        The algorithms of the exchanges: ``"mpi"`` or a hand-written family
        (`parallel.tensor.exchange.TENSOR_COLLECTIVES`); the counted bytes are the same.

    Costs per rank and pass (``n = T * hidden * itemsize``): Megatron one allreduce,
    ``2 (p-1) alpha + 2 (p-1)/p n beta``; sequence-parallel one allgather plus one
    reduce-scatter, the same bytes, plus one integer allgather for the token counts.
    """

    def __init__(self, comm, hidden, ffn, seed=0, dtype=np.float32, sequence_parallel=False, collectives="mpi"):
        self.hidden, self.ffn, self.seed, self.dtype = hidden, ffn, seed, np.dtype(dtype)
        self.comm, self.sequence_parallel = comm, bool(sequence_parallel)
        self.counter = CountingComm(comm)
        super().__init__([
            ColumnParallelLinear(comm, hidden, ffn, seed, dtype, sequence_parallel, self.counter, collectives),
            ReLU(), RowParallelLinear(comm, ffn, hidden, seed + 1, dtype, sequence_parallel, self.counter, collectives)])

    @property
    def serial_slices(self):
        """``{name: index}``: this rank's ``params[name]`` is ``serial_reference().params[name][index]``."""
        return {f"{position}.{name}": index for position in (0, 2)
                for name, index in self.layers[position].serial_slices.items()}

    def serial_reference(self):
        """The serial block this one equals (`serial_mlp` with the same sizes, seed and dtype)."""
        return serial_mlp(self.hidden, self.ffn, self.seed, self.dtype)
