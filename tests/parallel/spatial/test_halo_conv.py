"""Domain-parallel convolution and CNN against the serial layers, on 1x1, 1x2, 2x1, 2x2 and 1x3 grids."""
import itertools

import numpy as np
import pytest
from scipy.signal import correlate

from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from parallel.spatial.domain_parallel import aligned_layout, domain_parallel_model
from parallel.spatial import halo_conv
from parallel.spatial.halo_conv import HaloConv2d, conv_padding
from parallel.spatial.halo_exchange import PACKING_METHODS
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Linear, Sequential, softmax_cross_entropy
from parallel.nn.models import mnist_cnn, train_step
from parallel.nn.optim import SGD
from parallel.spatial.tile_layout import TileLayout

GRIDS = [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3)]
TOLERANCES = {np.float64: 1e-10, np.float32: 1e-4}


def test_padding_modes():
    assert conv_padding("same", 7) == 3 and conv_padding("valid", 7) == 0
    with pytest.raises(InputError, match="odd kernel"):
        conv_padding("same", 4)
    with pytest.raises(InputError, match="padding"):
        conv_padding("full", 3)


def test_aligned_layout_of_the_mnist_cnn_splits_the_last_map_evenly():
    layers = mnist_cnn(seed=0, dtype=np.float64).layers
    assert aligned_layout(layers, 28, 28, (2, 1)).row_bounds == (0, 8, 28)  # last map 4x4: rows 0-1 | 2-3
    layout = aligned_layout(layers, 28, 28, (3, 4))
    assert layout.row_bounds == (0, 8, 12, 28) and layout.col_bounds == (0, 4, 8, 12, 28)
    with pytest.raises(InputError, match="cannot be split into 5"):
        aligned_layout(layers, 28, 28, (5, 1))


def _grid_or_skip(comm, dims):
    if dims[0] * dims[1] != comm.size:
        pytest.skip(f"grid {dims} needs {dims[0] * dims[1]} ranks")
    return ProcessGrid(comm, dims)


def _close(actual, expected, dtype):
    tolerance = TOLERANCES[dtype]
    return np.allclose(actual, expected, rtol=tolerance, atol=tolerance * np.max(np.abs(expected)))


def _all_agree(comm, flag):
    return comm.allreduce(int(bool(flag))) == comm.size


def _compare_with_serial(grid, shape, out_channels, kernel, stride, padding, dtype, overlap, method,
                         input_gradient=True):
    """Forward and backward of HaloConv2d and of the serial Conv2d: whether tiles, dW and db agree (and, with
    ``input_gradient`` off in the layer, that its backward returns None)."""
    rng = np.random.default_rng([*np.atleast_1d(kernel), stride])
    x = rng.standard_normal(shape).astype(dtype)
    serial = Conv2d(shape[1], out_channels, kernel, stride, padding, rng=1, dtype=dtype)
    serial.params["bias"][...] = rng.standard_normal(out_channels)
    twin = Conv2d(shape[1], out_channels, kernel, stride, padding, rng=1, dtype=dtype, input_gradient=input_gradient)
    twin.params["bias"][...] = serial.params["bias"]
    layout = TileLayout.blocks(shape[2], shape[3], grid.dims)
    conv = HaloConv2d(twin, grid, layout, overlap=overlap, method=method)
    y = serial.forward(x)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = serial.backward(dy)
    y_tile = conv.forward(layout.tile(x, grid.coords))
    dx_tile = conv.backward(conv.out_layout.tile(dy, grid.coords))
    return (_close(y_tile, conv.out_layout.tile(y, grid.coords), dtype)
            and (_close(dx_tile, layout.tile(dx, grid.coords), dtype) if input_gradient else dx_tile is None)
            and all(_close(twin.grads[name], serial.grads[name], dtype) for name in serial.grads))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
def test_convolution_equals_serial(comm, dims):
    grid = _grid_or_skip(comm, dims)
    results = []
    for kernel, stride, mode in itertools.product((1, 3, 5, 7), (1, 2), ("same", "valid")):
        for dtype, overlap, method in ((np.float64, False, PACKING_METHODS[0]), (np.float32, True, PACKING_METHODS[1])):
            shape = (2, 3, 15, 13) if mode == "same" else (1, 2, 19, 26)
            results.append(_compare_with_serial(grid, shape, 4, kernel, stride, conv_padding(mode, kernel), dtype,
                                                overlap, method))
    assert _all_agree(comm, all(results))
    grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
def test_overlap_and_packing_on_tiles_thinner_than_the_halo(comm, dims):
    grid = _grid_or_skip(comm, dims)
    # 9 x 8 pixels on up to 3 tiles per axis: tiles of 3 rows, halos of 3 (same) and 6 (valid)
    results = [_compare_with_serial(grid, (1, 2, 9, 8), 3, 7, stride, 3, np.float64, overlap, method)
               for stride, overlap, method in itertools.product((1, 2), (False, True), PACKING_METHODS)]
    results.append(_compare_with_serial(grid, (1, 2, 24, 22), 3, 7, 1, 0, np.float64, True, "packed"))
    assert _all_agree(comm, all(results))
    grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
def test_a_first_layer_without_input_gradient_gives_the_weight_gradient_alone(comm, dims):
    grid = _grid_or_skip(comm, dims)
    results = [_compare_with_serial(grid, (2, 1, 13, 11), 3, kernel, 1, kernel // 2, np.float64, overlap, "packed",
                                    input_gradient=False) for kernel, overlap in itertools.product((3, 5), (False, True))]
    assert _all_agree(comm, all(results))
    grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", GRIDS)
@pytest.mark.parametrize("chunk, narrow", [(1, 0), (300, 10 ** 6), (2000, 0)])
def test_bands_strips_and_oblong_kernels_equal_serial(comm, monkeypatch, dims, chunk, narrow):
    """Bands of one row, of a few rows (the last shorter) and of several images; regions never or always
    computed transposed; kernels taller than wide and wider than tall; stride above the kernel."""
    grid = _grid_or_skip(comm, dims)
    monkeypatch.setattr(halo_conv, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(halo_conv, "NARROW_COLUMNS", narrow)
    cases = [((3, 5), 1, 1), ((5, 3), 2, 1), ((1, 3), 1, 0), ((3, 1), 3, 0), (1, 2, 0), (2, 3, 0), (3, 1, 1)]
    results = [_compare_with_serial(grid, (3, 2, 17, 14), 3, kernel, stride, padding, dtype, overlap, "packed")
               for (kernel, stride, padding), dtype, overlap in itertools.product(
                   cases, (np.float32, np.float64), (False, True))]
    assert _all_agree(comm, all(results))
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_outputs_and_input_gradients_are_not_overwritten_by_the_next_call(comm):
    """Each forward returns a new output and each backward a new input gradient (a view of a new buffer)."""
    grid = ProcessGrid(comm)
    layout = TileLayout.blocks(12, 10, grid.dims)
    conv = HaloConv2d(Conv2d(2, 3, 3, 1, 1, rng=0, dtype=np.float64), grid, layout)
    rng = np.random.default_rng(5)
    x, dy = (np.ascontiguousarray(layout.tile(rng.standard_normal((1, c, 12, 10)), grid.coords)) for c in (2, 3))
    y, dx = conv.forward(x), conv.backward(dy)
    kept = y.copy(), dx.copy()
    conv.forward(2 * x)
    conv.backward(3 * dy)
    assert _all_agree(comm, np.array_equal(y, kept[0]) and np.array_equal(dx, kept[1]))
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_forward_equals_scipy_correlate(comm):
    grid = ProcessGrid(comm)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 14, 11))
    conv = HaloConv2d(Conv2d(3, 2, 5, 1, 2, rng=3, dtype=np.float64), grid, TileLayout.blocks(14, 11, grid.dims))
    weight, bias = conv.params["weight"], conv.params["bias"]
    bias[...] = [0.5, -1.5]
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    expected = np.array([[sum(correlate(padded[n, c], weight[o, c], mode="valid") for c in range(3)) + bias[o]
                          for o in range(2)] for n in range(2)])
    y_tile = conv.forward(conv.in_layout.tile(x, grid.coords))
    assert _all_agree(comm, np.allclose(y_tile, conv.out_layout.tile(expected, grid.coords), rtol=1e-12, atol=1e-12))
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_bad_tiles_are_input_errors_on_every_rank(comm):
    grid = ProcessGrid(comm, (1, comm.size))
    layout = TileLayout.blocks(9, 3 * comm.size, grid.dims)
    conv = HaloConv2d(Conv2d(2, 2, 3, 1, 1, rng=0, dtype=np.float64), grid, layout)
    with pytest.raises(InputError, match="expected input tile"):
        conv.forward(np.zeros((1, 2, 9, 4)))
    if comm.size > 1:  # a valid 5x5 convolution anchors no output in the last tile of 3 columns
        with pytest.raises(InputError, match="convolution output"):
            HaloConv2d(Conv2d(2, 2, 5, rng=0, dtype=np.float64), grid, layout)
    with pytest.raises(InputError, match="expected Flatten"):
        domain_parallel_model(Sequential([Conv2d(1, 2, 3, rng=0), Linear(4, 2)]), grid, 9, 3 * comm.size)
    grid.free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("overlap", [False, True])
def test_cnn_training_step_equals_serial(comm, overlap):
    grid = ProcessGrid(comm)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 1, 28, 28))
    labels = rng.integers(0, 10, 5)
    serial = mnist_cnn(seed=3, dtype=np.float64)
    parallel, layout = domain_parallel_model(mnist_cnn(seed=3, dtype=np.float64), grid, 28, 28, overlap=overlap)
    serial_optimizer = SGD(serial.parameters(), lr=0.1, momentum=0.9)
    parallel_optimizer = SGD(parallel.parameters(), lr=0.1, momentum=0.9)
    results = []
    for step in range(2):
        batch = x[step:step + 4]
        expected_loss = train_step(serial, softmax_cross_entropy, serial_optimizer, batch, labels[step:step + 4])
        loss = train_step(parallel, softmax_cross_entropy, parallel_optimizer, layout.tile(batch, grid.coords),
                          labels[step:step + 4])
        results.append(abs(loss - expected_loss) <= 1e-12 * abs(expected_loss))
        for (param, grad), (serial_param, serial_grad) in zip(parallel.parameters(), serial.parameters()):
            results.append(_close(grad, serial_grad, np.float64) and _close(param, serial_param, np.float64))
    assert len(results) == 2 * (1 + 8)
    assert _all_agree(comm, all(results))
    grid.free()
