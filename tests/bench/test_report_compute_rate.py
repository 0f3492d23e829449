"""The report's GFLOP/s per rank against the calibrated GEMM peak of the point's dtype, threads and node sharing."""
from bench.report.output import write_report
from tests.bench.report_rows import calibration, point, write_points


def _rows():
    """dp points: 1 rank x 1 thread, 1 rank x 2 threads, 2 ranks on one node, 2 ranks on two nodes (float32)."""
    shapes = [(64, 1, 1, 1, 24.0), (65, 1, 2, 1, 30.0), (64, 2, 1, 1, 9.0), (65, 2, 1, 2, 12.0)]
    return [point("mpi", ranks, 0.01 / ranks, size=size, suite="dp", size_unit="samples", dtype="float32",
                  threads=threads, nodes=nodes, gflops=per_rank * ranks, items_per_s=6400.0, metric="comm_share",
                  metric_value=0.1, params={"gflops_per_rank": per_rank})
            for size, ranks, threads, nodes, per_rank in shapes]


def _calibration():
    """GEMM at 3e10 flop/s on one thread, 6e10 on both cores, float32 at 4e10 and 8e10 at the largest size; on a
    shared node (busy, one thread each) 2e10."""
    calib = calibration(rate=3e10, cores=2)
    calib["gemm"]["float32"] = [[3e10] * 5 + [4e10], [6e10] * 5 + [8e10]]
    calib["busy"] = dict(ranks=2, threads=1, reduce=calib["reduce"], copy=calib["copy"],
                         dp_step={"float64": [[32, 1e-3], [256, 4e-3]]},
                         gemm={"float64": [3e10] * 6, "float32": [1.5e10] * 5 + [2e10]})
    return calib


def test_the_fraction_of_peak_is_the_rate_per_rank_over_the_calibrated_gemm_of_its_threads_and_sharing(tmp_path):
    path = write_points(tmp_path / "dp.csv", _rows())
    _, document = write_report([path], str(tmp_path / "report"), calib=_calibration(), plots=False)
    (suite,) = document["suites"]
    (table,) = suite["compute_rate"]
    peaks = {(r["ranks"], r["threads"], r["gflops"]): r["gemm_peak_gflops"] for r in table["rows"]}
    # alone: the largest size's rate at the point's threads; 2 ranks on one node: the busy rate; on two nodes: alone
    assert peaks == {(1, 1, 24.0): 40.0, (1, 2, 30.0): 80.0, (2, 1, 18.0): 20.0, (2, 1, 24.0): 40.0}
    for row in table["rows"]:
        assert abs(row["peak_fraction"] - row["gflops_per_rank"] / row["gemm_peak_gflops"]) < 1e-12
    assert {round(r["peak_fraction"], 4) for r in table["rows"]} == {0.6, 0.375, 0.45, 0.3}
    assert all(p["peak_fraction"] is not None for p in suite["points"])
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "### GFLOP/s per rank, fraction of the calibrated GEMM peak (numpy, float32)" in summary
    assert "| mpi | strong | 64 | 2 | 1 | 18 | 9 | 20 | 0.45 |" in summary
    assert "GFLOP/s per rank: 0.30-0.60 of the calibrated GEMM peak" in summary
    scaling = (tmp_path / "report" / "scaling.csv").read_text()
    assert "gflops_per_rank,gemm_peak_gflops,peak_fraction" in scaling.splitlines()[0]


def test_without_a_calibration_the_rate_per_rank_is_kept_and_no_fraction_is_shown(tmp_path):
    path = write_points(tmp_path / "dp.csv", _rows())
    _, document = write_report([path], str(tmp_path / "report"), plots=False)
    (suite,) = document["suites"]
    assert suite["compute_rate"] == []
    assert sorted(p["gflops_per_rank"] for p in suite["points"]) == [9.0, 12.0, 24.0, 30.0]
    assert {p["peak_fraction"] for p in suite["points"]} == {None}
    assert "fraction of the calibrated GEMM peak" not in (tmp_path / "report" / "summary.md").read_text()
