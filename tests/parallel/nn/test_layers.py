"""Serial reference layers: forward against independent references, backward by finite differences."""
import numpy as np
import pytest
from scipy.signal import correlate
from scipy.special import log_softmax

from kernels.errors import InputError
from mpitools import combination
from parallel.nn import conv
from parallel.nn.conv import Conv2d, col2im_slabs, im2col
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential, softmax_cross_entropy
from parallel.nn.pooling import MaxPool2d

TOLERANCE = 1e-6


def relative_error(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-300)


def numeric_gradient(objective, array, eps=1e-6):
    """Central differences of the scalar ``objective()`` with respect to every entry of ``array``."""
    gradient = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        saved = array[index]
        array[index] = saved + eps
        plus = objective()
        array[index] = saved - eps
        minus = objective()
        array[index] = saved
        gradient[index] = (plus - minus) / (2 * eps)
    return gradient


def check_gradients(layer, x, seed=1):
    """Check dx and every parameter gradient of ``layer`` at ``x`` for ``L = sum(forward(x) * dy)``."""
    dy = np.random.default_rng(seed).standard_normal(layer.forward(x).shape)
    dx = layer.backward(dy)
    analytic = {name: grad.copy() for name, grad in layer.grads.items()}
    objective = lambda: float(np.sum(layer.forward(x) * dy))  # noqa: E731
    assert dx.shape == x.shape
    assert relative_error(dx, numeric_gradient(objective, x)) < TOLERANCE
    for name, param in layer.params.items():
        assert relative_error(analytic[name], numeric_gradient(objective, param)) < TOLERANCE, name


def random(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_linear_gradients():
    check_gradients(Linear(5, 3, rng=2, dtype=np.float64), random((4, 5)))


def test_linear_matches_matrix_form():
    layer = Linear(4, 3, rng=0, dtype=np.float64)
    layer.params["bias"][:] = [1.0, -2.0, 0.5]
    x, dy = random((6, 4)), random((6, 3), seed=1)
    weight = layer.params["weight"]
    np.testing.assert_allclose(layer.forward(x), x @ weight + layer.params["bias"])
    np.testing.assert_allclose(layer.backward(dy), dy @ weight.T)
    np.testing.assert_allclose(layer.grads["weight"], x.T @ dy)
    np.testing.assert_allclose(layer.grads["bias"], dy.sum(axis=0))


def test_relu_and_flatten_gradients():
    x = random((3, 2, 4, 5))
    check_gradients(ReLU(), x)
    check_gradients(Flatten(), x)
    assert Flatten().forward(x).shape == (3, 40)


@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 0), ((2, 3), 2, 1), (3, 3, 2)])
def test_conv2d_gradients(kernel, stride, padding):
    layer = Conv2d(2, 3, kernel, stride=stride, padding=padding, rng=4, dtype=np.float64)
    layer.params["bias"][:] = random(3, seed=5)
    check_gradients(layer, random((2, 2, 6, 7)))


def test_conv2d_matches_scipy_correlate():
    layer = Conv2d(3, 4, 3, rng=0, dtype=np.float64)
    layer.params["bias"][:] = random(4, seed=3)
    x = random((2, 3, 9, 8))
    expected = np.array([[correlate(image, kernel, mode="valid")[0] + bias
                          for kernel, bias in zip(layer.params["weight"], layer.params["bias"])] for image in x])
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


def naive_conv2d(x, weight, bias, stride, padding):
    """Direct loops over outputs: the definition of a strided, zero-padded cross-correlation."""
    n, _, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    padded = np.zeros((n, x.shape[1], height + 2 * padding, width + 2 * padding))
    padded[:, :, padding:padding + height, padding:padding + width] = x
    out_h, out_w = (padded.shape[2] - kh) // stride + 1, (padded.shape[3] - kw) // stride + 1
    y = np.zeros((n, out_channels, out_h, out_w))
    for i in range(n):
        for o in range(out_channels):
            for p in range(out_h):
                for q in range(out_w):
                    window = padded[i, :, p * stride:p * stride + kh, q * stride:q * stride + kw]
                    y[i, o, p, q] = np.sum(window * weight[o]) + bias[o]
    return y


@pytest.mark.parametrize("kernel, stride, padding", [(3, 2, 1), ((3, 2), 2, 2), (5, 1, 2)])
def test_conv2d_matches_naive_loops(kernel, stride, padding):
    layer = Conv2d(2, 3, kernel, stride=stride, padding=padding, rng=1, dtype=np.float64)
    layer.params["bias"][:] = random(3, seed=2)
    x = random((2, 2, 7, 8))
    expected = naive_conv2d(x, layer.params["weight"], layer.params["bias"], stride, padding)
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


def test_conv2d_gradients_in_chunks_and_odd_shapes(monkeypatch):
    """Many chunks with a short last one, GEMMs cut into row blocks (a short last one too), one input
    channel (the transposed workspace), batch 1, one-pixel images, a 1x1 kernel; without the input
    gradient the same parameter gradients."""
    monkeypatch.setattr(conv, "CHUNK_ELEMENTS", 100)
    monkeypatch.setattr(conv, "SMALL_GEMM", 60)
    monkeypatch.setattr(conv, "THIN_ROWS", 2)
    for channels, out_channels, kernel, stride, padding, shape in [
            (1, 3, 3, 1, 0, (5, 1, 6, 5)), (3, 2, (2, 3), 2, 1, (3, 3, 5, 6)), (2, 3, 3, 1, 1, (1, 2, 1, 1)),
            (5, 1, 1, 1, 0, (2, 5, 1, 1)), (1, 2, 2, 3, 2, (1, 1, 4, 3))]:
        with combination(channels, kernel, stride, padding, shape):
            layer = Conv2d(channels, out_channels, kernel, stride=stride, padding=padding, rng=3, dtype=np.float64)
            layer.params["bias"][:] = random(out_channels, seed=4)
            x = random(shape, seed=5)
            check_gradients(layer, x)
            first = Conv2d(channels, out_channels, kernel, stride=stride, padding=padding, rng=3, dtype=np.float64,
                           input_gradient=False)
            first.params["bias"][:] = layer.params["bias"]
            dy = random(layer.forward(x).shape, seed=1)
            layer.backward(dy)
            assert first.forward(x).shape == dy.shape
            assert first.backward(dy) is None
            for name, grad in layer.grads.items():
                np.testing.assert_allclose(first.grads[name], grad, rtol=1e-12)


def test_conv2d_and_pool_take_any_memory_layout_and_keep_float32():
    x = random((2, 3, 6, 6)).astype(np.float32)
    layer, pool = Conv2d(3, 4, 3, padding=1, rng=0), MaxPool2d(2)
    y = layer.forward(x)
    assert y.dtype == np.float32 and y.transpose(0, 2, 3, 1).flags.c_contiguous
    np.testing.assert_array_equal(layer.forward(np.ascontiguousarray(x)), layer.forward(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)))
    np.testing.assert_array_equal(pool.forward(y), pool.forward(np.ascontiguousarray(y)))
    assert pool.backward(np.ones((2, 4, 3, 3), np.float32)).dtype == np.float32


def test_maxpool_crops_and_routes_a_non_finite_gradient_to_its_maximum_only():
    x = random((1, 2, 5, 7))
    pool = MaxPool2d(2)
    y = pool.forward(x)
    dy = np.ones_like(y)
    dy[0, 1, 1, 2] = np.nan
    dx = pool.backward(dy)
    assert dx.shape == x.shape and np.all(dx[:, :, 4] == 0) and np.all(dx[:, :, :, 6] == 0)
    assert np.count_nonzero(dx) == y.size and np.isnan(dx).sum() == 1
    window = x[0, 1, 2:4, 4:6]
    assert np.isnan(dx[0, 1, 2:4, 4:6].flat[np.argmax(window)])


def as_slabs(cols, kernel, channels):
    """A patch matrix's columns regrouped by kernel offset: ``(kh * kw, rows, c)``, as `col2im_slabs` takes them."""
    return cols.reshape(len(cols), kernel[0] * kernel[1], channels).transpose(1, 0, 2)


def test_row_blocks_cut_only_thin_products_on_the_host():
    assert conv.row_blocks(np, 5000, 250) == [(0, 4000), (4000, 5000)]
    assert conv.row_blocks(np, 5000, 5000) == [(0, 5000)] and conv.row_blocks(np, 0, 250) == []


def test_col2im_slabs_is_the_adjoint_of_im2col():
    x, kernel, stride = random((2, 7, 6, 3)), (3, 2), 2
    cols = im2col(x, kernel, stride)
    other = random(cols.shape, seed=1)
    dx = np.zeros_like(x)
    col2im_slabs(as_slabs(other, kernel, 3), dx, kernel, stride)
    np.testing.assert_allclose(np.sum(cols * other), np.sum(x * dx))


def test_im2col_fills_a_transposed_workspace_alike():
    x, kernel = random((3, 5, 4, 1)), (2, 3)
    workspace = np.empty((kernel[0] * kernel[1], 3 * 4 * 2))
    cols = im2col(x, kernel, 1, out=workspace.T)
    assert cols.base is workspace or np.shares_memory(cols, workspace)
    np.testing.assert_array_equal(workspace.T, im2col(x, kernel, 1))


def test_maxpool_routes_gradient_to_argmax():
    x = np.array([[[[1.0, 5.0, 2.0, 0.0, 9.0],
                    [3.0, 4.0, 8.0, 7.0, 9.0],
                    [0.5, 0.2, 6.0, 1.0, 9.0]]]])
    layer = MaxPool2d(2)
    np.testing.assert_array_equal(layer.forward(x), [[[[5.0, 8.0]]]])
    dx = layer.backward(np.array([[[[10.0, 20.0]]]]))
    expected = np.zeros_like(x)
    expected[0, 0, 0, 1], expected[0, 0, 1, 2] = 10.0, 20.0
    np.testing.assert_array_equal(dx, expected)


@pytest.mark.parametrize("kernel, shape", [(2, (2, 3, 4, 6)), (3, (1, 2, 7, 8))])
def test_maxpool_gradients(kernel, shape):
    check_gradients(MaxPool2d(kernel), random(shape))


def test_sequential_gradients_and_names():
    rng = np.random.default_rng(0)
    model = Sequential([Conv2d(1, 2, 3, padding=1, rng=rng, dtype=np.float64), MaxPool2d(2), ReLU(), Flatten(),
                        Linear(8, 3, rng=rng, dtype=np.float64)])
    assert list(model.params) == ["0.weight", "0.bias", "4.weight", "4.bias"]
    assert [pair[0] is param for pair, param in zip(model.parameters(), model.params.values())] == [True] * 4
    check_gradients(model, random((2, 1, 4, 4)))


def test_softmax_cross_entropy_value_and_gradient():
    logits, labels = random((5, 4)), np.array([0, 3, 1, 1, 2])
    loss, dlogits = softmax_cross_entropy(logits, labels)
    assert loss == pytest.approx(-np.mean(log_softmax(logits, axis=1)[np.arange(5), labels]), rel=1e-12)
    numeric = numeric_gradient(lambda: softmax_cross_entropy(logits, labels)[0], logits)
    assert relative_error(dlogits, numeric) < TOLERANCE


def test_softmax_cross_entropy_is_stable_and_splits_by_batch_size():
    logits, labels = random((6, 3)) * 1000.0, np.array([0, 1, 2, 2, 1, 0])
    loss, dlogits = softmax_cross_entropy(logits, labels)
    assert np.isfinite(loss) and np.all(np.isfinite(dlogits))
    parts = [softmax_cross_entropy(logits[rows], labels[rows], batch_size=6) for rows in (slice(0, 4), slice(4, 6))]
    assert parts[0][0] + parts[1][0] == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(np.vstack([parts[0][1], parts[1][1]]), dlogits, rtol=1e-12)


def test_initialisation_is_seeded_and_typed():
    first, again, other = (Conv2d(2, 3, 3, rng=seed) for seed in (7, 7, 8))
    assert first.params["weight"].dtype == np.float32
    np.testing.assert_array_equal(first.params["weight"], again.params["weight"])
    assert not np.array_equal(first.params["weight"], other.params["weight"])
    layer = Linear(500, 400, rng=0, dtype=np.float64)
    assert layer.params["weight"].dtype == np.float64
    assert np.std(layer.params["weight"]) == pytest.approx(np.sqrt(2 / 500), rel=0.02)
    assert layer.forward(np.ones((2, 500), dtype=np.float32)).dtype == np.float64


def test_bad_inputs_raise_input_error():
    with pytest.raises(InputError):
        Linear(3, 2).forward(np.ones((4, 5)))
    with pytest.raises(InputError):
        Conv2d(2, 3, 5).forward(np.ones((1, 2, 4, 4)))
    with pytest.raises(InputError):
        Conv2d(1, 1, 3, stride=0)
    with pytest.raises(InputError):
        MaxPool2d(3).forward(np.ones((1, 1, 2, 5)))
    with pytest.raises(InputError):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 3]))
