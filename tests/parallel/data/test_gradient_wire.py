"""bfloat16 rounding against an independent float64 reference, NaN and inf kept, through the exchange on any rank count."""
import numpy as np
import pytest
from mpi4py import MPI

from parallel.data.data_parallel import DataParallelTrainer, shard
from parallel.data.gradient_wire import bfloat16_bits, bfloat16_values, round_to_bfloat16
from parallel.data.mixed_precision import ComputeFormat
from parallel.nn.layers import Linear, ReLU, Sequential
from parallel.nn.optim import SGD

#: NaNs of every payload class, quiet and signalling, both signs; the last two lost to 0 / inf before.
NAN_WORDS = (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF, 0x7FC08000,
             0x7F808000)
SPECIAL_WORDS = {
    "+inf": (0x7F800000, 0x7F80), "-inf": (0xFF800000, 0xFF80), "+0": (0x00000000, 0x0000),
    "-0": (0x80000000, 0x8000),
    "smallest subnormal": (0x00000001, 0x0000), "subnormal just over half a step": (0x00008001, 0x0001),
    "subnormal tie to even (down)": (0x00008000, 0x0000), "subnormal tie to even (up)": (0x00018000, 0x0002),
    "largest subnormal": (0x007FFFFF, 0x0080), "negative subnormal": (0x80018000, 0x8002),
    "largest float32 overflows": (0x7F7FFFFF, 0x7F80), "-largest float32 overflows": (0xFF7FFFFF, 0xFF80),
    "largest bfloat16": (0x7F7F0000, 0x7F7F), "just under the overflow tie": (0x7F7F7FFF, 0x7F7F),
    "overflow tie rounds to inf": (0x7F7F8000, 0x7F80),
    "tie to even (down)": (0x3F808000, 0x3F80), "tie to even (up)": (0x3F818000, 0x3F82),
    "above the tie": (0x3F808001, 0x3F81), "below the tie": (0x3F807FFF, 0x3F80),
}


def as_float32(words):
    return np.array(words, dtype=np.uint32).view(np.float32)


def reference_bits(words):
    """bfloat16 upper halves of float32 ``words`` by float64 arithmetic: numbers rounded to 8 significant bits
    (``rint``: nearest, ties to even) on bfloat16's grid (exponents down to -126, subnormal step 2**-133),
    inf from 2**128 up; NaN as the quiet NaN of the upper half (sign and upper payload kept)."""
    words = np.asarray(words, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # widening a signalling NaN
        values = words.view(np.float32).astype(np.float64)
    finite = np.isfinite(values)
    _, exponent = np.frexp(np.where(finite, values, 1.0))
    step = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 7)
    with np.errstate(over="ignore"):
        rounded = np.where(finite, np.rint(values / step) * step, values).astype(np.float32)
    expected = (rounded.view(np.uint32) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    expected[nan] = (words[nan] >> 16).astype(np.uint16) | 0x0040
    return expected


def all_words():
    """The special words, every NaN class, and random words over every bit pattern."""
    random = np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([[word for word, _ in SPECIAL_WORDS.values()], NAN_WORDS, random]).astype(np.uint32)


@pytest.mark.parametrize("name", sorted(SPECIAL_WORDS))
def test_special_values_round_as_ieee_says(name):
    word, expected = SPECIAL_WORDS[name]
    assert reference_bits([word])[0] == expected
    assert bfloat16_bits(as_float32([word]))[0] == expected
    assert round_to_bfloat16(as_float32([word])).view(np.uint32)[0] == expected << 16


@pytest.mark.parametrize("word", NAN_WORDS, ids=hex)
def test_every_nan_stays_a_quiet_nan_of_its_sign(word):
    bits = bfloat16_bits(as_float32([word]))
    rounded = round_to_bfloat16(as_float32([word]))
    assert np.isnan(bfloat16_values(bits)[0]) and np.isnan(rounded[0])
    assert bits[0] & 0x0040 and bits[0] >> 15 == word >> 31
    assert rounded.view(np.uint32)[0] == int(bits[0]) << 16


def test_both_roundings_equal_the_float64_reference_on_every_bit_pattern():
    words = all_words()
    expected = reference_bits(words)
    np.testing.assert_array_equal(bfloat16_bits(as_float32(words)), expected)
    rounded = as_float32(words)
    assert round_to_bfloat16(rounded) is rounded
    np.testing.assert_array_equal(rounded.view(np.uint32), expected.astype(np.uint32) << 16)


def test_the_compute_format_keeps_nan_and_inf():
    values = as_float32([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7F800000, 0xFF800000])
    bfloat16 = ComputeFormat("bfloat16")
    out = np.empty_like(values)
    bfloat16.cast(values, out)
    for result in (bfloat16.input(values), bfloat16.round(values.copy()), out):
        assert np.isnan(result[:3]).all() and list(result[3:]) == [np.inf, -np.inf]
    source = values.copy()
    bfloat16.to_master(source, out)
    assert np.isnan(out[:3]).all() and list(out[3:]) == [np.inf, -np.inf]


def test_device_rounding_equals_the_host_and_stays_on_the_device(device_backend):
    words = all_words()
    expected = reference_bits(words)
    on_device = device_backend.from_host(as_float32(words))
    bits = bfloat16_bits(on_device)
    assert device_backend.is_device_array(bits)
    np.testing.assert_array_equal(device_backend.to_host(bits), expected)
    round_to_bfloat16(on_device)
    assert device_backend.is_device_array(on_device)
    np.testing.assert_array_equal(device_backend.to_host(on_device).view(np.uint32), expected.astype(np.uint32) << 16)


class PoisonedLinear(Linear):
    """A Linear layer whose first bias gradient is the float32 bit pattern ``word`` after every backward."""

    def __init__(self, *args, word=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.word = word

    def backward(self, dy):
        dx = super().backward(dy)
        if self.word is not None:
            self.grads["bias"].view(np.uint32)[0] = self.word
        return dx


def poisoned_mlp(word):
    return Sequential([Linear(6, 5, rng=0, dtype=np.float32), ReLU(),
                       PoisonedLinear(5, 4, rng=1, dtype=np.float32, word=word)])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("word", (0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000),
                         ids=hex)
@pytest.mark.parametrize("allreduce", ["mpi", "ring"])
@pytest.mark.parametrize("compute", ["full", "bfloat16"])
def test_a_nan_or_inf_gradient_on_one_rank_reaches_every_rank_and_the_step_is_skipped(comm, word, allreduce,
                                                                                     compute):
    """The last rank's NaN (or inf) crosses the bfloat16 exchange on every rank; mixed precision skips the step."""
    last = comm.rank == comm.size - 1
    trainer = DataParallelTrainer(comm, poisoned_mlp(word if last else None), allreduce=allreduce,
                                  precision="bfloat16", compute=compute, bucket_bytes=24)
    optimizer = SGD(trainer.parameters(), lr=0.1)
    before = trainer.flat_params.copy()
    x = np.random.default_rng(5).standard_normal((9, 6)).astype(np.float32)
    y = np.arange(9) % 4
    mine = shard(comm, len(x))
    trainer.train_step(optimizer, x[mine], y[mine], batch_size=len(x))
    bias = trainer.flat_grads[-4]
    reached = np.isnan(bias) if (word & 0x7FFFFFFF) > 0x7F800000 else bias == np.inf
    assert comm.allreduce(bool(reached), op=MPI.LAND)
    if compute == "bfloat16":
        assert comm.allreduce(trainer.step_skipped and np.array_equal(trainer.flat_params, before), op=MPI.LAND)
