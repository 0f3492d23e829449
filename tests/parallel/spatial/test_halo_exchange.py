"""Tile layouts, halo plans, and the halo exchange against the global array it stands for."""
import itertools

import numpy as np
import pytest

from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from parallel.spatial.halo_exchange import PACKING_METHODS, HaloExchange
from parallel.spatial.tile_layout import TileLayout, plan_axis

GRIDS = [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1)]


def test_block_layout_and_tiles():
    layout = TileLayout.blocks(7, 10, (2, 3))
    assert layout.row_bounds == (0, 4, 7) and layout.col_bounds == (0, 4, 7, 10)
    assert layout.dims == (2, 3) and layout.tile_shape((1, 2)) == (3, 3)
    array = np.arange(2 * 7 * 10).reshape(1, 2, 7, 10)
    assert np.array_equal(layout.tile(array, (1, 0)), array[:, :, 4:7, 0:4])


def test_impossible_layouts_are_input_errors():
    with pytest.raises(InputError, match="height of 2 cannot be split into 3"):
        TileLayout.blocks(2, 9, (3, 1))
    with pytest.raises(InputError, match="multiples of 2"):
        TileLayout(12, 8, (0, 5, 12), (0, 4, 8)).pooled(2)
    with pytest.raises(InputError, match="convolution output"):
        TileLayout.blocks(13, 13, (3, 1)).conv_output((5, 5), 2, 0)  # rows 0-4 anchored in tiles 0 and 1 only
    with pytest.raises(InputError, match="2\\*padding"):
        TileLayout.blocks(9, 9, (1, 1)).conv_output((3, 3), 1, 2)


def test_layouts_after_pooling_and_strided_convolution():
    pooled = TileLayout(13, 8, (0, 6, 13), (0, 4, 8)).pooled(2)
    assert (pooled.height, pooled.row_bounds, pooled.col_bounds) == (6, (0, 3, 6), (0, 2, 4))
    strided = TileLayout.blocks(10, 9, (2, 3)).conv_output((3, 3), 2, 1)
    assert (strided.height, strided.width) == (5, 5)
    assert strided.row_bounds == (0, 3, 5) and strided.col_bounds == (0, 2, 3, 5)


def test_same_convolution_halos_are_k_over_2():
    low, high = (plan_axis((0, 5, 10), (0, 5, 10), index, 3, 1, 1) for index in (0, 1))
    assert low.window == (-1, 6) and low.sends == [(1, (4, 5))] and low.recvs == [(1, (5, 6))]
    assert high.window == (4, 11) and high.recvs == [(0, (4, 5))] and high.sends == [(0, (5, 6))]
    assert low.interior == (0, 4) and high.interior == (6, 10)
    assert (low.origin, low.extent, high.origin, high.extent) == (-1, 7, 4, 7)


def test_valid_convolution_halo_is_k_minus_1_above():
    low, high = (plan_axis((0, 6, 11), (0, 6, 7), index, 5, 1, 0) for index in (0, 1))
    assert low.window == (0, 10) and low.recvs == [(1, (6, 10))] and low.sends == []
    assert high.window == (6, 11) and high.recvs == [] and high.outputs == (6, 7)


def test_strided_halos_differ_on_the_two_sides():
    # k 3, stride 2, padding 1: tile 1 starts at the odd row 5, its first output is anchored at row 6
    low, high = (plan_axis((0, 5, 10), (0, 3, 5), index, 3, 2, 1) for index in (0, 1))
    assert low.window == (-1, 6) and low.recvs == [(1, (5, 6))]
    assert high.window == (5, 10) and high.recvs == [] and high.sends == [(0, (5, 6))]


def test_halo_thicker_than_a_tile_comes_from_several_ranks():
    first = plan_axis((0, 2, 4, 12), (0, 2, 4, 8), 0, 5, 1, 0)
    assert first.window == (0, 6) and first.recvs == [(1, (2, 4)), (2, (4, 6))]


def _grid_or_skip(comm, dims):
    if dims[0] * dims[1] != comm.size:
        pytest.skip(f"grid {dims} needs {dims[0] * dims[1]} ranks")
    return ProcessGrid(comm, dims)


def _all_agree(comm, flag):
    return comm.allreduce(int(bool(flag))) == comm.size


def _global(shape, seed=3):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
def test_exchange_fills_the_window_with_the_global_array(comm, dims):
    grid = _grid_or_skip(comm, dims)
    height, width = 16, 17
    values = _global((2, 3, height, width))
    layout = TileLayout.blocks(height, width, dims)
    results = []
    for (kernel, stride, padding), method in itertools.product(((3, 1, 1), (5, 1, 0), (3, 2, 1), (7, 1, 3)),
                                                               PACKING_METHODS):
        exchange = HaloExchange(grid, layout, (kernel, kernel), stride, padding, method)
        rows, cols = exchange.rows, exchange.cols
        padded = np.pad(values, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        buffer = np.zeros(exchange.buffer_shape(2, 3))
        buffer[(Ellipsis,) + exchange.tile_region] = layout.tile(values, grid.coords)
        for _ in range(2):  # the cached datatypes and buffers are reused
            exchange.start(buffer).finish()
        window = buffer[:, :, rows.local(rows.window), cols.local(cols.window)]
        expected = padded[:, :, rows.window[0] + padding:rows.window[1] + padding,
                          cols.window[0] + padding:cols.window[1] + padding]
        results.append(np.array_equal(window, expected))
        exchange.free()
    assert _all_agree(comm, all(results))
    grid.free()


def _held(rows, cols, height, width):
    """Pixels of a rank's tile or image window: what its buffer sends back or keeps in the reverse exchange."""
    held = np.zeros((height, width), bool)
    held[slice(*rows.image_window), slice(*cols.image_window)] = True
    held[slice(*rows.owned), slice(*cols.owned)] = True
    return held


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
def test_reverse_exchange_adds_the_halos_back_to_their_owners(comm, dims):
    grid = _grid_or_skip(comm, dims)
    height, width, kernel, stride, padding = 10, 7, 5, 1, 2
    values = _global((1, 2, height, width), seed=4)
    layout = TileLayout.blocks(height, width, dims)
    out = layout.conv_output((kernel, kernel), stride, padding)
    count = np.zeros((height, width), int)
    for coords in itertools.product(range(dims[0]), range(dims[1])):
        count += _held(*(plan_axis(bounds, out_bounds, index, kernel, stride, padding) for bounds, out_bounds, index
                         in zip((layout.row_bounds, layout.col_bounds), (out.row_bounds, out.col_bounds), coords)),
                       height, width)
    results = []
    for method in PACKING_METHODS:
        exchange = HaloExchange(grid, layout, (kernel, kernel), stride, padding, method)
        rows, cols = exchange.rows, exchange.cols
        buffer = np.zeros(exchange.buffer_shape(1, 2))
        for i, j in zip(*np.nonzero(_held(rows, cols, height, width))):
            buffer[:, :, i - rows.origin, j - cols.origin] = values[:, :, i, j]
        exchange.start(buffer, reverse=True).finish()
        results.append(np.allclose(buffer[(Ellipsis,) + exchange.tile_region],
                                   layout.tile(values * count, grid.coords)))
        exchange.free()
    assert _all_agree(comm, all(results))
    assert (count.max() > 1) == (comm.size > 1)  # halos overlap other tiles on any grid of 2+ ranks
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_wrong_grid_packing_or_buffer_are_input_errors(comm):
    grid = ProcessGrid(comm, (comm.size, 1))
    with pytest.raises(InputError, match="grid"):
        HaloExchange(grid, TileLayout.blocks(8, 8, (1, comm.size + 1)), (3, 3), 1, 1)
    with pytest.raises(InputError, match="packing"):
        HaloExchange(grid, TileLayout.blocks(8, 8, grid.dims), (3, 3), 1, 1, method="zip")
    exchange = HaloExchange(grid, TileLayout.blocks(8, 8, grid.dims), (3, 3), 1, 1)
    with pytest.raises(InputError, match="C-contiguous buffer"):
        exchange.start(np.zeros(exchange.buffer_shape(1, 2))[:, :, :, ::-1])
    grid.free()
