"""The other handoff state a calibration carries from the one it replaces (bench.carried_state)."""
import json

from bench.carried_state import MESSAGE_STATE_KEYS, with_earlier_state
from bench.report.model import calibration_in_state, load_calibration
from tests.bench.report_rows import CALIB

NOW, TEN_MINUTES_AGO, TWO_HOURS_AGO = "2026-12-05T07:00:00+00:00", "2026-12-05T06:50:00+00:00", "2026-12-05T05:00:00+00:00"


def _calibration(handoff, seconds, timestamp=NOW, **changes):
    """A calibration of CALIB's constants, its message tables and busy rates at ``seconds``, in the handoff
    state ``handoff``."""
    tables = {key: [[8, seconds]] for key in ("pingpong", "oneway", "exchange", "exchange_fresh", "stream", "allreduce")}
    busy = dict(ranks=2, threads=1, handoff_s=handoff, spread={}, copy=[[8, seconds]], gemm={"float64": [1e9]})
    return {**CALIB, **tables, "library": {"bcast": [[8, seconds]]}, "alpha_s": seconds, "beta_s_per_byte": 1e-10,
            "handoff_s": handoff, "busy": busy, "host": "node1", "mpi_library": "MPICH 5", "scope": "intra-node",
            "cores": 2, "quick": False, "timestamp": timestamp, **changes}


def _written(tmp_path, calibration):
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(calibration))
    return str(path)


def test_the_state_a_calibration_lacks_is_carried_from_the_one_it_replaces(tmp_path):
    path = _written(tmp_path, _calibration(5e-4, 3e-6, TEN_MINUTES_AGO))
    constants, note = with_earlier_state(_calibration(1e-4, 1e-6), path)
    other = constants["other_state"]
    assert set(other) == {*MESSAGE_STATE_KEYS, "handoff_s", "carried_from"}
    assert other["exchange"] == [[8, 3e-6]] and other["library"] == {"bcast": [[8, 3e-6]]} and other["alpha_s"] == 3e-6
    assert (other["handoff_s"], other["carried_from"]) == (5e-4, TEN_MINUTES_AGO)
    busy = constants["busy"]["other_state"]
    assert busy == dict(copy=[[8, 3e-6]], gemm={"float64": [1e9]}, handoff_s=5e-4, carried_from=TEN_MINUTES_AGO)
    assert constants["exchange"] == [[8, 1e-6]] and constants["busy"]["copy"] == [[8, 1e-6]]  # its own state kept
    assert note == (f"# the node's other handoff state carried from the calibration {path} held: message tables "
                    f"(handoff 500 us, measured {TEN_MINUTES_AGO}); busy rates (handoff 500 us, measured "
                    f"{TEN_MINUTES_AGO}) (--fresh to carry none)")
    written = _written(tmp_path, constants)
    calib = load_calibration(written)  # checked as measured tables are
    priced, state = calibration_in_state(calib, {"load": {"handoff_probe_s": 4e-4}})
    assert state == "other" and priced["exchange"] == [[8, 3e-6]] and priced["busy"]["copy"] == [[8, 3e-6]]


def test_the_earlier_ones_other_state_is_carried_with_the_time_it_was_measured(tmp_path):
    carried = dict(_calibration(1e-4, 1e-6, TWO_HOURS_AGO), carried_from=TEN_MINUTES_AGO)
    earlier = _calibration(5e-4, 3e-6, TEN_MINUTES_AGO, other_state={
        key: carried[key] for key in (*MESSAGE_STATE_KEYS, "handoff_s", "carried_from")})
    constants, _ = with_earlier_state(_calibration(5.5e-4, 4e-6), _written(tmp_path, earlier))
    assert constants["other_state"]["exchange"] == [[8, 1e-6]]
    assert constants["other_state"]["carried_from"] == TEN_MINUTES_AGO
    assert "other_state" not in constants["busy"]  # the earlier busy rates: the same state only


def test_nothing_is_carried_across_nodes_states_or_an_hour(tmp_path):
    new = _calibration(1e-4, 1e-6)
    for earlier in (_calibration(2e-4, 3e-6, TEN_MINUTES_AGO),  # 2x apart: one state
                    _calibration(5e-4, 3e-6, TWO_HOURS_AGO),
                    _calibration(5e-4, 3e-6, TEN_MINUTES_AGO, host="node2"),
                    _calibration(5e-4, 3e-6, TEN_MINUTES_AGO, quick=True),
                    dict(_calibration(5e-4, 3e-6), timestamp=None)):
        assert with_earlier_state(new, _written(tmp_path, earlier)) == (new, None)
    assert with_earlier_state(new, str(tmp_path / "none.json")) == (new, None)
    assert with_earlier_state(new, _written(tmp_path, [1, 2])) == (new, None)
    malformed = _calibration(5e-4, 3e-6, TEN_MINUTES_AGO, other_state=[1])  # refused as report --model would
    assert with_earlier_state(new, _written(tmp_path, malformed)) == (new, None)
    measured = dict(new, other_state={"handoff_s": 6e-4}, busy=dict(new["busy"], threads=2))  # its own, kept
    assert with_earlier_state(measured, _written(tmp_path, _calibration(5e-4, 3e-6, TEN_MINUTES_AGO))) == (
        measured, None)
