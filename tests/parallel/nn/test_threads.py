"""The layers' and optimisers' host threads: the parts, the BLAS limit meanwhile, and the same numbers on
1, 2 and 3 threads (uneven parts, more threads than images)."""
import itertools
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from mpitools import combination
from parallel.nn import threads as layer_threads
from parallel.nn.layers import Linear, softmax_cross_entropy
from parallel.nn.threads import host_threads, split_over_threads
from parallel.nn.models import flat_storage, keras_cnn, mnist_cnn, train_step
from parallel.nn.optim import SGD, Adam


def blas_threads():
    return max(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas")


def test_split_over_threads_runs_every_part_once_with_one_blas_thread_each():
    seen = []

    def task(part, start, stop):
        seen.append((part, start, stop, blas_threads(), threading.current_thread() is threading.main_thread()))
        return part

    with threadpool_limits(limits=2):
        assert split_over_threads(5, task, 3) == [0, 1, 2]
        assert blas_threads() == 2
    assert sorted(item[:3] for item in seen) == [(0, 0, 2), (1, 2, 4), (2, 4, 5)]
    assert all(item[3] == 1 for item in seen) and [item[4] for item in sorted(seen)] == [True, False, False]
    assert split_over_threads(1, lambda part, start, stop: (start, stop), 4) == [(0, 1)]
    assert split_over_threads(0, lambda part, start, stop: (start, stop), 4) == [(0, 0)]


def test_split_over_threads_raises_a_part_error_after_every_part_ended():
    ended = threading.Event()

    def task(part, start, stop):
        if part == 0:
            raise ValueError("part 0")
        ended.wait(0.05)
        ended.set()

    with threadpool_limits(limits=2), pytest.raises(ValueError, match="part 0"):
        split_over_threads(2, task, 2)
    assert ended.is_set()


def test_host_threads_reads_the_blas_limit_and_small_work_makes_fewer_parts():
    x = np.zeros(3)
    with threadpool_limits(limits=1):
        assert host_threads(x) == 1
    with threadpool_limits(limits=3):
        assert host_threads(x) == 3
        parts = lambda work: len(split_over_threads(8, lambda *part: blas_threads(), 3, work))  # noqa: E731
        assert [parts(work * layer_threads.WORK_PER_THREAD) for work in (0, 1, 2, 3, 9)] == [1, 1, 2, 3, 3]
        assert split_over_threads(8, lambda *part: blas_threads(), 3, 0, blas=True) == [1]    # BLAS limited still
        assert split_over_threads(8, lambda *part: blas_threads(), 3, 0) == [3]


def trained(build, optimiser, threads, x, y, steps=2):
    model = build()
    pairs = [flat_storage(model)]
    optimizer = optimiser(pairs)
    with threadpool_limits(limits=threads):
        losses = [train_step(model, softmax_cross_entropy, optimizer, x, y) for _ in range(steps)]
    return losses, pairs[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_training_steps_give_the_same_numbers_on_any_thread_count(monkeypatch, dtype):
    """Uneven parts (batch 5 on 2 and 3 threads, a batch of 1 on 3), several chunks per part, vectors
    split by the optimisers, ReLU and pooling split (small thresholds)."""
    monkeypatch.setattr(layer_threads, "WORK_PER_THREAD", 64)
    monkeypatch.setattr("parallel.nn.conv.CHUNK_ELEMENTS", 5000)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    for name, build in {"cnn": mnist_cnn, "keras_cnn": keras_cnn}.items():
        for optimiser in (lambda pairs: SGD(pairs, lr=0.05, momentum=0.9, weight_decay=1e-3),
                          lambda pairs: Adam(pairs, lr=1e-3, weight_decay=1e-3)):
            for batch in (5, 1):
                rng = np.random.default_rng(batch)
                x, y = rng.standard_normal((batch, 1, 28, 28)).astype(dtype), rng.integers(0, 10, batch)
                build_typed = lambda: build(seed=2, dtype=dtype)  # noqa: E731
                reference_losses, (reference, reference_grads) = trained(build_typed, optimiser, 1, x, y)
                for threads in (2, 3):
                    with combination(name, batch, threads, optimiser):
                        losses, (params, grads) = trained(build_typed, optimiser, threads, x, y)
                        np.testing.assert_allclose(losses, reference_losses, rtol=rtol)
                        np.testing.assert_allclose(params, reference, rtol=rtol, atol=rtol * abs(reference).max())
                        np.testing.assert_allclose(grads, reference_grads, rtol=rtol,
                                                   atol=rtol * abs(reference_grads).max())


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 37])
def test_linear_writes_every_gradient_on_any_thread_count(monkeypatch, rows):
    """Whole or split over the host threads (``host_split``): also for no rows (dW = 0) and more threads than rows;
    stale gradients never survive."""
    monkeypatch.setattr(layer_threads, "WORK_PER_THREAD", 4)
    rng = np.random.default_rng(rows)
    for threads, host_split in itertools.product((1, 2, 3), (False, True)):
        with threadpool_limits(threads):
            layer = Linear(7, 5, rng=1, dtype=np.float64, host_split=host_split)
            for grad in layer.grads.values():
                grad[...] = np.nan
            x, dy = rng.random((rows, 7)), rng.random((rows, 5))
            layer.forward(x)
            dx = layer.backward(dy)
            np.testing.assert_allclose(layer.grads["weight"], x.T @ dy, atol=1e-12)
            np.testing.assert_allclose(layer.grads["bias"], dy.sum(axis=0), atol=1e-12)
            np.testing.assert_allclose(dx, dy @ layer.params["weight"].T, atol=1e-12)
