"""block_range and ProcessGrid."""
import pytest

from kernels.distribution import ProcessGrid, block_counts, block_offsets, block_range
from kernels.errors import InputError


@pytest.mark.parametrize("n", [0, 1, 3, 7, 10, 64])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5])
def test_block_range_covers_every_item_once(n, parts):
    ranges = [block_range(n, parts, i) for i in range(parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == block_counts(n, parts)
    assert [start for start, _ in ranges] == block_offsets(n, parts)


def test_block_range_puts_the_remainder_on_the_first_blocks():
    assert [block_range(10, 4, i) for i in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize("args", [(5, 0, 0), (5, 2, 2), (5, 2, -1), (-1, 2, 0)])
def test_block_range_rejects_bad_arguments(args):
    with pytest.raises(InputError):
        block_range(*args)


@pytest.mark.mpi(min_size=1)
def test_grid_axes_link_the_right_ranks(comm):
    grid = ProcessGrid(comm)
    rows, cols = grid.dims
    assert rows * cols == comm.size
    assert grid.row_comm.size == cols and grid.col_comm.size == rows
    assert grid.row_comm.rank == grid.coords[1] and grid.col_comm.rank == grid.coords[0]
    assert grid.rank_of(grid.coords) == comm.rank
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_grid_with_a_fixed_axis_that_does_not_fit_is_an_input_error(comm):
    with pytest.raises(InputError, match="does not fit"):
        ProcessGrid(comm, dims=(comm.size + 1, 0))


@pytest.mark.mpi(min_size=2)
def test_three_axis_grid(comm):
    grid = ProcessGrid(comm, dims=(0, 0, 1))
    assert len(grid.axis_comms) == 3 and grid.axis_comms[2].size == 1
    grid.free()
