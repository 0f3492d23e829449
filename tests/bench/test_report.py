"""Reports: speedup, efficiency, fits, models, plots and bad input."""
import csv
import json

import pytest

from bench.csvio import COLUMNS, SCHEMA_VERSION
from bench.models import get_model
from bench.models.base import MAX_PROJECTED_RANKS
from bench.report.output import write_report
from bench.report.scaling import scaling_table, serial_fractions
from kernels.errors import InputError
from tests.bench.report_rows import CALIB, amdahl_points, as_read, point, write_points
from tests.clitools import mlscale, rows_of

def test_speedup_efficiency_karp_flatt_and_reference_ratio(tmp_path):
    rows = as_read(amdahl_points("numpy", 0.1) + amdahl_points("rows", 0.2))
    table = scaling_table(rows)
    rows4 = next(e for e in table if e["variant"] == "rows" and e["ranks"] == 4)
    assert rows4["kind"] == "compute"
    assert rows4["speedup"] == pytest.approx(1 / (0.2 + 0.8 / 4))
    assert rows4["efficiency"] == pytest.approx(rows4["speedup"] / 4)
    assert rows4["karp_flatt"] == pytest.approx(0.2)
    assert rows4["vs_ref"] == pytest.approx((0.1 + 0.9 / 4) / (0.2 + 0.8 / 4))


def test_on_a_gpu_the_reference_is_the_device_library_variant():
    # gemm's numpy variant is host-only: on cupy rows the reference is cupy (cuBLAS on one GPU)
    rows = as_read([dict(r, suite="gemm", benchmark="gemm", backend=backend)
                    for backend in ("numpy", "cupy")
                    for r in amdahl_points(backend, 0.1) + amdahl_points("summa", 0.2)])
    table = scaling_table(rows)
    for backend in ("numpy", "cupy"):
        summa = next(e for e in table if (e["variant"], e["backend"], e["ranks"]) == ("summa", backend, 2))
        assert summa["vs_ref"] == pytest.approx((0.1 + 0.9 / 2) / (0.2 + 0.8 / 2))


@pytest.mark.parametrize("scaling, law", [("strong", "amdahl"), ("weak", "gustafson")])
def test_fits_recover_the_serial_fraction(scaling, law):
    rows = as_read(amdahl_points("rows", 0.15, scaling))
    (fit,) = serial_fractions(scaling_table(rows))
    assert fit["law"] == law and fit["serial_fraction"] == pytest.approx(0.15)


def test_report_files_model_and_projection_of_a_compute_suite(tmp_path):
    path = write_points(tmp_path / "a.csv", amdahl_points("numpy", 0.1) + amdahl_points("rows", 0.2))
    lines, _ = write_report([path], str(tmp_path / "out"), CALIB, [64, 1024])
    assert any("model error" in line for line in lines)
    model = get_model("gemv")
    with open(tmp_path / "out" / "scaling.csv") as handle:
        rows2 = next(r for r in csv.DictReader(handle) if r["variant"] == "rows" and r["ranks"] == "2")
    assert float(rows2["predicted_s"]) == pytest.approx(model.predict("rows", 1024, 2, CALIB), rel=1e-5)
    with open(tmp_path / "out" / "projection.csv") as handle:
        projected = {(r["variant"], r["ranks"]) for r in csv.DictReader(handle)}
    assert ("rows", "1024") in projected and ("rows", "64") in projected
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"summary.md", "fits.csv", "gemv_strong_time.png", "gemv_strong_efficiency.png"} <= names


def test_a_communication_suite_has_a_model_but_no_speedup_fits_projection_or_efficiency_plot(tmp_path):
    points = [point(v, p, t * (1 + 0.1 * p), size=s, suite="allreduce")
              for v, t in (("mpi", 1e-4), ("ring", 2e-4)) for p in (1, 2, 4) for s in (1024, 4096)]
    path = write_points(tmp_path / "a.csv", points)
    write_report([path], str(tmp_path / "out"), CALIB, [64, 1024])
    with open(tmp_path / "out" / "scaling.csv") as handle:
        table = list(csv.DictReader(handle))
    ring2 = next(r for r in table if r["variant"] == "ring" and r["ranks"] == "2" and r["size"] == "1024")
    # the run's call, the algorithm's, then an exchange each phase and a reduction of n / 2 (ring, p = 2)
    expected = 2e-7 + 2 * (1e-7 + 2e-6 + 512 * 1e-10) + 512 * 5e-11
    assert float(ring2["predicted_s"]) == pytest.approx(expected, rel=1e-5)
    assert {r["speedup"] for r in table} == {r["efficiency"] for r in table} == {r["karp_flatt"] for r in table} == {""}
    assert float(ring2["vs_ref"]) == pytest.approx(0.5)
    assert len(rows_of(str(tmp_path / "out" / "fits.csv"))) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert "projection.csv" not in names and "allreduce_bandwidth.png" in names
    assert not any("efficiency" in name or "time" in name for name in names)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "speedup" not in summary.lower() and "Karp-Flatt" not in summary


def test_single_rank_count_is_said(tmp_path):
    path = write_points(tmp_path / "a.csv", [point("mpi", 2, 1e-3, size=s) for s in (8, 16)])
    lines, _ = write_report([path], str(tmp_path / "out"), plots=False)
    assert any("only one rank count (2)" in line for line in lines)


def test_missing_columns_are_refused(tmp_path):
    broken = tmp_path / "broken.csv"
    broken.write_text("suite,variant\nallreduce,mpi\n")
    with pytest.raises(InputError, match="missing column"):
        write_report([str(broken)], str(tmp_path / "out"))


def with_raw_lines(path, lines):
    with open(path, "a") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path


def bad_lines(path):
    """One line of each kind of bad row, made from the last good row of ``path``."""
    good = list(csv.reader(open(path)))[-1]
    index = {column: i for i, column in enumerate(COLUMNS)}

    def changed(column, value):
        return ",".join(value if i == index[column] else cell for i, cell in enumerate(good))

    return [changed("t_med_s", "nan"), changed("t_med_s", "0"), changed("t_med_s", "-1e-3"),
            changed("variant", ""), ",".join(good[:9]), changed("schema", str(SCHEMA_VERSION + 1)),
            changed("ranks", "two")]


def test_bad_rows_are_skipped_with_one_warning_and_enter_no_fit(tmp_path):
    clean = write_points(tmp_path / "clean.csv", amdahl_points("ring", 0.2))
    write_report([clean], str(tmp_path / "clean"), plots=False)
    dirty = write_points(tmp_path / "dirty.csv", amdahl_points("ring", 0.2))
    lines, _ = write_report([with_raw_lines(dirty, bad_lines(dirty))], str(tmp_path / "dirty"), plots=False)
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [f"report: warning: skipped 7 invalid rows of 10 (first: {dirty} line 5: "
                        "t_med_s 'nan' is not a time > 0)"]
    for name in ("scaling.csv", "fits.csv"):
        assert (tmp_path / "dirty" / name).read_text() == (tmp_path / "clean" / name).read_text()


def test_a_file_of_bad_rows_only_is_refused_with_the_reason(tmp_path):
    path = write_points(tmp_path / "a.csv", [point("mpi", 1, 1e-3)])
    rows = list(csv.DictReader(open(path)))
    rows[0]["schema"] = str(SCHEMA_VERSION + 1)
    other = tmp_path / "two.csv"
    with open(other, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(InputError, match=f"no measured points in {other}: all 1 rows are invalid "
                                         f".first: {other} line 2: schema '{SCHEMA_VERSION + 1}', not 2"):
        write_report([str(other)], str(tmp_path / "out"))
    lines, _ = write_report([path, str(other)], str(tmp_path / "out"), plots=False)
    assert "report: warning: skipped 1 invalid row of 2" in "\n".join(lines)


def test_out_must_not_be_an_existing_file(tmp_path):
    path = write_points(tmp_path / "a.csv", [point("mpi", 1, 1e-3)])
    out = tmp_path / "taken"
    out.write_text("mine")
    with pytest.raises(InputError, match=f"--out {out} is an existing file"):
        write_report([path], str(out))
    assert out.read_text() == "mine"


def test_a_non_utf8_csv_is_refused_naming_it(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"suite,\xff\n")
    with pytest.raises(InputError, match=f"{path} is not UTF-8 text"):
        write_report([str(path)], str(tmp_path / "out"))


def test_calibration_must_be_complete(tmp_path):
    from bench.report.model import load_calibration

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"alpha_s": 1e-6}))
    with pytest.raises(InputError, match="missing 'beta_s_per_byte'"):
        load_calibration(str(path))


THIN = dict(gemm_thin={"float64": [[1e9, 2e9], [2e9, 4e9]]}, thin_rows=[8, 32], thin_side=1024)


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "not an mlscale calibration .a JSON object"),
    ('"calib"', "not an mlscale calibration .a JSON object"),
    ("42", "not an mlscale calibration .a JSON object"),
    ("{", "cannot read calibration"),
    (json.dumps(dict(CALIB, alpha_s=0)), "alpha_s must be a number > 0, got 0"),
    (json.dumps(dict(CALIB, beta_s_per_byte=-1e-10)), "beta_s_per_byte must be a number > 0"),
    (json.dumps(dict(CALIB, gamma_s_per_byte="fast")), 'gamma_s_per_byte must be a number > 0, got "fast"'),
    (json.dumps(dict(CALIB, gemm_flops_per_s=True)), "gemm_flops_per_s must be a number > 0, got true"),
    (json.dumps(dict(CALIB, memcpy_bytes_per_s=None)), "memcpy_bytes_per_s must be a number > 0, got null"),
    (json.dumps(dict(CALIB, alpha_s=float("nan"))), "alpha_s must be a number > 0, got NaN"),
    (json.dumps(dict(CALIB, kernel_rows=[1e7, 0])), "kernel_rows must be a number > 0, got 0"),
    (json.dumps(dict(CALIB, kernel_rows=[])), r"kernel_rows must be a number > 0, got \[\]"),
    (json.dumps(dict(CALIB, pingpong=[["8", "1e-6"]])), 'pingpong must hold numbers only, got "8"'),
    (json.dumps(dict(CALIB, gemm={"float64": [["fast"] * 6]})), 'gemm must hold numbers only, got "fast"'),
    (json.dumps(dict(CALIB, dp_step={"float64": [[32, []]]})), r"dp_step must hold numbers only, got \[\]"),
    (json.dumps(dict(CALIB, copy=[[8, True]])), "copy must hold numbers only, got true"),
    (json.dumps(dict(CALIB, busy=dict(CALIB, threads=1, reduce=[[8, "slow"]]))),
     'busy.reduce must hold numbers only, got "slow"'),
    (json.dumps(dict(CALIB, **dict(THIN, thin_side=0))), "thin_side must be a number > 0, got 0"),
    (json.dumps(dict(CALIB, **dict(THIN, thin_rows=[]))), "thin_rows must be a non-empty table"),
    (json.dumps(dict(CALIB, **THIN, busy=dict(CALIB, threads=1, gemm_thin={"float64": [None]}))),
     "busy.gemm_thin must hold numbers only, got null"),
    (json.dumps(dict(CALIB, gemm_thin=THIN["gemm_thin"])), "gemm_thin needs thin_side beside it"),
])
def test_a_malformed_calibration_is_refused_naming_it(tmp_path, content, message):
    """Also the thin products' tables, optional (older files lack them) but whole and numeric when present."""
    from bench.report.model import load_calibration

    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as error:
        load_calibration(str(path))
    assert str(path) in str(error.value)


# -- the command line ------------------------------------------------------------------------------

def test_report_command_skips_bad_rows_with_one_warning_line(tmp_path):
    path = write_points(tmp_path / "a.csv", amdahl_points("ring", 0.2))
    with_raw_lines(path, bad_lines(path))
    status, out, err = mlscale("report", path, "--out", str(tmp_path / "out"), "--no-plots")
    assert status == 0, err
    assert [line for line in err.splitlines() if "warning" in line] == [
        f"report: warning: skipped 7 invalid rows of 10 (first: {path} line 5: t_med_s 'nan' is not a time > 0)"]
    assert "warning" not in out
    assert len(rows_of(str(tmp_path / "out" / "scaling.csv"))) == 3


BAD_MODELS = {"model-number": "42", "model-zero": json.dumps(dict(CALIB, alpha_s=0)),
              "model-string-entries": json.dumps(dict(CALIB, pingpong=[["1", "2e-6"], ["16777216", "1.7e-3"]]))}


@pytest.mark.parametrize("case", list(BAD_MODELS) + ["out-is-a-file", "non-utf8-csv"])
def test_report_command_bad_input_is_one_line_and_status_2(tmp_path, case):
    path = write_points(tmp_path / "a.csv", amdahl_points("ring", 0.2))
    args, named = [path, "--out", str(tmp_path / "out")], str(tmp_path / "c.json")
    if case.startswith("model"):
        (tmp_path / "c.json").write_text(BAD_MODELS[case])
        args += ["--model", named]
    elif case == "out-is-a-file":
        (tmp_path / "taken").write_text("x")
        args, named = [path, "--out", str(tmp_path / "taken")], str(tmp_path / "taken")
    else:
        (tmp_path / "bad.csv").write_bytes(b"\xff\n")
        args, named = [str(tmp_path / "bad.csv"), "--out", str(tmp_path / "out")], str(tmp_path / "bad.csv")
    status, _, err = mlscale("report", *args)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and named in err


def test_report_projects_to_at_most_the_models_bound_in_one_line(tmp_path):
    path = write_points(tmp_path / "a.csv", amdahl_points("rows", 0.2))
    (tmp_path / "c.json").write_text(json.dumps(CALIB))
    args = [path, "--out", str(tmp_path / "out"), "--model", str(tmp_path / "c.json"), "--no-plots"]
    for ranks in (MAX_PROJECTED_RANKS + 1, 1 << 40):
        status, _, err = mlscale("report", *args, "--project", f"64,{ranks}")
        assert status == 2 and len(err.strip().splitlines()) == 1
        assert f"--project {ranks}: the cost models project to at most {MAX_PROJECTED_RANKS} ranks" in err
    status, _, err = mlscale("report", *args, "--project", f"64,{MAX_PROJECTED_RANKS}")
    assert status == 0, err
    projected = {(r["variant"], r["ranks"]) for r in rows_of(str(tmp_path / "out" / "projection.csv"))}
    assert ("rows", str(MAX_PROJECTED_RANKS)) in projected
    assert f"(at most {MAX_PROJECTED_RANKS})" in " ".join(mlscale("report", "--help")[1].split())
