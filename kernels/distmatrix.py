"""Dense matrices split in blocks over ranks: one rank's block and where it sits.

A `DistMatrix` is one rank's block of an ``m x n`` global matrix in one of three
layouts, every split made by `block_range`:

- ``"rows"``: rank ``r`` of ``p`` holds rows ``block_range(m, p, r)``, all columns;
- ``"cols"``: rank ``r`` holds columns ``block_range(n, p, r)``, all rows;
- a `ProcessGrid` with dims ``(pr, pc)``: the rank at coords ``(i, j)`` holds rows
  ``block_range(m, pr, i)`` by columns ``block_range(n, pc, j)``; with dims
  ``(pr, pc, c)`` every layer ``l`` of the depth axis holds the same blocks
  (``c`` replicas, as 2.5D GEMM uses them).

Distributed vectors are plain 1D local arrays: rank ``r`` holds entries
``block_range(n, p, r)`` unless a routine says otherwise.

Blocks may live on a device (CuPy arrays): the communicator is then the
backend's wrapper (`kernels.backend.Backend.comm`) and the routines compute
with `kernels.backend.array_module` of the blocks.
"""
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm import raw_comm
from kernels.distribution import ProcessGrid, block_range
from kernels.errors import InputError

ONE_D_LAYOUTS = ("rows", "cols")


@contextmanager
def timed(timings, key, xp=np):
    """Add the wall time of the ``with`` body to ``timings[key]`` (nothing when ``timings`` is None).

    Both ``"comm"`` and ``"compute"`` keys are created at the first use, so a
    routine that never communicates still reports ``"comm": 0.0``. With a device
    array module ``xp`` (CuPy), the stream is synchronised before the clock is
    read, so the phase holds the kernels it queued (not only their launch).
    """
    if timings is None:
        yield
        return
    for phase in ("comm", "compute"):
        timings.setdefault(phase, 0.0)
    start = MPI.Wtime()
    try:
        yield
    finally:
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
        timings[key] = timings.get(key, 0.0) + MPI.Wtime() - start


def as_block(values):
    """``values`` as an array of its own module: device arrays stay on the device, the rest goes through NumPy."""
    return array_module(values).asarray(values)


def _check_layout(comm, layout):
    if isinstance(layout, ProcessGrid):
        if len(layout.dims) not in (2, 3):
            raise InputError(f"a matrix needs a 2D or 3D process grid, got dims {layout.dims}")
        if MPI.Comm.Compare(raw_comm(comm), raw_comm(layout.cart)) not in (MPI.IDENT, MPI.CONGRUENT):
            raise InputError("the process grid was not built on this communicator")
    elif not isinstance(layout, str) or layout not in ONE_D_LAYOUTS:
        raise InputError(f"unknown layout {layout!r}: use 'rows', 'cols' or a ProcessGrid")


def _block_of(comm, shape, layout, rank):
    """Row and column ranges held by ``rank`` of ``comm``, and whether it is not a replica."""
    m, n = shape
    if layout == "rows":
        return block_range(m, comm.size, rank), (0, n), True
    if layout == "cols":
        return (0, m), block_range(n, comm.size, rank), True
    coords = layout.cart.Get_coords(rank)
    primary = len(coords) == 2 or coords[2] == 0
    return block_range(m, layout.dims[0], coords[0]), block_range(n, layout.dims[1], coords[1]), primary


def _check_shape(shape):
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or min(shape) < 0:
        raise InputError(f"a distributed matrix needs a 2D shape with sizes >= 0, got {shape}")
    return shape


class DistMatrix:
    """One rank's block of a dense ``m x n`` matrix (see the module docstring for layouts).

    Parameters
    ----------
    comm : MPI.Comm
        All ranks holding blocks (for a grid layout, the communicator it was built on).
    local : array_like
        This rank's block, of shape ``(len(row_range), len(col_range))``; a device
        array stays on its device (then ``comm`` is the backend's wrapper).
    shape : tuple of int
        Global shape ``(m, n)``.
    layout : {"rows", "cols"} or ProcessGrid

    Attributes
    ----------
    shape, comm, layout, local
        As given (``local`` as an ndarray).
    grid : ProcessGrid or None
        The layout when it is a grid.
    row_range, col_range : tuple of int
        Global half-open ranges of this rank's rows and columns.
    primary : bool
        False on the replica layers (depth coordinate > 0) of a 3D grid.
    """

    def __init__(self, comm, local, shape, layout="rows"):
        _check_layout(comm, layout)
        self.shape = _check_shape(shape)
        self.comm = comm
        self.layout = layout
        self.grid = layout if isinstance(layout, ProcessGrid) else None
        self.row_range, self.col_range, self.primary = _block_of(comm, self.shape, layout, comm.rank)
        self.local = as_block(local)
        expected = (self.row_range[1] - self.row_range[0], self.col_range[1] - self.col_range[0])
        if self.local.shape != expected:
            raise InputError(f"local block of shape {self.local.shape} does not match the {expected} block "
                             f"of a {self.shape[0]}x{self.shape[1]} matrix on rank {comm.rank}")

    @property
    def dtype(self):
        """Element type of the local block."""
        return self.local.dtype

    @property
    def row_slice(self):
        """``slice`` of the global rows held here."""
        return slice(*self.row_range)

    @property
    def col_slice(self):
        """``slice`` of the global columns held here."""
        return slice(*self.col_range)

    @classmethod
    def zeros(cls, comm, shape, layout="rows", dtype=np.float64):
        """A zero matrix; every rank of ``comm`` allocates only its block (on the host)."""
        _check_layout(comm, layout)
        rows, cols, _ = _block_of(comm, _check_shape(shape), layout, comm.rank)
        return cls(comm, np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtype), shape, layout)

    @classmethod
    def from_global(cls, comm, matrix, layout="rows"):
        """Copy this rank's block out of a global 2D host array every rank holds (no communication)."""
        matrix = np.asarray(matrix)
        if matrix.ndim != 2:
            raise InputError(f"need a 2D array, got {matrix.ndim} dimensions")
        _check_layout(comm, layout)
        rows, cols, _ = _block_of(comm, matrix.shape, layout, comm.rank)
        return cls(comm, np.array(matrix[slice(*rows), slice(*cols)], order="C"), matrix.shape, layout)

    @classmethod
    def scatter(cls, comm, matrix, layout="rows", root=0):
        """Split a global 2D array held by ``root`` into blocks, one per rank (``Scatterv``).

        ``matrix`` is ignored on the other ranks. Cost: one broadcast of the shape and
        one ``Scatterv``; root sends ``m n`` words (``c m n`` on a grid with ``c`` layers).
        Host blocks (move them with ``Backend.from_host``).
        """
        _check_layout(comm, layout)
        header = None
        if comm.rank == root:
            matrix = np.asarray(matrix)
            header = (matrix.shape, matrix.dtype.str) if matrix.ndim == 2 else None
        header = comm.bcast(header, root=root)
        if header is None:
            raise InputError("scatter needs a 2D array on the root rank")
        shape, dtype = header
        result = cls.zeros(comm, shape, layout, np.dtype(dtype))
        packed = None
        if comm.rank == root:
            blocks = [matrix[slice(*rows), slice(*cols)].ravel()
                      for rows, cols, _ in result._blocks_of_every_rank()]
            packed = [np.concatenate(blocks), _counts_and_displacements([b.size for b in blocks])]
        comm.Scatterv(packed, result.local, root=root)
        return result

    def gather(self, root=0):
        """Assemble the global matrix on ``root`` (``Gatherv``; replicas send nothing).

        Returns the ``m x n`` array on ``root`` (in the blocks' memory: host or device)
        and None elsewhere. Every rank sends its block once; root receives ``m n``
        words in ``p`` messages.
        """
        xp = array_module(self.local)
        send = xp.ascontiguousarray(self.local) if self.primary else self.local[:0, :0].ravel()
        if self.comm.rank != root:
            self.comm.Gatherv(send, None, root=root)
            return None
        blocks = list(self._blocks_of_every_rank())
        sizes = [(r[1] - r[0]) * (c[1] - c[0]) if primary else 0 for r, c, primary in blocks]
        counts, displacements = _counts_and_displacements(sizes)
        packed = xp.empty(sum(sizes), dtype=self.dtype)
        self.comm.Gatherv(send, [packed, (counts, displacements)], root=root)
        matrix = xp.empty(self.shape, dtype=self.dtype)
        for (rows, cols, primary), start, size in zip(blocks, displacements, sizes):
            if primary:
                matrix[slice(*rows), slice(*cols)] = packed[start:start + size].reshape(
                    rows[1] - rows[0], cols[1] - cols[0])
        return matrix

    def _blocks_of_every_rank(self):
        for rank in range(self.comm.size):
            yield _block_of(self.comm, self.shape, self.layout, rank)


def _counts_and_displacements(sizes):
    displacements = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(int).tolist()
    return list(sizes), displacements


def require_same_layout(first, second, what):
    """Raise InputError unless two matrices are spread the same way over the same ranks."""
    for matrix in (first, second):
        if not isinstance(matrix, DistMatrix):
            raise InputError(f"{what}: expected DistMatrix operands, got {type(matrix).__name__}")
    same = first.layout is second.layout if first.grid is not None else (
        first.layout == second.layout and first.comm == second.comm)
    if not same:
        raise InputError(f"{what}: the operands must share one layout and communicator")
    if first.dtype != second.dtype:
        raise InputError(f"{what}: dtypes differ ({first.dtype} and {second.dtype})")


def require_vector(vector, length, dtype, what):
    """``vector`` as an array of its own module, checked to be 1D, of ``length`` entries and ``dtype``."""
    vector = as_block(vector)
    if vector.shape != (length,):
        raise InputError(f"{what}: expected a local vector block of length {length}, got shape {vector.shape}")
    if vector.dtype != dtype:
        raise InputError(f"{what}: vector dtype {vector.dtype} differs from {dtype}")
    return vector
