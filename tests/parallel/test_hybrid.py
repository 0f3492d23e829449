"""Hybrid dp x tp x pp training against serial training, on every grid that fits the job."""
import numpy as np
import pytest

from kernels.errors import InputError
from parallel.hybrid import HybridTrainer, check_grid, serial_model
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import train_step
from parallel.nn.optim import SGD
from tests.mpitools import all_ranks

HIDDEN, FFN, BLOCKS = 5, 7, 4  # 7 does not split evenly over 2, 3 or 4 tensor ranks
BATCH, MICRO_BATCHES = 36, 3  # replicas of 36, 18, 12 or 9 samples: 3 micro-batches each
GRIDS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (3, 1, 1), (1, 3, 1), (1, 1, 3), (2, 2, 1), (2, 1, 2),
         (1, 2, 2), (4, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 2)]


def batches():
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((BATCH, HIDDEN)), rng.integers(0, HIDDEN, BATCH)) for _ in range(2)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("grid", GRIDS, ids=lambda grid: "x".join(map(str, grid)))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_training_steps_equal_serial_training(comm, grid, schedule):
    if np.prod(grid) != comm.size:
        pytest.skip(f"a {grid} grid needs {np.prod(grid)} ranks")
    dp, tp, pp = grid
    trainer = HybridTrainer(comm, dp, tp, pp, HIDDEN, FFN, BLOCKS, MICRO_BATCHES, schedule, seed=3,
                            dtype=np.float64)
    optimizer = SGD(trainer.parameters(), lr=0.1, momentum=0.9)
    serial = serial_model(HIDDEN, FFN, BLOCKS, seed=3, dtype=np.float64)
    serial_optimizer = SGD(serial.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches():
        serial_loss = train_step(serial, softmax_cross_entropy, serial_optimizer, x, y)
        loss = comm.allreduce(trainer.train_step(optimizer, x, y))
        assert loss == pytest.approx(serial_loss, rel=1e-12)
        mine = trainer.parameters()
        grads_match = all(np.allclose(got, want, rtol=1e-11, atol=1e-13)
                          for (_, got), want in zip(mine, trainer.shard_of(serial, "grads")))
        weights_match = all(np.allclose(got, want, rtol=1e-11, atol=1e-13)
                            for (got, _), want in zip(mine, trainer.shard_of(serial)))
        assert all_ranks(comm, grads_match and weights_match)
    assert all_ranks(comm, len(trainer.blocks) in (BLOCKS // pp, BLOCKS // pp + 1))
    trainer.free()


@pytest.mark.mpi(min_size=1)
def test_the_blocks_tensor_allreduce_by_a_hand_written_family_trains_as_serial(comm):
    """Every rank in the tensor axis (and, on 4 ranks, a 2 x 2 dp x tp grid too), each hand-written family."""
    grids = [(1, comm.size, 1)] + ([(2, 2, 1)] if comm.size == 4 else [])
    for grid, collectives in ((grid, family) for grid in grids for family in ("ring", "recursive", "auto")):
        trainer = HybridTrainer(comm, *grid, HIDDEN, FFN, BLOCKS, MICRO_BATCHES, seed=3, dtype=np.float64,
                                collectives=collectives)
        optimizer = SGD(trainer.parameters(), lr=0.1)
        serial = serial_model(HIDDEN, FFN, BLOCKS, seed=3, dtype=np.float64)
        serial_optimizer = SGD(serial.parameters(), lr=0.1)
        for x, y in batches():
            serial_loss = train_step(serial, softmax_cross_entropy, serial_optimizer, x, y)
            assert comm.allreduce(trainer.train_step(optimizer, x, y)) == pytest.approx(serial_loss, rel=1e-12)
        weights_match = all(np.allclose(got, want, rtol=1e-11, atol=1e-13)
                            for (got, _), want in zip(trainer.parameters(), trainer.shard_of(serial)))
        assert all_ranks(comm, weights_match), (grid, collectives)
        trainer.free()
    with pytest.raises(InputError, match="bruck"):
        HybridTrainer(comm, 1, comm.size, 1, HIDDEN, FFN, BLOCKS, collectives="bruck")


@pytest.mark.mpi(min_size=1)
def test_grids_that_do_not_match_the_job_are_input_errors(comm):
    p = comm.size
    with pytest.raises(InputError, match=f"needs {p + 1} ranks, not {p}"):
        HybridTrainer(comm, p + 1, 1, 1, HIDDEN, FFN, BLOCKS)
    with pytest.raises(InputError, match="need blocks >= pp"):
        check_grid(8, 1, 1, 8, HIDDEN, FFN, BLOCKS)
    with pytest.raises(InputError, match="need blocks >= pp and ffn >= tp"):
        check_grid(8, 1, 8, 1, HIDDEN, FFN, BLOCKS)


@pytest.mark.mpi(min_size=1)
def test_replica_shards_must_split_into_micro_batches(comm):
    trainer = HybridTrainer(comm, comm.size, 1, 1, HIDDEN, FFN, BLOCKS, micro_batches=2)
    x, y = batches()[0]
    n = 2 * comm.size + 1  # one replica gets an odd shard
    with pytest.raises(InputError, match=f"a global batch of {n} samples gives the {comm.size} replicas"):
        trainer.compute_gradients(x[:n], y[:n])
    trainer.free()
