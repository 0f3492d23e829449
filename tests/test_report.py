"""Reports: speedup, efficiency, fits, models, plots and bad input."""
import csv
import json

import pytest

from bench.csvio import COLUMNS, SCHEMA_VERSION, ResultsFile
from bench.report import scaling_table, serial_fractions, write_report
from kernels.errors import InputError

CALIB = {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_byte": 5e-11,
         "memcpy_bytes_per_s": 8e9, "gemm_flops_per_s": 3e10}


def point(variant, ranks, seconds, size=1024, scaling="strong", suite="allreduce"):
    return dict(suite=suite, benchmark=suite, variant=variant, backend="numpy", dtype="float64", ranks=ranks,
                nodes=1, threads=1, scaling=scaling, size=size, size_unit="bytes", iters=3, warmup=1,
                t_min_s=seconds, t_med_s=seconds, t_max_s=seconds, busbw_gbs=1.0, wrong=0, settings="{}")


def write_points(path, points):
    results = ResultsFile(str(path))
    for row in points:
        results.append(row)
    results.close()
    return str(path)


def amdahl_points(variant, serial_fraction, scaling="strong"):
    """Times of a program with the given serial fraction on 1, 2, 4 ranks (strong) or weak-scaled."""
    if scaling == "strong":
        return [point(variant, p, serial_fraction + (1 - serial_fraction) / p) for p in (1, 2, 4)]
    return [point(variant, p, p / (p - serial_fraction * (p - 1)), scaling="weak") for p in (1, 2, 4)]


def test_speedup_efficiency_karp_flatt_and_reference_ratio(tmp_path):
    rows = [{k: str(v) for k, v in r.items()} for r in amdahl_points("mpi", 0.1) + amdahl_points("ring", 0.2)]
    table = scaling_table(rows)
    ring4 = next(e for e in table if e["variant"] == "ring" and e["ranks"] == 4)
    assert ring4["speedup"] == pytest.approx(1 / (0.2 + 0.8 / 4))
    assert ring4["efficiency"] == pytest.approx(ring4["speedup"] / 4)
    assert ring4["karp_flatt"] == pytest.approx(0.2)
    assert ring4["vs_ref"] == pytest.approx((0.1 + 0.9 / 4) / (0.2 + 0.8 / 4))


@pytest.mark.parametrize("scaling, law", [("strong", "amdahl"), ("weak", "gustafson")])
def test_fits_recover_the_serial_fraction(scaling, law):
    rows = [{k: str(v) for k, v in r.items()} for r in amdahl_points("ring", 0.15, scaling)]
    (fit,) = serial_fractions(scaling_table(rows))
    assert fit["law"] == law and fit["serial_fraction"] == pytest.approx(0.15)


def test_report_files_model_and_projection(tmp_path):
    path = write_points(tmp_path / "a.csv", amdahl_points("mpi", 0.1) + amdahl_points("ring", 0.2))
    lines = write_report([path], str(tmp_path / "out"), CALIB, [64, 1024])
    assert any("model error" in line for line in lines)
    with open(tmp_path / "out" / "scaling.csv") as handle:
        table = list(csv.DictReader(handle))
    ring2 = next(r for r in table if r["variant"] == "ring" and r["ranks"] == "2")
    expected = 2 * 2e-6 + 1024 * 1e-10 + 512 * 5e-11  # 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    assert float(ring2["predicted_s"]) == pytest.approx(expected, rel=1e-5)
    with open(tmp_path / "out" / "projection.csv") as handle:
        projected = {(r["variant"], r["ranks"]) for r in csv.DictReader(handle)}
    assert ("ring", "1024") in projected and ("mpi", "64") in projected
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"summary.md", "fits.csv", "allreduce_strong_time.png", "allreduce_strong_efficiency.png"} <= names


def test_single_rank_count_is_said(tmp_path):
    path = write_points(tmp_path / "a.csv", [point("mpi", 2, 1e-3, size=s) for s in (8, 16)])
    lines = write_report([path], str(tmp_path / "out"), plots=False)
    assert any("only one rank count (2)" in line for line in lines)


def test_missing_columns_and_mixed_schemas_are_refused(tmp_path):
    broken = tmp_path / "broken.csv"
    broken.write_text("suite,variant\nallreduce,mpi\n")
    with pytest.raises(InputError, match="missing column"):
        write_report([str(broken)], str(tmp_path / "out"))
    first = write_points(tmp_path / "one.csv", [point("mpi", 1, 1e-3)])
    rows = list(csv.DictReader(open(first)))
    rows[0]["schema"] = str(SCHEMA_VERSION + 1)
    other = tmp_path / "two.csv"
    with open(other, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(InputError, match=f"mixed schema versions {SCHEMA_VERSION}, {SCHEMA_VERSION + 1}"):
        write_report([first, str(other)], str(tmp_path / "out"))


def test_calibration_must_be_complete(tmp_path):
    from bench.model import load_calibration

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"alpha_s": 1e-6}))
    with pytest.raises(InputError, match="missing 'beta_s_per_byte'"):
        load_calibration(str(path))
