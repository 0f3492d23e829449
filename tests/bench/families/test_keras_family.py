"""The Keras reference of training: mlscale's models converted with their weights, trained step for step."""
import numpy as np
import pytest

from bench.families import keras as reference
from kernels.errors import InputError
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Layer, Linear, ReLU, Sequential, softmax_cross_entropy
from parallel.nn.models import keras_cnn, mnist_cnn, mnist_mlp, train_step
from parallel.nn.optim import SGD, Adam
from parallel.nn.pooling import MaxPool2d

pytestmark = [pytest.mark.skipif(reference.unavailable_reason() is not None, reason=reference.MISSING),
              pytest.mark.xdist_group("tensorflow")]  # one worker imports TensorFlow (seconds) for them all
IMAGE = (1, 28, 28)


def padded_strided(dtype, seed=3):
    """Padding, a stride, a pool that drops a row, channels (3) that divide nothing; images (3, 11, 9)."""
    rng = np.random.default_rng(seed)
    return Sequential([Conv2d(3, 5, 3, stride=2, padding=1, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(),
                       Flatten(), Linear(30, 7, rng=rng, dtype=dtype)])


MODELS = {"mlp": (lambda dtype: mnist_mlp(1, dtype), (784,)), "cnn": (lambda dtype: mnist_cnn(1, dtype), IMAGE),
          "keras_cnn": (lambda dtype: keras_cnn(1, dtype), IMAGE), "padded": (padded_strided, (3, 11, 9))}


def flat(model):
    return np.concatenate([param.ravel() for param, _ in model.parameters()])


@pytest.mark.parametrize("name", MODELS)
def test_a_converted_model_computes_the_same_logits_and_gives_its_weights_back(name):
    build, shape = MODELS[name]
    x = np.random.default_rng(0).random((5,) + shape)
    for dtype, tolerance in (("float64", 1e-12), ("float32", 1e-5)):
        model = build(dtype)
        converted = reference.keras_model(model, shape, dtype)
        logits = converted.keras(reference.to_channels_last(x.astype(dtype))).numpy()
        assert logits.dtype == dtype and np.allclose(logits, model.forward(x.astype(dtype)), rtol=tolerance,
                                                     atol=tolerance), dtype
        assert np.array_equal(reference.mlscale_parameters(converted), flat(model)), dtype


def test_keras_steps_give_the_serial_references_weights_with_sgd_and_adam():
    """float64: the same iterates to rounding (Keras' constants would be float32 without ExactSGD / MlscaleAdam);
    float32 within the dp check's tolerance. (The CNNs and the MLP: in dp's keras variant below.)"""
    build, shape = MODELS["padded"]
    rng = np.random.default_rng(1)
    x, y = rng.random((12,) + shape), rng.integers(0, 7, 12)
    optimizers = {"sgd": lambda pairs: SGD(pairs, lr=0.01, momentum=0.9), "adam": lambda pairs: Adam(pairs, lr=1e-3)}
    for dtype, rtol in (("float64", 1e-12), ("float32", 1e-3)):
        for kind, make in optimizers.items():
            serial = build(dtype)
            serial_optimizer = make(serial.parameters())
            trainer = reference.KerasTrainer(build(dtype), shape, make(build(dtype).parameters()), dtype, threads=1)
            batches = reference.to_channels_last(x.astype(dtype))
            for rows in (slice(0, 5), slice(5, 12), slice(0, 12)):  # uneven batches
                expected_loss = train_step(serial, softmax_cross_entropy, serial_optimizer, x[rows].astype(dtype),
                                           y[rows])
                assert trainer.train_step(None, batches[rows], y[rows]) == pytest.approx(expected_loss, rel=rtol)
            expected = flat(serial)
            assert np.allclose(trainer.flat_params, expected, rtol=rtol,
                               atol=rtol * np.abs(expected).max()), (dtype, kind)


def test_what_the_reference_cannot_do_is_one_line():
    class Dropout(Layer):
        pass

    with pytest.raises(InputError, match="^the keras reference cannot convert a Dropout layer$"):
        reference.keras_model(Sequential([Dropout()]), (4,), "float32")
    model = mnist_mlp(0, "float32", inputs=4)
    with pytest.raises(InputError, match="no L2 weight decay"):
        reference.KerasTrainer(model, (4,), SGD(model.parameters(), lr=0.1, weight_decay=1e-4), "float32", 1)


def test_without_tensorflow_the_reason_names_the_extra(monkeypatch):
    monkeypatch.setattr(reference.importlib.util, "find_spec", lambda name: None)
    assert reference.unavailable_reason() == reference.MISSING and "mlscale[keras]" in reference.MISSING


def _keras_point(assignments, size, dtype, steps):
    """dp's ``keras`` point run in this process as the harness runs it (set-up, steps, check, metrics,
    params): ``(wrong, params)``."""
    from mpi4py import MPI

    from bench.registry import case_class, get_case
    from bench.settings import resolve
    from kernels.backend import get_backend

    case = get_case("dp", resolve(case_class("dp").declared_settings, assignments, {}, "dp"))
    comm = MPI.COMM_SELF
    assert case.unavailable(comm, "keras", get_backend("numpy", comm)) is None
    state = case.setup(comm, size, "keras", get_backend("numpy", comm), dtype)
    try:
        for _ in range(steps):
            case.run(state)
        wrong = case.check(state)
        case.metrics(state, 0.5)
        return wrong, case.params(state)
    finally:
        case.teardown(state)


def test_dps_keras_variant_trains_the_lectures_cnns_as_the_serial_reference_does():
    """Both optimisers, both dtypes; the MLP on the digits (64 features)."""
    for assignments, size, dtype in ((["DP_MODEL=keras_cnn", "DP_OPTIMIZER=adam"], 24, "float32"),
                                     (["DP_MODEL=cnn"], 17, "float64"), (["DP_DATASET=digits"], 33, "float32")):
        wrong, params = _keras_point(assignments, size, dtype, steps=3)
        assert wrong == 0, (assignments, dtype)
        assert 0 <= params["test_accuracy"] <= 1 and params["buckets"] == 0 and params["tensorflow_threads"] >= 1
        assert params["model_state_bytes"] > 0 and params["comm_share"] == 0
