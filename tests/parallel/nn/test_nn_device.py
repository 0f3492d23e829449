"""The serial layers, models, optimisers and attention kernels on a device: device arrays in and out,
the same numbers as on the host (the `device_backend` fixture: simulated GPU, CuPy when present)."""
import numpy as np
import pytest

from kernels.errors import InputError
from parallel.nn.attention import (attention_backward, attention_forward, blockwise_attention_backward,
                                   blockwise_attention_forward, check_qkv, output_delta)
from parallel.nn.conv import Conv2d, col2im_slabs, im2col
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import accuracy, flat_storage, keras_cnn, mlp, mnist_cnn, predict, train_step
from parallel.nn.optim import SGD, Adam
from parallel.nn.pooling import MaxPool2d

MODELS = {
    "mlp": (lambda: mlp((12, 7, 5, 4), seed=3, dtype=np.float64), (5, 12), 4),
    "mnist_cnn": (lambda: mnist_cnn(seed=3, dtype=np.float64), (3, 1, 28, 28), 10),
    "keras_cnn": (lambda: keras_cnn(seed=3, dtype=np.float64), (3, 1, 28, 28), 10),
}
OPTIMISERS = {
    "sgd": lambda pairs: SGD(pairs, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda pairs: Adam(pairs, lr=1e-3, weight_decay=1e-3),
}


def host(backend, array):
    assert backend.is_device_array(array)
    return backend.to_host(array)


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("optimiser", sorted(OPTIMISERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_steps_on_the_device_match_the_host(device_backend, name, optimiser, flat):
    build, shape, classes = MODELS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    y = rng.integers(0, classes, shape[0])
    models = build(), build().to(device_backend)
    pairs = [[(p, g) for p, g in [flat_storage(model)]] if flat else model.parameters() for model in models]
    optimisers = [OPTIMISERS[optimiser](model_pairs) for model_pairs in pairs]
    inputs = (x, y), (device_backend.from_host(x), device_backend.from_host(y))
    for _ in range(2):
        losses = [train_step(model, softmax_cross_entropy, opt, *batch)
                  for model, opt, batch in zip(models, optimisers, inputs)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-12)
    for (param, grad), (device_param, device_grad) in zip(*pairs):
        np.testing.assert_allclose(host(device_backend, device_param), param, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(host(device_backend, device_grad), grad, rtol=1e-10, atol=1e-12)
    predicted = predict(models[1], inputs[1][0], batch_size=2)
    assert host(device_backend, predicted).tolist() == predict(models[0], x, batch_size=2).tolist()
    assert accuracy(models[1], *inputs[1]) == accuracy(models[0], x, y)


def test_to_keeps_the_values_and_leaves_device_arrays(device_backend):
    model = mnist_cnn(seed=1, dtype=np.float32)
    expected = {name: value.copy() for name, value in model.params.items()}
    assert model.to(device_backend) is model
    for name, value in model.params.items():
        assert host(device_backend, value).tolist() == expected[name].tolist()
        assert host(device_backend, model.grads[name]).dtype == np.float32


@pytest.mark.parametrize("kernel, stride", [((3, 3), 1), ((2, 3), 2), ((1, 1), 3)])
def test_im2col_and_col2im_slabs_on_the_device(device_backend, kernel, stride):
    x = np.random.default_rng(1).standard_normal((2, 7, 8, 3))
    cols = im2col(device_backend.from_host(x), kernel, stride)
    np.testing.assert_array_equal(host(device_backend, cols), im2col(x, kernel, stride))
    slabs = [array.reshape(len(array), -1, 3).transpose(1, 0, 2) for array in (cols, im2col(x, kernel, stride))]
    images = device_backend.from_host(np.zeros_like(x)), np.zeros_like(x)
    for slab, image in zip(slabs, images):
        col2im_slabs(slab, image, kernel, stride)
    np.testing.assert_array_equal(host(device_backend, images[0]), images[1])


def test_padded_strided_conv_and_pool_on_the_device(device_backend):
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 3, 9, 7)), rng.standard_normal((2, 4, 2, 2))
    layers = [[Conv2d(3, 4, 3, stride=2, padding=1, rng=5, dtype=np.float64), MaxPool2d(2)] for _ in range(2)]
    for layer in layers[1]:
        layer.to(device_backend)
    outputs = [], []
    for chain, values, out in zip(layers, (x, device_backend.from_host(x)), outputs):
        for layer in chain:
            values = layer.forward(values)
        out.append(values)
    np.testing.assert_allclose(host(device_backend, outputs[1][0]), outputs[0][0], rtol=1e-12)
    grads = [dy, device_backend.from_host(dy)]
    for index, chain in enumerate(layers):
        for layer in reversed(chain):
            grads[index] = layer.backward(grads[index])
    np.testing.assert_allclose(host(device_backend, grads[1]), grads[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(host(device_backend, layers[1][0].grads["weight"]), layers[0][0].grads["weight"],
                               rtol=1e-12)


def test_max_pool_backward_routes_only_the_maximum_on_the_device(device_backend):
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    pool = MaxPool2d(2).to(device_backend)
    pool.forward(device_backend.from_host(x))
    dx = host(device_backend, pool.backward(device_backend.from_host(np.array([[[[1.0, np.nan], [3.0, 4.0]]]]))))
    assert np.count_nonzero(dx) == 4 and np.isnan(dx[0, 0, 1, 3]) and dx[0, 0, 3, 3] == 4.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_cross_entropy_on_the_device(device_backend, dtype):
    rng = np.random.default_rng(4)
    logits, labels = rng.standard_normal((6, 5)).astype(dtype), rng.integers(0, 5, 6)
    loss, grad = softmax_cross_entropy(device_backend.from_host(logits), device_backend.from_host(labels), 9)
    expected_loss, expected_grad = softmax_cross_entropy(logits, labels, 9)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    np.testing.assert_allclose(host(device_backend, grad), expected_grad, rtol=1e-6)
    with pytest.raises(InputError):
        softmax_cross_entropy(device_backend.from_host(logits), device_backend.from_host(labels + 5))


def qkv(shape, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1, 13, 40])
def test_attention_kernels_on_the_device_match_the_host(device_backend, causal, seq):
    q, k, v, dout = qkv((3, seq, 4))
    device = [device_backend.from_host(a) for a in (q, k, v, dout)]
    out, lse = attention_forward(q, k, v, causal)
    delta = output_delta(out, dout)
    expected = attention_backward(q, k, v, out, lse, dout, causal)
    d_out, d_lse = attention_forward(*device[:3], causal)
    np.testing.assert_allclose(host(device_backend, d_out), out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(host(device_backend, d_lse), lse, rtol=1e-12)
    dense = attention_backward(*device[:3], d_out, d_lse, device[3], causal)
    b_out, b_lse = blockwise_attention_forward(*device[:3], causal, tiles=(4, 8))
    np.testing.assert_allclose(host(device_backend, b_out), out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(host(device_backend, b_lse), lse, rtol=1e-10)
    blockwise = blockwise_attention_backward(*device[:3], b_lse, device[3], output_delta(b_out, device[3]),
                                             causal, tiles=(4, 8))
    assert host(device_backend, output_delta(d_out, device[3])).shape == delta.shape
    for got_dense, got_blockwise, reference in zip(dense, blockwise, expected):
        np.testing.assert_allclose(host(device_backend, got_dense), reference, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(host(device_backend, got_blockwise), reference, rtol=1e-9, atol=1e-11)


def test_attention_with_no_keys_on_the_device(device_backend):
    q, k, v, _ = qkv((2, 3, 4))
    out, lse = attention_forward(*(device_backend.from_host(a) for a in (q, k[:, :0], v[:, :0])))
    assert (host(device_backend, out) == 0).all() and np.isneginf(host(device_backend, lse)).all()


def test_check_qkv_refuses_host_and_device_arrays_together(device_backend):
    q, k, v, _ = qkv((2, 3, 4))
    with pytest.raises(InputError, match="memory of the others"):
        check_qkv(q, device_backend.from_host(k), device_backend.from_host(v))
    with pytest.raises(InputError, match="NaN"):
        check_qkv(*(device_backend.from_host(a) for a in (q, k, np.full_like(v, np.nan))))
