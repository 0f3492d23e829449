"""Domain-parallel convolution and CNN on device arrays (the `device_backend` fixture), 1-4 ranks,
against the serial layers on the host."""
import numpy as np
import pytest

from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from parallel.nn.conv import Conv2d
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import mnist_cnn, train_step
from parallel.nn.optim import SGD
from parallel.spatial.domain_parallel import domain_parallel_model
from parallel.spatial.halo_conv import HaloConv2d, conv_padding
from parallel.spatial.tile_layout import TileLayout


def _agreed_close(comm, backend, pairs, tolerance=1e-10):
    """Every ``(device, host)`` pair: a device array close to the host reference, agreed over ranks."""
    good = all(backend.is_device_array(device) and np.allclose(
        backend.to_host(device), expected, rtol=tolerance, atol=tolerance * max(1.0, np.abs(expected).max()))
        for device, expected in pairs)
    return comm.allreduce(int(good)) == comm.size


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("kernel, stride, mode", [(3, 1, "same"), (5, 2, "same"), (3, 1, "valid")])
def test_halo_conv_on_the_device_equals_serial(comm, device_backend, kernel, stride, mode, overlap):
    grid = ProcessGrid(device_backend.comm(comm))
    rng = np.random.default_rng(kernel + stride)
    x = rng.standard_normal((2, 3, 15, 13))
    padding = conv_padding(mode, kernel)
    serial = Conv2d(3, 4, kernel, stride, padding, rng=1, dtype=np.float64)
    layout = TileLayout.blocks(15, 13, grid.dims)
    conv = HaloConv2d(Conv2d(3, 4, kernel, stride, padding, rng=1, dtype=np.float64), grid, layout,
                      overlap=overlap).to(device_backend)
    y = serial.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = serial.backward(dy)
    y_tile = conv.forward(device_backend.from_host(np.ascontiguousarray(layout.tile(x, grid.coords))))
    dx_tile = conv.backward(device_backend.from_host(np.ascontiguousarray(conv.out_layout.tile(dy, grid.coords))))
    pairs = [(y_tile, conv.out_layout.tile(y, grid.coords)), (dx_tile, layout.tile(dx, grid.coords))]
    pairs += [(conv.grads[name], serial.grads[name]) for name in serial.grads]
    assert _agreed_close(comm, device_backend, pairs)
    conv.exchange.free()
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_subarray_packing_needs_a_cuda_aware_mpi_on_the_device(comm, device_backend):
    if device_backend.device_buffers_to_mpi:
        pytest.skip("a CUDA-aware MPI takes subarray datatypes on device buffers")
    grid = ProcessGrid(device_backend.comm(comm))
    with pytest.raises(InputError, match="CUDA-aware"):
        HaloConv2d(Conv2d(2, 2, 3, 1, 1, rng=0), grid, TileLayout.blocks(9, 8, grid.dims), method="subarray")
    grid.free()


@pytest.mark.mpi(min_size=1)
def test_cnn_training_step_on_the_device_equals_serial(comm, device_backend):
    grid = ProcessGrid(device_backend.comm(comm))
    rng = np.random.default_rng(11)
    x, labels = rng.standard_normal((3, 1, 28, 28)), rng.integers(0, 10, 3)
    serial = mnist_cnn(seed=3, dtype=np.float64)
    parallel, layout = domain_parallel_model(mnist_cnn(seed=3, dtype=np.float64).to(device_backend), grid, 28, 28,
                                             overlap=True)
    optimizers = SGD(serial.parameters(), lr=0.1, momentum=0.9), SGD(parallel.parameters(), lr=0.1, momentum=0.9)
    tile = device_backend.from_host(np.ascontiguousarray(layout.tile(x, grid.coords)))
    losses = [train_step(model, softmax_cross_entropy, optimizer, batch, y)
              for model, optimizer, batch, y in zip((serial, parallel), optimizers, (x, tile),
                                                    (labels, device_backend.from_host(labels)))]
    assert comm.allreduce(int(abs(losses[1] - losses[0]) <= 1e-12 * abs(losses[0]))) == comm.size
    pairs = [(param, host_param) for (param, _), (host_param, _) in zip(parallel.parameters(), serial.parameters())]
    pairs += [(grad, host_grad) for (_, grad), (_, host_grad) in zip(parallel.parameters(), serial.parameters())]
    assert len(pairs) == 16 and _agreed_close(comm, device_backend, pairs)
    grid.free()
