"""The Dis-SMO iteration probe (svm/distributed/dis_smo_probe.py) of the svm model's calibration."""
import numpy as np
import pytest

from svm.distributed import dis_smo_probe
from svm.distributed.dis_smo_probe import RESTART, IterationProbe


def test_each_call_is_one_iteration_of_the_first_pass_computing_one_row():
    probe = IterationProbe(300, 8)
    first_pass, cache = list(probe.pairs), probe.solver.cache
    assert len(first_pass) == RESTART and len(set(first_pass)) > 1
    misses, kernel_seconds = cache.misses, probe.kernel.seconds
    seconds = [probe() for _ in range(RESTART + 3)]
    assert all(np.isfinite(t) and t > 0 for t in seconds)
    assert cache.misses == misses + RESTART + 3  # the row forgotten before each: one miss per iteration
    assert probe.kernel.seconds > kernel_seconds


def test_the_solve_restarts_and_repeats_its_pairs(monkeypatch):
    probe = IterationProbe(200, 5, seed=1)
    seen = []
    step = probe.solver.step
    monkeypatch.setattr(probe.solver, "step", lambda: seen.append(step()[2]))
    for _ in range(2 * RESTART):
        probe()
    assert seen == probe.pairs * 2


def test_a_solve_that_converges_before_restart_repeats_the_pairs_it_made(monkeypatch):
    monkeypatch.setattr(dis_smo_probe, "RESTART", 10_000)
    probe = IterationProbe(6, 2)  # six samples converge in a few iterations
    assert 0 < len(probe.pairs) < 100
    for _ in range(3 * len(probe.pairs)):
        assert probe() > 0
    assert probe.done == len(probe.pairs)


def test_a_solve_with_no_pair_to_repeat_is_refused():
    with pytest.raises(ValueError, match="converged before its first pair"):
        IterationProbe(1, 3)  # one sample: the KKT gap is zero at the start
