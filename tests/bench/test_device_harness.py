"""The harness on a device backend: variants a backend cannot run, warm-up, device provenance and peak memory."""
import json

import pytest

import bench.sweep
from bench.csvio import read_rows
from bench.faults import AgreedInputError
from bench.point import DEVICE_WARMUP
from bench.sweep import SweepConfig, plan_points, run_sweep
from kernels.backend import get_backend
from kernels.errors import InputError
from tests.fake_cases import TinyCase


class DeviceVariants(TinyCase):
    """One variant for every backend, one host-only, one device-only; records what the harness did."""

    variants = ("anywhere", "host_only", "device_only")
    host_only_variants = {"host_only": "a host library on purpose"}
    device_only_variants = {"device_only": "a device library on purpose"}

    def __init__(self, settings=None):
        super().__init__(settings)
        self.pool_at_setup, self.runs = [], 0

    def setup(self, comm, size, variant, backend, dtype):
        if backend.name != "numpy" and hasattr(backend.xp, "pool"):  # the simulated pool: freed before set-up
            self.pool_at_setup.append(backend.xp.pool.freed)
            backend.xp.pool.held = 1000 * (comm.rank + 1)  # the point's arrays, more on higher ranks
        return comm

    def run(self, comm):
        self.runs += 1
        super().run(comm)


def params_of(row):
    return json.loads(row["params"])


def sweep(comm, backend, monkeypatch, tmp_path, variants, named=False, warmup=0):
    """Run `run_sweep` on ``backend`` (given to the harness as if `get_backend` made it); return
    (the case, the sweep's result, the CSV rows on every rank)."""
    monkeypatch.setattr(bench.sweep, "get_backend", lambda name, comm: backend)
    path = comm.bcast(str(tmp_path / "fake.csv"), root=0)
    config = SweepConfig(suite="fake", variants=list(variants), sizes=[4], ranks=[comm.size], csv_path=path,
                         iters=2, warmup=warmup, backend=backend.name, dtype="float64", variants_named=named)
    case = DeviceVariants()
    result = run_sweep(comm, case, config, emit=lambda row: None)
    rows = comm.bcast([row for _, row in read_rows(path)] if comm.rank == 0 else None, root=0)
    return case, result, rows


@pytest.mark.mpi(min_size=1)
def test_a_device_sweep_skips_host_only_variants_and_records_the_device(comm, device_backend, monkeypatch, tmp_path):
    case, result, rows = sweep(comm, device_backend, monkeypatch, tmp_path, DeviceVariants.variants)
    assert [row["variant"] for row in rows] == ["anywhere", "device_only"]
    assert "host_only skipped on cupy: a host library on purpose" in result.skipped
    assert all("CuPy" in row["device"] and "CUDA" in row["device"] for row in rows)
    assert {row["warmup"] for row in rows} == {str(DEVICE_WARMUP)}  # --warmup 0 raised on a device
    assert case.runs >= 2 * (DEVICE_WARMUP + 2)
    peaks = [params_of(row)["device_peak_bytes"] for row in rows]
    assert all(isinstance(peak, int) and peak >= 0 for peak in peaks)
    if hasattr(device_backend.xp, "pool"):  # simulated: the pool was emptied before each set-up
        assert case.pool_at_setup == [1, 2]
        assert peaks == [1000 * comm.size] * 2  # the busiest rank's high-water mark
        assert {row["device"] for row in rows} == {"Simulated GPU (CuPy 0.0-simulated, CUDA 12.4)"}


@pytest.mark.mpi(min_size=1)
def test_a_host_sweep_skips_device_only_variants_and_records_no_device(comm, monkeypatch, tmp_path):
    _, result, rows = sweep(comm, get_backend("numpy"), monkeypatch, tmp_path, DeviceVariants.variants, warmup=0)
    assert [row["variant"] for row in rows] == ["anywhere", "host_only"]
    assert "device_only skipped on numpy: a device library on purpose" in result.skipped
    assert {row["device"] for row in rows} == {""} and {row["warmup"] for row in rows} == {"0"}
    assert all("device_peak_bytes" not in params_of(row) for row in rows)


@pytest.mark.mpi(min_size=1)
def test_a_named_variant_the_backend_cannot_run_is_refused_on_every_rank(comm, device_backend, monkeypatch,
                                                                          tmp_path):
    with pytest.raises(AgreedInputError) as raised:
        sweep(comm, device_backend, monkeypatch, tmp_path, ["anywhere", "host_only"], named=True)
    assert str(raised.value) == "variant 'host_only' cannot run on cupy: a host library on purpose"


def test_a_suite_is_refused_on_a_backend_it_does_not_declare():
    class HostOnly(DeviceVariants):
        backends = ("numpy",)

    config = SweepConfig(suite="fake", variants=["anywhere"], sizes=[4], ranks=[1], csv_path="unused.csv",
                         backend="cupy", dtype="float64")
    with pytest.raises(InputError, match="suite 'fake' runs on backend numpy, not 'cupy'"):
        plan_points(HostOnly(), config)
