"""How data is split over ranks: block ranges and Cartesian process grids."""
import math

from mpi4py import MPI

from kernels.errors import InputError


def block_range(n, parts, index):
    """Return the half-open range ``(start, stop)`` of block ``index`` of ``n`` items.

    The ``n % parts`` remainder is spread over the first blocks, one item each, so
    block sizes differ by at most one. Blocks may be empty when ``n < parts``.

    Parameters
    ----------
    n : int
        Number of items, ``n >= 0``.
    parts : int
        Number of blocks, ``parts >= 1``.
    index : int
        Block index, ``0 <= index < parts``.
    """
    if parts < 1 or not 0 <= index < parts or n < 0:
        raise InputError(f"block_range: need n >= 0 and 0 <= index < parts, got n={n}, parts={parts}, index={index}")
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def block_counts(n, parts):
    """Return the sizes of all ``parts`` blocks of ``n`` items (see `block_range`)."""
    base, extra = divmod(n, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def block_offsets(n, parts):
    """Return the start offset of each of the ``parts`` blocks of ``n`` items."""
    return [block_range(n, parts, index)[0] for index in range(parts)]


class ProcessGrid:
    """A Cartesian grid of ranks with a sub-communicator per axis.

    Built with ``MPI.Compute_dims`` and ``Create_cart``; ``dims`` entries left at 0
    are filled in by MPI. A 2D grid is ``rows x cols``; a 3D grid adds a depth
    axis (replicas, as in 2.5D GEMM).

    Parameters
    ----------
    comm : MPI.Comm
        The ranks to arrange; every rank of ``comm`` must call this together.
    dims : sequence of int, optional
        Grid shape; zeros are free. Default ``(0, 0)``: as square as possible.
    periodic : bool
        Whether every axis wraps around (needed by shifts in Cannon's algorithm).

    Attributes
    ----------
    cart : MPI.Cartcomm
        The grid communicator (rank order kept: ``reorder=False``).
    dims, coords : tuple of int
        Grid shape and this rank's position.
    axis_comms : tuple of MPI.Cartcomm
        ``axis_comms[a]`` links the ranks that differ only in coordinate ``a``.
    """

    def __init__(self, comm, dims=(0, 0), periodic=False):
        dims = list(dims)
        fixed = 1
        for d in dims:
            if d < 0:
                raise InputError(f"grid dimensions must be >= 0, got {tuple(dims)}")
            fixed *= d or 1
        if comm.size % fixed:
            raise InputError(f"a {'x'.join(str(d or '*') for d in dims)} grid does not fit {comm.size} ranks")
        dims = MPI.Compute_dims(comm.size, dims)
        if math.prod(dims) != comm.size:
            raise InputError(f"a {'x'.join(map(str, dims))} grid does not fit {comm.size} ranks")
        self.cart = comm.Create_cart(dims, periods=[periodic] * len(dims), reorder=False)
        self.dims = tuple(dims)
        self.coords = tuple(self.cart.Get_coords(self.cart.rank))
        self.axis_comms = tuple(
            self.cart.Sub([axis == other for other in range(len(dims))]) for axis in range(len(dims))
        )

    @property
    def row_comm(self):
        """Ranks in this rank's grid row (they differ in the column coordinate)."""
        return self.axis_comms[1]

    @property
    def col_comm(self):
        """Ranks in this rank's grid column (they differ in the row coordinate)."""
        return self.axis_comms[0]

    def rank_of(self, coords):
        """Rank in ``cart`` of the process at ``coords``."""
        return self.cart.Get_cart_rank(list(coords))

    def free(self):
        """Release the communicators (call on every rank)."""
        for sub in self.axis_comms:
            sub.Free()
        self.cart.Free()

