"""`bench.families.layers` on device arrays: checks compare on the host, a timed pass waits for the device."""
import numpy as np
from mpi4py import MPI

from bench.families.layers import MeasuredState, count_wrong, run_forward_backward
from parallel.nn.layers import Linear


def test_count_wrong_takes_device_arrays(device_backend):
    expected = np.array([[1.0, 2.0], [3.0, 4.0]])
    actual = device_backend.from_host(np.array([[1.0, 2.5], [3.0, 4.0]]))
    assert count_wrong(actual, expected, 1e-6) == 1
    assert count_wrong(actual, device_backend.from_host(expected[:1]), 1e-6) == 4


def test_timed_pass_on_the_device_synchronises_and_keeps_results_there(device_backend, monkeypatch):
    calls = []
    monkeypatch.setattr(device_backend, "synchronize", lambda: calls.append(1))
    rng = np.random.default_rng(0)
    x, dy = (device_backend.from_host(rng.standard_normal(shape)) for shape in ((5, 3), (5, 2)))
    model = Linear(3, 2, rng=1, dtype=np.float64).to(device_backend)
    state = MeasuredState(MPI.COMM_SELF, "serial", "float64", 5, {}, model, x, dy, slice(1, 4),
                          backend=device_backend)
    run_forward_backward(state)  # the memory probe, untimed
    run_forward_backward(state)
    assert state.runs == 1 and calls and all(device_backend.is_device_array(array) for array in state.result)
    assert state.result[0].shape == (3, 2) and state.result[1].shape == (3, 3)
