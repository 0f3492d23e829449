"""`mlscale report --format json` and `--json PATH`: the report for machines, beside the Markdown."""
import json

from tests.bench.report_rows import point, write_points
from tests.clitools import mlscale


def strict(text):
    """Parse JSON, refusing NaN and infinities."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def results(tmp_path):
    points = [point(v, p, t * (1 + p), size=s, suite="allreduce") for v, t in (("mpi", 1e-4), ("ring", 2e-4))
              for p in (1, 2) for s in (8, 1024)]
    points += [point("rows", p, 1.0 / p, size=100, metric="comm_share") for p in (1, 2)]
    return write_points(tmp_path / "a.csv", points)


def test_format_json_prints_one_document_on_stdout_and_the_notes_on_stderr(tmp_path):
    status, out, err = mlscale("report", results(tmp_path), "--out", str(tmp_path / "out"), "--no-plots",
                               "--format", "json")
    assert status == 0, err
    document = strict(out)
    assert document["mlscale_report"] == 1 and document["points"] == 10
    assert [s["suite"] for s in document["suites"]] == ["allreduce", "gemv"]
    allreduce, gemv = document["suites"]
    assert allreduce["kind"] == "communication" and gemv["kind"] == "compute"
    assert allreduce["communication"][0]["average_busbw"].keys() == {"mpi", "ring"}
    assert gemv["points"][1]["speedup"] == 2.0 and gemv["points"][1]["metric_value"] is None
    assert err.startswith("report: 10 points from 1 file(s) -> ")
    assert (tmp_path / "out" / "summary.md").is_file()


def test_json_path_writes_the_same_document_beside_the_markdown(tmp_path):
    target = tmp_path / "report.json"
    path = results(tmp_path)
    status, out, err = mlscale("report", path, "--out", str(tmp_path / "out"), "--no-plots", "--json", str(target))
    assert status == 0, err
    assert str(target) in out and not out.lstrip().startswith("{")
    _, printed, _ = mlscale("report", path, "--out", str(tmp_path / "out"), "--no-plots",
                            "--format", "json")
    assert strict(target.read_text()) == strict(printed)
    assert (tmp_path / "out" / "summary.md").is_file()


def test_an_unwritable_json_path_is_one_line_and_status_2(tmp_path):
    target = tmp_path / "missing" / "report.json"
    status, out, err = mlscale("report", results(tmp_path), "--out", str(tmp_path / "out"), "--no-plots",
                               "--json", str(target))
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and str(target) in err
