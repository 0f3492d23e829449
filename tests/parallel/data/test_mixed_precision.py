"""Mixed-precision data parallelism against float32 training, loss scaling and skipped steps, on any rank count."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.datasets import load_digits, train_test_split
from kernels.errors import InputError
from parallel.data.data_parallel import DataParallelTrainer, shard
from parallel.data.gradient_wire import bfloat16_bits, bfloat16_values, round_to_bfloat16
from parallel.data.mixed_precision import ComputeFormat, LossScaler, default_scaler
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential, softmax_cross_entropy
from parallel.nn.models import mlp
from parallel.nn.optim import SGD, Adam
from parallel.nn.pooling import MaxPool2d

#: Gradient tolerances against float32: ||g16 - g32|| <= TOLERANCE ||g32|| over the whole gradient vector
#: (float16 keeps 11 significant bits, bfloat16 8; measured at most 2e-3 and 6e-2). A norm, not the largest
#: element: a pre-activation rounded across zero flips a ReLU and changes a few elements by their whole value.
GRADIENT_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-1}
#: Loss after `LOSS_STEPS` steps on digits: |loss16 - loss32| <= LOSS_TOLERANCE * loss32 (measured 1e-3 at most).
LOSS_STEPS, LOSS_TOLERANCE = 40, 0.01
BATCH = 61  # not divisible by 2, 3 or 4


def small_cnn(seed):
    """A CNN whose first convolution skips its input gradient (backward returns None, passed through)."""
    rng = np.random.default_rng(seed)
    return Sequential([Conv2d(1, 4, 3, rng=rng, input_gradient=False), MaxPool2d(2), ReLU(), Conv2d(4, 6, 3, padding=1, rng=rng),
                       ReLU(), Flatten(), Linear(54, 10, rng=rng)])


MODELS = {"mlp": (lambda seed: mlp([20, 16, 10], seed), (20,)), "cnn": (small_cnn, (1, 8, 8))}


def on_all_ranks(comm, verdict):
    return comm.allreduce(bool(verdict), op=MPI.LAND)


def batch(input_shape, n=BATCH, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + input_shape).astype(np.float32), rng.integers(0, 10, n)


def gradients(comm, model_name, x, y, **options):
    """The global mean gradient ``DataParallelTrainer(**options)`` leaves after one step on ``x, y``."""
    build, _ = MODELS[model_name]
    trainer = DataParallelTrainer(comm, build(0), **options)
    mine = shard(comm, len(x))
    trainer.compute_gradients(x[mine], y[mine], batch_size=len(x))
    return trainer


def test_round_to_bfloat16_in_place_equals_the_wire_rounding():
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1e3
    values[:4] = [np.inf, -np.inf, 0.0, 3.4e38]
    expected = bfloat16_values(bfloat16_bits(values))
    assert round_to_bfloat16(values) is values
    np.testing.assert_array_equal(values, expected)
    with pytest.raises(TypeError):
        round_to_bfloat16(np.zeros(2))


def test_loss_scaler_halves_on_overflow_and_doubles_after_the_growth_interval():
    scaler = LossScaler(1024.0, growth_interval=2)
    assert [scaler.update(finite) for finite in (True, True, False, True, False, False, True, True)] == \
        [True, True, False, True, False, False, True, True]
    # 1024 -> 2048 (two good) -> 1024 (overflow) -> 512 -> 256 (overflows; the good step between reset the
    # count) -> 512 (two good)
    assert (scaler.scale, scaler.skipped_steps, scaler.steps) == (512.0, 3, 8)
    fixed = LossScaler(1.0, dynamic=False)
    assert not fixed.update(False) and fixed.update(True) and fixed.scale == 1.0 and fixed.skipped_steps == 1
    assert default_scaler("float16").scale == 2.0 ** 16 and default_scaler("bfloat16").scale == 1.0
    for options in (dict(scale=0.0), dict(scale=np.inf), dict(growth_interval=0)):
        with pytest.raises(InputError, match="LossScaler"):
            LossScaler(**options)


def test_bad_compute_format_is_an_input_error():
    with pytest.raises(InputError, match="unknown compute format 'int8'"):
        DataParallelTrainer(MPI.COMM_SELF, mlp([3, 2], 0), compute="int8")
    with pytest.raises(InputError, match="unknown compute format"):
        ComputeFormat("full")


OPTIONS = [dict(), dict(allreduce="mpi", overlap=True, bucket_bytes=256, micro_batches=2),
           dict(allreduce="ring", precision="bfloat16", micro_batches=3), dict(allreduce="tree", precision="float16")]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compute", ["float16", "bfloat16"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_gradients_are_within_tolerance_of_float32(comm, compute, model_name, options):
    x, y = batch(MODELS[model_name][1])
    expected = gradients(comm, model_name, x, y).flat_grads
    trainer = gradients(comm, model_name, x, y, compute=compute, loss_scaler=LossScaler(2.0 ** 8), **options)
    error = np.linalg.norm(trainer.flat_grads - expected) / np.linalg.norm(expected)
    assert trainer.flat_grads.dtype == trainer.flat_params.dtype == np.float32
    assert on_all_ranks(comm, not trainer.step_skipped and error <= GRADIENT_TOLERANCE[compute])
    # The model computes in the 16-bit format: float16 arrays, or float32 holding bfloat16 numbers.
    weights = [param for param, _ in trainer.model.parameters()]
    if compute == "float16":
        assert all(weight.dtype == np.float16 for weight in weights)
    else:
        assert all(np.all(weight.view(np.uint32) & 0xFFFF == 0) for weight in weights)


def train_digits(comm, optimizer_class, lr, steps=LOSS_STEPS, **options):
    """Train a 64-32-10 MLP on digits data-parallel for ``steps``; return the trainer and the final mean loss."""
    images, labels = load_digits(flat=True)
    train_x, _, train_y, _ = train_test_split(images, labels, test_fraction=0.25, seed=0)
    train_x = train_x.astype(np.float32)
    trainer = DataParallelTrainer(comm, mlp([64, 32, 10], seed=0), **options)
    optimizer = optimizer_class(trainer.parameters(), lr=lr)
    size = 37
    for step in range(steps):
        rows = (step * size + np.arange(size)) % len(train_x)
        mine = rows[shard(comm, size)]
        trainer.train_step(optimizer, train_x[mine], train_y[mine], batch_size=size)
    reference = mlp([64, 32, 10], seed=0)
    for (param, _), master in zip(reference.parameters(), np.split(trainer.flat_params, np.cumsum(
            [param.size for param, _ in reference.parameters()])[:-1])):
        param[...] = master.reshape(param.shape)
    loss, _ = softmax_cross_entropy(reference.forward(train_x), train_y)
    return trainer, loss


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compute", ["float16", "bfloat16"])
@pytest.mark.parametrize("optimizer_class, lr", [(SGD, 0.2), (Adam, 3e-3)], ids=["sgd", "adam"])
def test_loss_after_n_steps_is_within_tolerance_of_float32(comm, compute, optimizer_class, lr):
    _, initial = train_digits(comm, optimizer_class, lr, steps=0)
    _, expected = train_digits(comm, optimizer_class, lr)
    trainer, loss = train_digits(comm, optimizer_class, lr, compute=compute)
    assert on_all_ranks(comm, abs(loss - expected) <= LOSS_TOLERANCE * expected and expected < 0.7 * initial)
    assert comm.allreduce(trainer.replica_mismatches()) == 0
    # The default float16 scale 2**16 may overflow at first; every skipped step halved it.
    skipped = trainer.loss_scaler.skipped_steps
    assert trainer.loss_scaler.scale == (2.0 ** (16 - skipped) if compute == "float16" else 1.0)


@pytest.mark.mpi(min_size=1)
def test_an_overflow_is_detected_and_the_step_skipped_on_every_rank(comm):
    x, y = batch((20,))
    trainer = DataParallelTrainer(comm, mlp([20, 16, 10], 0), compute="float16",
                                  loss_scaler=LossScaler(2.0 ** 40, growth_interval=3))
    optimizer = Adam(trainer.parameters(), lr=1e-2)
    start = trainer.flat_params.copy()
    mine = shard(comm, len(x))
    trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
    # 2**40 overflows float16 (max 65504) in the scaled loss gradient: nothing moves, the scale halves.
    assert on_all_ranks(comm, trainer.step_skipped and np.array_equal(trainer.flat_params, start))
    assert (optimizer.steps, trainer.loss_scaler.scale, trainer.loss_scaler.skipped_steps) == (0, 2.0 ** 39, 1)
    while trainer.step_skipped:
        trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
    skipped = trainer.loss_scaler.skipped_steps
    assert skipped >= 10 and optimizer.steps == 1 and trainer.loss_scaler.scale == 2.0 ** (40 - skipped)
    assert on_all_ranks(comm, not np.array_equal(trainer.flat_params, start))
    assert comm.allreduce(trainer.replica_mismatches()) == 0

    # An overflow on the last rank only (a huge input in its shard) is skipped by every rank.
    x[-1] = 1e5
    before = trainer.flat_params.copy()
    trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
    assert on_all_ranks(comm, trainer.step_skipped and np.array_equal(trainer.flat_params, before))
    assert trainer.loss_scaler.skipped_steps == skipped + 1 and optimizer.steps == 1


@pytest.mark.mpi(min_size=1)
def test_the_scale_grows_after_finite_steps_and_sync_model_refreshes_the_copy(comm):
    x, y = batch((20,))
    trainer = DataParallelTrainer(comm, mlp([20, 16, 10], 0), compute="bfloat16",
                                  loss_scaler=LossScaler(4.0, growth_interval=2))
    optimizer = SGD(trainer.parameters(), lr=0.1)
    mine = shard(comm, len(x))
    for _ in range(4):
        trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
    assert trainer.loss_scaler.scale == 16.0 and trainer.loss_scaler.skipped_steps == 0
    copy = trainer.model.parameters()[0][0]
    assert not np.array_equal(copy, round_to_bfloat16(trainer.flat_params[:copy.size].reshape(copy.shape).copy()))
    trainer.sync_model()
    np.testing.assert_array_equal(copy, round_to_bfloat16(trainer.flat_params[:copy.size].reshape(copy.shape).copy()))
