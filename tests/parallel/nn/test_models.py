"""Reference models, SGD, the serial training step and the flat parameter / gradient buffers."""
import numpy as np
import pytest

from kernels.datasets import load_digits, load_mnist_sample, train_test_split
from kernels.errors import InputError
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential, softmax_cross_entropy
from parallel.nn.models import (accuracy, flat_storage, flatten_arrays, forward_backward, keras_cnn, mlp, mnist_cnn,
                             mnist_mlp, train_step, unflatten_vector)
from parallel.nn.optim import SGD, Adam
from parallel.nn.pooling import MaxPool2d


def test_sgd_momentum_and_weight_decay_by_hand():
    param, grad = np.array([1.0, -2.0]), np.array([0.5, 0.25])
    optimizer = SGD([(param, grad)], lr=0.1, momentum=0.9, weight_decay=0.01)
    optimizer.step()
    # d = g + 0.01 p = (0.51, 0.23); v = d; p -= 0.1 v
    np.testing.assert_allclose(param, [0.949, -2.023], rtol=1e-14)
    optimizer.step()
    # d = (0.50949, 0.22977); v = 0.9 (0.51, 0.23) + d = (0.96849, 0.43677); p -= 0.1 v
    np.testing.assert_allclose(param, [0.852151, -2.066677], rtol=1e-14)


def test_plain_sgd_and_bad_settings():
    param, grad = np.array([3.0]), np.array([2.0])
    SGD([(param, grad)], lr=0.25).step()
    assert param[0] == 2.5
    with pytest.raises(InputError):
        SGD([(param, grad)], lr=0.1, momentum=1.0)


def test_mlp_structure_and_bad_sizes():
    model = mlp([4, 5, 3], seed=0, dtype=np.float64)
    assert [type(layer) for layer in model.layers] == [Linear, ReLU, Linear]
    assert model.forward(np.ones((2, 4))).shape == (2, 3)
    with pytest.raises(InputError):
        mlp([4])


def test_the_suites_mnist_mlp_is_784_256_128_10():
    shapes = [param.shape for param, _ in mnist_mlp(seed=0).parameters()]
    assert shapes == [(784, 256), (256,), (256, 128), (128,), (128, 10), (10,)]
    assert mnist_mlp(seed=0, inputs=64).forward(np.ones((3, 64), np.float32)).shape == (3, 10)


def test_flatten_and_unflatten_round_trip():
    arrays = [np.arange(6.0).reshape(2, 3), np.array([7.0]), np.arange(8.0).reshape(2, 2, 2)]
    vector = flatten_arrays(arrays)
    assert vector.shape == (15,)
    views = unflatten_vector(vector, [array.shape for array in arrays])
    for view, array in zip(views, arrays):
        np.testing.assert_array_equal(view, array)
        assert np.shares_memory(view, vector)
    with pytest.raises(InputError):
        unflatten_vector(vector, [(2, 3), (2, 4)])


def small_cnn(seed):
    rng = np.random.default_rng(seed)
    return Sequential([Conv2d(1, 2, 3, rng=rng, dtype=np.float64), MaxPool2d(2), ReLU(), Flatten(),
                       Linear(8, 4, rng=rng, dtype=np.float64)])


@pytest.mark.parametrize("build, input_shape", [(lambda seed: mlp([6, 5, 4], seed, np.float64), (7, 6)),
                                                (small_cnn, (7, 1, 6, 6))])
def test_flat_storage_keeps_values_and_matches_per_array_training(build, input_shape):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(input_shape), rng.integers(0, 4, size=7)
    reference, flat_model = build(3), build(3)
    flat_params, flat_grads = flat_storage(flat_model)
    size = sum(param.size for param in reference.params.values())
    assert flat_params.shape == flat_grads.shape == (size,)
    np.testing.assert_array_equal(flat_params, flatten_arrays(reference.params.values()))
    assert all(np.shares_memory(param, flat_params) for param in flat_model.params.values())
    assert all(np.shares_memory(grad, flat_grads) for grad in flat_model.grads.values())

    reference_optimizer = SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    flat_optimizer = SGD([(flat_params, flat_grads)], lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(3):
        train_step(reference, softmax_cross_entropy, reference_optimizer, x, y)
        train_step(flat_model, softmax_cross_entropy, flat_optimizer, x, y)
    assert np.any(flat_grads != 0)
    np.testing.assert_allclose(flat_grads, flatten_arrays(reference.grads.values()), rtol=1e-12)
    np.testing.assert_allclose(flat_params, flatten_arrays(reference.params.values()), rtol=1e-12)
    assert not np.allclose(flat_params, flatten_arrays(build(3).params.values()))


def test_accuracy_counts_argmax_hits():
    model = Linear(3, 3, dtype=np.float64)
    model.params["weight"][:] = np.eye(3)
    x = np.array([[1.0, 0, 0], [0, 2.0, 1.0], [0, 0, 5.0], [3.0, 4.0, 0]])
    assert accuracy(model, x, np.array([0, 1, 2, 0]), batch_size=3) == 0.75
    with pytest.raises(InputError):
        accuracy(model, x, np.array([0, 1]))


def test_mlp_learns_digits():
    images, labels = load_digits(flat=True)
    x_train, x_test, y_train, y_test = train_test_split(images, labels, test_fraction=0.25, seed=0)
    model = mlp([64, 64, 10], seed=0)
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    for _ in range(4):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), 32):
            batch = order[start:start + 32]
            train_step(model, softmax_cross_entropy, optimizer, x_train[batch], y_train[batch])
    assert accuracy(model, x_test, y_test) > 0.9


def test_mnist_cnn_shapes_and_loss_decreases():
    images, labels = load_mnist_sample()
    _, x, _, y = train_test_split(images, labels, test_fraction=0.01, seed=1)
    model = mnist_cnn(seed=0)
    assert model.forward(x[:5]).shape == (5, 10)
    assert [param.shape for param in model.params.values()] == [(10, 1, 5, 5), (10,), (20, 10, 5, 5), (20,),
                                                                (320, 50), (50,), (50, 10), (10,)]
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = forward_backward(model, softmax_cross_entropy, x, y)
    for _ in range(5):
        train_step(model, softmax_cross_entropy, optimizer, x, y)
    assert forward_backward(model, softmax_cross_entropy, x, y) < 0.8 * first


def test_keras_cnn_is_the_tensorflow_examples_model_and_learns_with_adam():
    images, labels = load_mnist_sample()
    _, x, _, y = train_test_split(images, labels, test_fraction=0.01, seed=1)
    x, y = x[:24], y[:24]
    model = keras_cnn(seed=0)
    assert [type(layer) for layer in model.layers] == [Conv2d, MaxPool2d, ReLU, Conv2d, MaxPool2d, ReLU, Conv2d,
                                                       ReLU, Flatten, Linear, ReLU, Linear]
    assert [param.shape for param in model.params.values()] == [
        (32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (64, 64, 3, 3), (64,), (576, 64), (64,), (64, 10), (10,)]
    assert sum(param.size for param in model.params.values()) == 93322
    assert model.forward(x[:3]).shape == (3, 10) and model.forward(x[:3]).dtype == np.float32
    optimizer = Adam(model.parameters(), lr=1e-3)
    first = forward_backward(model, softmax_cross_entropy, x, y)
    for _ in range(5):
        train_step(model, softmax_cross_entropy, optimizer, x, y)
    assert forward_backward(model, softmax_cross_entropy, x, y) < 0.8 * first


def test_flat_storage_in_another_dtype_rebinds_the_model_to_rounded_copies():
    model = small_cnn(3)
    values = flatten_arrays(model.params.values())
    flat_params, flat_grads = flat_storage(model, np.float16)
    assert flat_params.dtype == flat_grads.dtype == np.float16
    np.testing.assert_array_equal(flat_params, values.astype(np.float16))
    assert all(np.shares_memory(param, flat_params) for param in model.params.values())
    x = np.random.default_rng(0).standard_normal((2, 1, 6, 6))
    logits = model.forward(x)
    assert logits.dtype == np.float16
    model.backward(np.ones_like(logits))
    assert np.any(flat_grads != 0)
