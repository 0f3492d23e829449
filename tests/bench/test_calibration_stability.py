"""The spread of a calibration's tables: judged before the file is written, and warned of in reports."""
import json

import pytest

from bench.report.model import load_calibration, load_calibrations, shared_cores_note
from bench.report.output import write_report
from bench.stability import judge_calibration, table_spread, unstable_tables
from kernels.errors import InputError
from tests.bench.report_rows import CALIB, calibration, point, write_points

SPREADS = {"pingpong": 0.05, "exchange": 0.4, "stream": None, "allreduce": 0.1,
           "one_thread": {"gemm": 0.3, "conv": 0.02}, "all_cores": None}


def test_a_tables_spread_is_the_median_of_its_entries_and_none_from_one_round():
    # entries' spreads: 0, (2.5 - 1.5) / 2 = 0.5, (1.5 - 1) / 1 = 0.5
    assert table_spread([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [1.0, 1.0, 2.0]]) == pytest.approx(0.5)
    assert table_spread(iter([[4.0, 4.0], [1.0, 3.0]])) == pytest.approx(0.25)  # 0 and 0.5; a generator too
    assert table_spread([[1.0], [1.0, 2.0]]) == pytest.approx(1 / 3)  # the entry of one sample left out
    assert table_spread([[1.0], [2.0]]) is None and table_spread([]) is None


def test_unstable_tables_are_named_by_their_place_in_the_file():
    constants = dict(spread=SPREADS, busy=dict(spread={"reduce": 0.26, "copy": 0.25}))
    assert unstable_tables(constants, 0.25) == [("exchange", 0.4), ("one_thread.gemm", 0.3), ("busy.reduce", 0.26)]
    assert unstable_tables(constants, 0.5) == [] and unstable_tables({}, 0.25) == []  # an older file
    assert unstable_tables(dict(spread={key: None for key in SPREADS}), 1e-9) == []  # a quick one


def test_calibrate_refuses_an_unstable_table_unless_forced():
    constants = dict(spread=SPREADS)
    with pytest.raises(InputError) as refused:
        judge_calibration(constants, 0.25, False, "c.json")
    assert str(refused.value) == ("2 calibration table(s) unstable (spread > 0.25): exchange, one_thread.gemm; "
                                  "c.json not written: run again on a quieter node, or give --force to write it")
    lines = judge_calibration(constants, 0.25, True, "c.json")
    assert lines == ["# unstable: calibration table exchange: spread 0.40 > 0.25 (its rounds disagree; is the "
                     "node busy?)", "# unstable: calibration table one_thread.gemm: spread 0.30 > 0.25 (its "
                     "rounds disagree; is the node busy?)"]
    assert judge_calibration(constants, 0.5, False, "c.json") == []


@pytest.mark.parametrize("busy_rate, warned", [(30e9, True), (40e9, False), (44e9, False)])
def test_calibrate_warns_when_the_ranks_computing_at_once_shared_their_cores(busy_rate, warned):
    """Alone 50 GFLOP/s on one thread (100 on two cores): ranks with a thread each at 30 shared cores."""
    constants = dict(cores=2, gemm={"float64": [[10e9, 50e9], [20e9, 100e9]]},
                     busy=dict(ranks=2, threads=1, gemm={"float64": [10e9, busy_rate]}))
    lines = judge_calibration(constants, 0.25, False, "c.json")
    assert lines == (["# warning: with all 2 ranks of the node computing at once, GEMM ran at 60% of its rate "
                      "alone (30.0 against 50.0 GFLOP/s per rank, 1 thread(s) each): the ranks did not each have "
                      "their own cores (hyperthreads, another job, a virtual machine's host); models of points "
                      "on 2+ ranks assume that sharing (calibrate again if it was passing)"] if warned else [])
    assert judge_calibration({key: constants[key] for key in ("cores", "gemm")}, 0.25, False, "c.json") == []  # no busy
    assert shared_cores_note(dict(constants, path="c.json")) == (
        f"report: warning: c.json: {lines[0][len('# warning: '):]}" if warned else None)


def test_a_report_warns_of_the_unstable_tables_of_its_calibrations(tmp_path):
    def written(name, **extra):
        path = tmp_path / name
        path.write_text(json.dumps(dict(CALIB, **extra)))
        return str(path)

    steady = written("steady.json", spread=dict(SPREADS, exchange=0.1, one_thread=None), max_spread=0.25)
    forced = written("forced.json", spread=SPREADS, max_spread=0.25)
    inter = written("inter.json", **dict(calibration(alpha=5e-5), scope="inter-node", spread=SPREADS,
                                         max_spread=0.35))
    assert load_calibration(steady)["unstable"] == [] and load_calibration(written("old.json"))["unstable"] == []
    assert load_calibration(forced)["unstable"] == ["exchange", "one_thread.gemm"]  # against its own threshold
    csv_path = write_points(tmp_path / "a.csv", [point("rows", 1, 1.0), point("rows", 2, 0.6)])
    notes, _ = write_report([csv_path], str(tmp_path / "out"), calib=load_calibrations([steady]), plots=False)
    assert not any("unstable calibration" in line for line in notes)
    notes, _ = write_report([csv_path], str(tmp_path / "out"), calib=load_calibrations([forced, inter]),
                            plots=False)
    assert (f"report: warning: unstable calibration tables in {forced} (exchange, one_thread.gemm); {inter} "
            f"(exchange): the predictions resting on them are as unsteady (run mlscale calibrate again on a quieter "
            f"node)") in notes
    assert "unstable calibration tables" in (tmp_path / "out" / "summary.md").read_text()
