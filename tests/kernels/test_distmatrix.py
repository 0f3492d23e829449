"""DistMatrix: blocks from block_range, scatter / gather round trips, input checks."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.distmatrix import DistMatrix, require_same_layout, require_vector, timed
from kernels.distribution import ProcessGrid, block_range
from kernels.errors import InputError

SHAPES = [(7, 5), (1, 1), (1, 6), (6, 1), (2, 3), (0, 4)]


def matrix(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def make_layout(comm, name):
    """The layout called ``name``: 1D by name, or a fresh ProcessGrid."""
    grids = {"grid": (0, 0), "grid_one_row": (1, 0), "replicated": (0, 0, comm.size)}
    return ProcessGrid(comm, grids[name]) if name in grids else name


LAYOUTS = ["rows", "cols", "grid", "grid_one_row", "replicated"]


def test_timed_adds_up_and_ignores_none():
    timings = {}
    for _ in range(2):
        with timed(timings, "comm"):
            pass
    with timed(None, "comm"):
        pass
    assert set(timings) == {"comm", "compute"} and timings["comm"] >= 0.0 == timings["compute"]


def test_timed_waits_for_the_device_before_reading_the_clock(device_backend, monkeypatch):
    # On a device, kernels run asynchronously: a phase must include the work it queued.
    synchronized = []
    stream = type("Stream", (), {"synchronize": lambda self: synchronized.append(True)})()
    monkeypatch.setattr(device_backend.xp, "cuda", type("Cuda", (), {"get_current_stream": lambda: stream}))
    timings = {}
    with timed(timings, "compute", device_backend.xp):
        pass
    with timed(timings, "comm"):   # the host's module (the default): nothing to wait for
        pass
    assert synchronized == [True] and set(timings) == {"comm", "compute"}


def test_require_vector_checks_length_and_dtype():
    assert require_vector([1.0, 2.0], 2, np.float64, "t").shape == (2,)
    with pytest.raises(InputError, match="length 3"):
        require_vector(np.zeros(2), 3, np.float64, "t")
    with pytest.raises(InputError, match="dtype"):
        require_vector(np.zeros(2, np.float32), 2, np.float64, "t")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_from_global_then_gather_gives_the_matrix_back(comm, layout_name, shape):
    layout = make_layout(comm, layout_name)
    global_matrix = matrix(shape)
    distributed = DistMatrix.from_global(comm, global_matrix, layout)
    rows, cols = distributed.row_range, distributed.col_range
    assert np.array_equal(distributed.local, global_matrix[rows[0]:rows[1], cols[0]:cols[1]])
    gathered = distributed.gather(root=comm.size - 1)
    agreed = comm.bcast(gathered is not None and np.array_equal(gathered, global_matrix), root=comm.size - 1)
    assert agreed
    assert (gathered is None) == (comm.rank != comm.size - 1)
    if distributed.grid is not None:
        distributed.grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("shape", [(7, 5), (2, 3), (0, 4)])
def test_device_blocks_on_the_backend_communicator_stay_on_the_device(comm, device_backend, layout_name, shape):
    device_comm = device_backend.comm(comm)
    layout = make_layout(device_comm, layout_name)   # a grid's communicators are wrapped too
    global_matrix = matrix(shape)
    on_host = DistMatrix.from_global(device_comm, global_matrix, layout)
    distributed = DistMatrix(device_comm, device_backend.from_host(on_host.local), shape, layout)
    gathered = distributed.gather(root=comm.size - 1)
    on_device = device_backend.is_device_array(distributed.local) and (
        gathered is None or device_backend.is_device_array(gathered))
    assert comm.allreduce(int(not on_device)) == 0
    assert comm.bcast(gathered is not None and np.array_equal(device_backend.to_host(gathered), global_matrix),
                      root=comm.size - 1)
    if distributed.grid is not None:
        distributed.grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_gives_every_rank_the_block_from_global_gives(comm, layout_name, dtype):
    layout = make_layout(comm, layout_name)
    global_matrix = matrix((7, 5), dtype)
    scattered = DistMatrix.scatter(comm, global_matrix if comm.rank == 0 else None, layout)
    reference = DistMatrix.from_global(comm, global_matrix, layout)
    assert comm.allreduce(int(not np.array_equal(scattered.local, reference.local)), op=MPI.SUM) == 0
    assert scattered.dtype == dtype and scattered.shape == (7, 5)
    if scattered.grid is not None:
        scattered.grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(7, 5), (2, 3)])
def test_grid_blocks_follow_block_range_of_the_grid_coordinates(comm, shape):
    grid = ProcessGrid(comm)
    distributed = DistMatrix.zeros(comm, shape, grid, np.float32)
    assert distributed.row_range == block_range(shape[0], grid.dims[0], grid.coords[0])
    assert distributed.col_range == block_range(shape[1], grid.dims[1], grid.coords[1])
    assert distributed.local.dtype == np.float32 and not distributed.local.any()
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_from_global_copies_the_block(comm):
    global_matrix = matrix((4, 3))
    distributed = DistMatrix.from_global(comm, global_matrix, "rows")
    distributed.local[...] = 99.0
    assert not (global_matrix == 99.0).any()


@pytest.mark.mpi(min_size=1)
def test_a_replicated_layout_gives_every_layer_the_whole_matrix(comm):
    grid = ProcessGrid(comm, (1, 1, comm.size))
    global_matrix = matrix((3, 4))
    distributed = DistMatrix.scatter(comm, global_matrix if comm.rank == 0 else None, grid)
    assert comm.allreduce(int(not np.array_equal(distributed.local, global_matrix)), op=MPI.SUM) == 0
    assert distributed.primary == (comm.rank == 0)
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_bad_layouts_and_blocks_are_input_errors(comm):
    with pytest.raises(InputError, match="unknown layout"):
        DistMatrix.zeros(comm, (3, 3), "diagonal")
    with pytest.raises(InputError, match="does not match"):
        DistMatrix(comm, np.zeros((9, 9)), (3, 3), "rows")
    with pytest.raises(InputError, match="2D shape"):
        DistMatrix.zeros(comm, (3, -1), "rows")
    with pytest.raises(InputError, match="2D array"):
        DistMatrix.from_global(comm, np.zeros(3), "rows")
    with pytest.raises(InputError, match="2D array on the root"):
        DistMatrix.scatter(comm, np.zeros(3) if comm.rank == 0 else None, "rows")


@pytest.mark.mpi(min_size=2)
def test_a_grid_built_on_another_communicator_is_an_input_error(comm):
    half = comm.Split(comm.rank % 2, comm.rank)
    grid = ProcessGrid(half)
    with pytest.raises(InputError, match="not built on this communicator"):
        DistMatrix.zeros(comm, (3, 3), grid)
    grid.free()
    half.Free()


@pytest.mark.mpi(min_size=1)
def test_operands_must_share_layout_and_dtype(comm):
    rows = DistMatrix.zeros(comm, (3, 3), "rows")
    with pytest.raises(InputError, match="one layout"):
        require_same_layout(rows, DistMatrix.zeros(comm, (3, 3), "cols"), "t")
    with pytest.raises(InputError, match="dtypes differ"):
        require_same_layout(rows, DistMatrix.zeros(comm, (3, 3), "rows", np.float32), "t")
    with pytest.raises(InputError, match="DistMatrix operands"):
        require_same_layout(rows, np.zeros((3, 3)), "t")
    require_same_layout(rows, DistMatrix.zeros(comm, (3, 4), "rows"), "t")
