"""Data-parallel training against serial training on the global batch, on any rank count."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.datasets import load_digits, train_test_split
from kernels.errors import InputError
from parallel.data.data_parallel import ALLREDUCE_CHOICES, DataParallelTrainer, shard
from parallel.data.gradient_wire import bfloat16_bits, bfloat16_values, bucket_bounds
from parallel.nn.conv import Conv2d
from parallel.nn.layers import Flatten, Linear, ReLU, Sequential, softmax_cross_entropy
from parallel.nn.models import accuracy, mlp, train_step
from parallel.nn.optim import SGD, Adam
from parallel.nn.pooling import MaxPool2d

#: Global batch sizes of the steps: not divisible by 2, 3 or 4, and one smaller than 4 ranks.
STEP_BATCHES = (7, 3, 10)
SMALL_BUCKET = 48  # bytes of float64: several buckets, and parameters larger than the cap


def tiny_mlp(seed, dtype=np.float64):
    return mlp([6, 5, 4], seed, dtype)


def tiny_cnn(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Sequential([Conv2d(1, 2, 3, rng=rng, dtype=dtype), MaxPool2d(2), ReLU(), Flatten(),
                       Linear(8, 4, rng=rng, dtype=dtype)])


MODELS = {"mlp": (tiny_mlp, (6,)), "cnn": (tiny_cnn, (1, 6, 6))}


def batches(input_shape, dtype=np.float64):
    """The global batches of `STEP_BATCHES` (inputs and labels), the same on every rank."""
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((n,) + input_shape).astype(dtype), rng.integers(0, 4, n)) for n in STEP_BATCHES]


def on_all_ranks(comm, verdict):
    return comm.allreduce(bool(verdict), op=MPI.LAND)


def relative_error(actual, expected):
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def sgd(pairs):
    return SGD(pairs, lr=0.1, momentum=0.9, weight_decay=0.01)


def adam(pairs):
    return Adam(pairs, lr=0.01, weight_decay=0.01)


def train_both(comm, model_name, dtype=np.float64, optimizer_class=sgd, **options):
    """Train serially and data-parallel on the same batches; return (serial params, trainer, losses)."""
    build, input_shape = MODELS[model_name]
    serial = build(0, dtype)
    serial_optimizer = optimizer_class(serial.parameters())
    trainer = DataParallelTrainer(comm, build(0, dtype), **options)
    optimizer = optimizer_class(trainer.parameters())
    losses = []
    for x, y in batches(input_shape, dtype):
        serial_loss = train_step(serial, softmax_cross_entropy, serial_optimizer, x, y)
        mine = shard(comm, len(x))
        share = trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
        losses.append((serial_loss, comm.allreduce(share)))
    expected = np.concatenate([param.ravel() for param, _ in serial.parameters()])
    return expected, trainer, losses


def test_buckets_group_parameters_from_the_last_one_backwards():
    sizes = [6, 2, 15, 3]
    assert bucket_bounds(sizes, 4, 40) == [(23, 26), (8, 23), (0, 8)]
    assert bucket_bounds(sizes, 4, 1) == [(23, 26), (8, 23), (6, 8), (0, 6)]
    assert bucket_bounds(sizes, 4, 0) == [(0, 26)]
    assert bucket_bounds(sizes, 4, 10 ** 6) == [(0, 26)]


def test_bfloat16_rounds_to_nearest_even_in_the_upper_half():
    step = 2.0 ** -7  # bfloat16 spacing in [1, 2)
    values = np.array([1.0, -2.5, 0.0, 1 + step / 2, 1 + 1.5 * step, 1 + step / 2 + 2.0 ** -20, 3e38],
                      dtype=np.float32)
    bits = bfloat16_bits(values)
    assert bits.dtype == np.uint16 and bits[0] == 0x3F80
    rounded = bfloat16_values(bits)
    np.testing.assert_array_equal(rounded[:6], [1.0, -2.5, 0.0, 1.0, 1 + 2 * step, 1 + step])
    assert np.all(rounded.view(np.uint32) & 0xFFFF == 0)
    assert abs(rounded[6] - values[6]) <= 2.0 ** -8 * values[6]


def test_shard_follows_block_range():
    assert [shard(MPI.COMM_SELF, 7)] == [slice(0, 7)]


@pytest.mark.parametrize("options, message", [
    (dict(allreduce="bogus"), "unknown allreduce"),
    (dict(precision="int8"), "unknown gradient precision"),
    (dict(allreduce="ring", overlap=True), "overlap needs a non-blocking allreduce"),
    (dict(bucket_bytes=-1), "bucket_bytes >= 0"),
    (dict(micro_batches=0), "micro_batches >= 1"),
])
def test_bad_settings_are_input_errors(options, message):
    with pytest.raises(InputError, match=message):
        DataParallelTrainer(MPI.COMM_SELF, tiny_mlp(0), **options)


def test_samples_and_labels_must_match():
    trainer = DataParallelTrainer(MPI.COMM_SELF, tiny_mlp(0))
    with pytest.raises(InputError, match="3 samples but 2 labels"):
        trainer.compute_gradients(np.zeros((3, 6)), np.zeros(2, dtype=int))


CONFIGS = (
    [dict(allreduce=name) for name in ALLREDUCE_CHOICES]
    + [dict(allreduce=name, bucket_bytes=SMALL_BUCKET) for name in ALLREDUCE_CHOICES]
    + [dict(allreduce="mpi", overlap=True), dict(allreduce="mpi", overlap=True, bucket_bytes=SMALL_BUCKET),
       dict(allreduce="mpi", overlap=True, bucket_bytes=SMALL_BUCKET, micro_batches=3),
       dict(allreduce="ring", bucket_bytes=SMALL_BUCKET, micro_batches=2),
       dict(allreduce="tree", micro_batches=3)]
)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_data_parallel_equals_serial_training_in_float64(comm, model_name, options):
    expected, trainer, losses = train_both(comm, model_name, **options)
    assert on_all_ranks(comm, relative_error(trainer.flat_params, expected) <= 1e-12)
    assert on_all_ranks(comm, np.allclose([dp for _, dp in losses], [serial for serial, _ in losses],
                                          rtol=1e-12, atol=0))
    assert comm.allreduce(trainer.replica_mismatches()) == 0
    if options.get("bucket_bytes"):
        assert len(trainer.buckets) > 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("options", [dict(), dict(allreduce="mpi", overlap=True, bucket_bytes=SMALL_BUCKET),
                                     dict(allreduce="rabenseifner", micro_batches=2)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_data_parallel_adam_equals_serial_adam_with_replicated_moments(comm, model_name, options):
    expected, trainer, _ = train_both(comm, model_name, optimizer_class=adam, **options)
    assert on_all_ranks(comm, relative_error(trainer.flat_params, expected) <= 1e-12)
    assert comm.allreduce(trainer.replica_mismatches()) == 0


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("allreduce", ["mpi", "ring"])
@pytest.mark.parametrize("overlap", [False, True])
def test_reduced_precision_is_close_to_serial_and_exchanged_in_16_bits(comm, precision, allreduce, overlap):
    if overlap and allreduce != "mpi":
        pytest.skip("overlap needs the non-blocking MPI allreduce")
    expected, trainer, _ = train_both(comm, "mlp", np.float32, allreduce=allreduce, precision=precision,
                                      overlap=overlap, bucket_bytes=24)
    assert trainer.flat_params.dtype == np.float32
    assert on_all_ranks(comm, relative_error(trainer.flat_params, expected) <= 1e-2)
    assert comm.allreduce(trainer.replica_mismatches()) == 0
    # The gradient left by the exchange is a 16-bit number in every element.
    sixteen_bit = trainer.flat_grads.astype(np.float16).astype(np.float32) if precision == "float16" else \
        bfloat16_values(bfloat16_bits(trainer.flat_grads))
    assert on_all_ranks(comm, np.array_equal(sixteen_bit, trainer.flat_grads))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("precision", ["full", "float16", "bfloat16"])
def test_trains_on_digits_to_a_good_test_accuracy(comm, precision):
    images, labels = load_digits(flat=True)
    train_x, test_x, train_y, test_y = train_test_split(images, labels, test_fraction=0.25, seed=0)
    trainer = DataParallelTrainer(comm, mlp([64, 32, 10], seed=0), allreduce="mpi", overlap=True,
                                  bucket_bytes=2048, precision=precision)
    optimizer = SGD(trainer.parameters(), lr=0.1, momentum=0.9)
    before = accuracy(trainer.model, test_x, test_y)
    batch = 61
    for step in range(60):
        rows = (step * batch + np.arange(batch)) % len(train_x)
        mine = rows[shard(comm, batch)]
        trainer.train_step(optimizer, train_x[mine], train_y[mine], batch_size=batch)
    after = accuracy(trainer.model, test_x, test_y)
    assert comm.allreduce(trainer.replica_mismatches()) == 0
    assert on_all_ranks(comm, before < 0.3 and after >= 0.85)


@pytest.mark.mpi(min_size=1)
def test_rank_without_samples_and_global_batch_size_found_by_allreduce(comm):
    trainer = DataParallelTrainer(comm, tiny_mlp(0), allreduce="recursive_doubling", micro_batches=2)
    serial = tiny_mlp(0)
    x, y = batches((6,))[0]
    x, y = x[:1], y[:1]  # one sample: only rank 0 has data
    trainer.compute_gradients(x[shard(comm, 1)], y[shard(comm, 1)])
    _, dlogits = softmax_cross_entropy(serial.forward(x), y)
    serial.backward(dlogits)
    expected = np.concatenate([grad.ravel() for _, grad in serial.parameters()])
    assert on_all_ranks(comm, relative_error(trainer.flat_grads, expected) <= 1e-12)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [
    dict(allreduce="mpi", overlap=True, bucket_bytes=SMALL_BUCKET, micro_batches=2),
    dict(allreduce="ring", precision="bfloat16"),
    dict(allreduce="mpi", precision="bfloat16", compute="bfloat16", bucket_bytes=SMALL_BUCKET),
    dict(allreduce="recursive_doubling", compute="float16", micro_batches=3),
])
def test_device_trainer_takes_the_host_trainers_steps(comm, device_backend, options):
    """Every exchange on the simulated device (staged, the hand-written ones as a whole call) equals the host."""
    dtype = np.float32 if "compute" in options else np.float64
    host = DataParallelTrainer(comm, tiny_mlp(3, dtype), **options)
    device = DataParallelTrainer(device_backend.comm(comm), tiny_mlp(3, dtype).to(device_backend), **options)
    host_sgd, device_sgd = SGD(host.parameters(), 0.1, 0.9), SGD(device.parameters(), 0.1, 0.9)
    for x, y in batches((6,), dtype):
        mine = shard(comm, len(x))
        host.train_step(host_sgd, x[mine], y[mine], batch_size=len(x))
        device.train_step(device_sgd, device_backend.from_host(x[mine]), device_backend.from_host(y[mine]),
                          batch_size=len(x))
    assert on_all_ranks(comm, device_backend.is_device_array(device.flat_params) and
                        np.array_equal(device_backend.to_host(device.flat_params), host.flat_params))


def test_bfloat16_mpi_exchange_with_a_cuda_aware_mpi_is_an_input_error():
    """Its MPI op is Python code reading host memory: a CUDA-aware MPI would hand it device pointers."""
    from fake_device import FakeCupy
    from kernels.backend import Backend

    cuda_aware = Backend("cupy", FakeCupy(), device_buffers_to_mpi=True, empty_pinned=np.empty)
    comm = cuda_aware.comm(MPI.COMM_SELF)
    with pytest.raises(InputError, match="bfloat16"):
        DataParallelTrainer(comm, tiny_mlp(0).to(cuda_aware), precision="bfloat16")
    DataParallelTrainer(comm, tiny_mlp(0).to(cuda_aware), allreduce="ring", precision="bfloat16")
