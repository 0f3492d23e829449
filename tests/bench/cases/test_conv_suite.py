"""The ``conv`` suite: end to end through the command line, and its check catching wrong results."""
import json

import numpy as np
import pytest
from mpi4py import MPI

from bench.cases.conv import HaloConv, hashed_values
from kernels.backend import get_backend
from kernels.errors import InputError
from tests.bench.flops_rows import assert_rates
from tests.clitools import mlscale, rows_of

SUITE = "bench.cases.conv:HaloConv"


def test_weak_sweep_of_every_variant_is_valid(tmp_path):
    path = str(tmp_path / "conv.csv")
    status, _, err = mlscale("sweep", SUITE, "--np", "2", "--ranks", "1,2", "--sizes", "9", "--scaling", "weak",
                             "--iters", "2", "--warmup", "1", "--dtype", "float64", "--csv", path,
                             MLSCALE_CONV_CHANNELS="3", MLSCALE_CONV_KERNEL="5", MLSCALE_CONV_BATCH="2")
    assert status == 0, err
    rows = rows_of(path)
    assert sorted((row["variant"], row["ranks"]) for row in rows) == sorted(
        (variant, ranks) for variant in HaloConv.variants for ranks in ("1", "2"))
    assert {row["wrong"] for row in rows} == {"0"} and {row["metric"] for row in rows} == {"halo_share"}
    for row in rows:
        params = json.loads(row["params"])
        assert params["problem_size"] == (9 if row["ranks"] == "1" else 13)  # round(9 * sqrt(2))
        assert params["grid"] == ("1x1" if row["ranks"] == "1" else "2x1")
        assert (params["channels"], params["kernel"], params["batch"]) == (3, 5, 2)
        assert params["overlap"] == row["variant"].endswith("_overlap") and params["packing"] == "packed"
        # 2x1 grid of a 13x13 image: rank 0 gets 2 rows of 13 pixels, 3 channels, 2 images, 8 bytes each
        assert params["halo_bytes_per_rank"] == (0 if row["ranks"] == "1" else 2 * 13 * 3 * 2 * 8)
        assert 0 <= float(row["metric_value"]) <= 1
        # 2 images of side**2 outputs, a 3 -> 3 channel 5 x 5 kernel: 2 m k n forward, twice that backward
        passes = 3 if row["variant"].startswith("forward_backward") else 1
        assert_rates(row, passes * 2 * (2 * params["problem_size"] ** 2) * (3 * 25) * 3, int(row["ranks"]))


def test_strong_sweep_with_subarray_packing_in_float32(tmp_path):
    path = str(tmp_path / "conv.csv")
    status, _, err = mlscale("sweep", SUITE, "--np", "3", "--ranks", "3", "--sizes", "10", "--variants",
                             "forward_backward_overlap", "--iters", "1", "--warmup", "0", "--csv", path,
                             MLSCALE_CONV_PACKING="subarray", MLSCALE_CONV_CHANNELS="2")
    assert status == 0, err
    (row,) = rows_of(path)
    assert row["wrong"] == "0" and row["dtype"] == "float32"
    assert json.loads(row["params"])["packing"] == "subarray" and json.loads(row["params"])["grid"] == "3x1"


@pytest.mark.parametrize("variable, value", [("MLSCALE_CONV_KERNEL", "4"), ("MLSCALE_CONV_PACKING", "zip"),
                                             ("MLSCALE_CONV_CHANNELS", "0")])
def test_bad_settings_are_input_errors(tmp_path, variable, value):
    status, _, err = mlscale("run", SUITE, "--sizes", "8", "--csv", str(tmp_path / "c.csv"),
                             **{variable: value})
    assert status == 2 and variable in err


def test_image_too_small_for_the_grid_is_an_input_error(tmp_path):
    status, _, err = mlscale("sweep", SUITE, "--np", "3", "--ranks", "3", "--sizes", "2", "--csv",
                             str(tmp_path / "c.csv"))
    assert status == 2 and "cannot be split" in err


def test_hashed_windows_are_slices_of_the_whole_tensor():
    shape = (2, 3, 7, 6)
    whole = hashed_values(1, shape, (0, 7), (0, 6), "float64")
    assert np.all(np.abs(whole) <= 0.5) and len(np.unique(whole)) == whole.size
    window = hashed_values(1, shape, (-2, 4), (3, 9), "float64")
    assert np.array_equal(window[:, :, 2:, :3], whole[:, :, :4, 3:])
    assert not window[:, :, :2].any() and not window[:, :, :, 3:].any()
    assert not np.array_equal(hashed_values(2, shape, (0, 7), (0, 6), "float64"), whole)


@pytest.mark.parametrize("size, variant", [(12, "forward_backward"), (520, "forward"),
                                           (520, "forward_backward_overlap")])
def test_check_counts_a_corrupted_output(monkeypatch, size, variant):
    """The full check (small image) and the corner check (large image) both see a wrong element."""
    monkeypatch.setenv("MLSCALE_CONV_CHANNELS", "1")
    case = HaloConv()
    state = case.setup(MPI.COMM_SELF, size, variant, get_backend("numpy"), "float64")
    case.run(state)
    assert case.check(state) == 0
    state.y[0, 0, 2, -3] += 1e-3
    assert case.check(state) == 1
    if state.backward:
        state.dx[0, 0, -1, 1] -= 1e-3
        assert case.check(state) == 2
    case.teardown(state)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", HaloConv.variants)
def test_every_variant_runs_and_checks_on_the_device(comm, monkeypatch, device_backend, variant, dtype):
    """Setup, run, check on device arrays (uneven tiles: 11 pixels over the grid); results stay on the device."""
    monkeypatch.setenv("MLSCALE_CONV_CHANNELS", "2")
    monkeypatch.setenv("MLSCALE_CONV_BATCH", "2")
    case = HaloConv()
    state = case.setup(comm, 11, variant, device_backend, dtype)
    case.run(state)
    case.run(state)
    outputs = [state.y] + ([state.dx] if state.backward else [])
    on_device = all(device_backend.is_device_array(array) for array in outputs)
    assert comm.allreduce(case.check(state)) == 0 and comm.allreduce(int(on_device)) == comm.size
    case.teardown(state)


@pytest.mark.mpi(min_size=1)
def test_subarray_packing_on_a_staging_device_is_an_input_error(comm, monkeypatch, device_backend):
    if device_backend.device_buffers_to_mpi:
        pytest.skip("a CUDA-aware MPI takes subarray datatypes on device buffers")
    monkeypatch.setenv("MLSCALE_CONV_PACKING", "subarray")
    with pytest.raises(InputError, match="CUDA-aware"):
        HaloConv().setup(comm, 11, "forward", device_backend, "float64")
