"""The cost model's calibration files (one or two scopes) and the per-suite model error lines."""
import json

import pytest

from bench.models import get_model
from bench.load import PROBE_BYTES
from bench.report.model import (APART_SECONDS, calibration_in_state, for_projection, handoff_state, load_calibration, load_calibrations,
                                memory_state, provenance_note)
from bench.report.output import model_error_lines, write_report
from kernels.errors import InputError
from tests.bench.report_rows import BIG, CALIB, calibration, point, write_points
from tests.clitools import mlscale


def _write(tmp_path, name, calib):
    path = tmp_path / name
    path.write_text(json.dumps(calib))
    return str(path)


def test_an_older_calibration_asks_to_run_calibrate_again(tmp_path):
    old = {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_byte": 5e-11, "memcpy_bytes_per_s": 8e9,
           "gemm_flops_per_s": 3e10}
    path = _write(tmp_path, "old.json", old)
    with pytest.raises(InputError, match="written by an older mlscale calibrate .missing 'overhead_s'.; run "
                                         "mlscale calibrate again") as error:
        load_calibration(path)
    assert path in str(error.value) and "\n" not in str(error.value)


def test_a_file_with_one_kernel_row_rate_still_loads(tmp_path):
    """Files written before the rate was measured on all cores hold one number (one thread)."""
    assert load_calibration(_write(tmp_path, "one.json", dict(CALIB, kernel_rows=4e6)))["kernel_rows"] == 4e6


def test_an_unknown_scope_is_refused(tmp_path):
    with pytest.raises(InputError, match="scope must be one of intra-node, inter-node"):
        load_calibration(_write(tmp_path, "c.json", dict(CALIB, scope="rack")))


def test_intra_and_inter_node_files_combine_and_projections_use_the_inter_node_messages(tmp_path):
    intra = _write(tmp_path, "intra.json", CALIB)
    inter = _write(tmp_path, "inter.json", dict(calibration(alpha=5e-5, beta=1e-9), scope="inter-node"))
    combined = load_calibrations([inter, intra])
    assert combined["alpha_s"] == CALIB["alpha_s"] and combined["inter"]["alpha_s"] == 5e-5
    projected, note = for_projection(combined)
    assert projected["alpha_s"] == 5e-5 and projected["pingpong"] == combined["inter"]["pingpong"]
    assert projected["gemm"] == CALIB["gemm"]  # compute rates stay the node's
    assert note == f"inter-node message constants of {inter}, compute rates of {intra}"
    assert for_projection(load_calibrations([intra]))[1] == \
        f"intra-node constants of {intra} (no inter-node calibration given)"


def test_projections_take_fresh_exchanges_and_one_way_messages_across_nodes_or_none(tmp_path):
    fresh, oneway = [[8, 3e-6], [1 << 20, 3e-4]], [[8, 4e-6], [1 << 20, 2e-4]]
    intra = _write(tmp_path, "intra.json", dict(CALIB, exchange_fresh=fresh, oneway=oneway))
    older = _write(tmp_path, "older.json", dict(calibration(alpha=5e-5), scope="inter-node"))  # written before them
    projected = for_projection(load_calibrations([intra, older]))[0]
    assert "exchange_fresh" not in projected and "oneway" not in projected  # plain exchanges, the ping-pong
    newer = _write(tmp_path, "newer.json", dict(calibration(alpha=5e-5), scope="inter-node",
                                                exchange_fresh=[[8, 9e-6], [1 << 20, 9e-4]]))
    assert for_projection(load_calibrations([intra, newer]))[0]["exchange_fresh"] == [[8, 9e-6], [1 << 20, 9e-4]]
    assert load_calibrations([intra, newer])["exchange_fresh"] == fresh  # the node's own points keep the node's


def test_projections_take_mpis_calls_measured_across_nodes_or_none(tmp_path):
    library = {"bcast": [[8, 1e-6], [1 << 20, 1e-4]]}
    intra = _write(tmp_path, "intra.json", dict(CALIB, library=library))
    inter = dict(calibration(alpha=5e-5, beta=1e-9), scope="inter-node")
    combined = load_calibrations([intra, _write(tmp_path, "inter.json", inter)])
    assert combined["library"] == library and "library" not in for_projection(combined)[0]
    across = {"bcast": [[8, 9e-6], [1 << 20, 9e-4]]}
    combined = load_calibrations([intra, _write(tmp_path, "inter2.json", dict(inter, library=across))])
    assert for_projection(combined)[0]["library"] == across
    with pytest.raises(InputError, match='library must hold numbers only, got "slow"'):
        load_calibration(_write(tmp_path, "bad.json", dict(CALIB, library={"bcast": [[8, "slow"]]})))


def test_two_files_of_one_scope_are_refused(tmp_path):
    first, second = _write(tmp_path, "a.json", CALIB), _write(tmp_path, "b.json", CALIB)
    with pytest.raises(InputError, match="both intra-node calibrations"):
        load_calibrations([first, second])


def test_one_model_error_line_per_suite_from_two_ranks_up_over_its_stable_points():
    # stable None (a file written before the column) counts as stable; False is left out and counted
    table = [dict(suite="p2p", ranks=2, model_error=e, stable=s) for e, s in ((0.1, True), (-0.3, None), (0.2, True),
                                                                            (9.0, False), (-7.0, False))]
    table += [dict(suite="allreduce", ranks=1, model_error=5.0), dict(suite="allreduce", ranks=2, model_error=-0.05),
              dict(suite="gemv", ranks=2, model_error=None), dict(suite="tp", ranks=2, model_error=3.0, stable=False)]
    assert model_error_lines(table) == [
        "report: allreduce model error at >= 2 ranks: median 5%, max 5% over 1 stable point; 0 unstable left out",
        "report: p2p model error at >= 2 ranks: median 20%, max 30% over 3 stable points; 2 unstable left out",
        "report: tp model error at >= 2 ranks: no stable points (1 unstable left out)"]


def test_points_measured_in_another_node_state_than_the_calibrations_are_left_out_of_the_model_error():
    # 1.2x either way is the calibrated memory state, 2x the handoff state; no probe (older files) counts as in it
    table = [dict(suite="gemv", ranks=2, model_error=e, stable=True, memory_state=m, handoff_state=h)
             for e, m, h in ((0.1, 1.1, 1.9), (-0.3, None, None), (0.2, 1 / 1.15, 1 / 1.9), (0.9, 1.5, 1.0),
                             (-0.6, 0.7, None), (0.8, 1.0, 2.1), (0.7, None, 1 / 2.1))]
    table.append(dict(suite="gemv", ranks=2, model_error=4.0, stable=False, memory_state=2.0))  # counted unstable
    table.append(dict(suite="tp", ranks=2, model_error=0.5, stable=True, memory_state=1.3))
    why = "the node's probe GEMV more than 1.2x or its handoff more than 2.0x off the calibration's"
    assert model_error_lines(table) == [
        "report: gemv model error at >= 2 ranks: median 20%, max 30% over 3 stable points; 1 unstable left out, "
        f"4 in another node state left out ({why})",
        "report: tp model error at >= 2 ranks: no stable points in the calibrated node state (0 unstable left out, "
        f"1 in another node state left out ({why}))"]


def test_a_point_is_priced_with_the_calibrations_handoff_state_nearer_its_own_probe():
    other = dict(handoff_s=5e-4, alpha_s=4e-6, beta_s_per_byte=2e-10, exchange=[[8, 9e-6]])
    calib = dict(CALIB, handoff_s=1e-4, scope="intra-node", other_state=other)

    def probed(seconds):
        return {"load": {"handoff_probe_s": seconds}}
    assert calibration_in_state(calib, probed(2e-4)) == (calib, "reference")  # 2x off 1e-4, 2.5x off 5e-4
    priced, state = calibration_in_state(calib, probed(3e-4))
    assert state == "other" and priced["exchange"] == [[8, 9e-6]] and priced["alpha_s"] == 4e-6
    assert handoff_state(priced, probed(3e-4)) == pytest.approx(0.6) and priced["pingpong"] == CALIB["pingpong"]
    assert calibration_in_state(dict(calib, other_state=None), probed(3e-4))[1] == "reference"
    assert calibration_in_state(calib, {}) == (calib, None)  # no probe (MLSCALE_MEMORY_PROBE=0, older files)
    assert calibration_in_state(dict(calib, scope="inter-node"), probed(3e-4))[1] is None
    table = [dict(suite="p2p", ranks=2, model_error=e, stable=True, calibration_state=s)
             for e, s in ((0.1, "other"), (0.2, "reference"), (0.3, None))]
    assert model_error_lines(table) == [
        "report: p2p model error at >= 2 ranks: median 20%, max 30% over 3 stable points (1 priced with the "
        "calibration's other handoff state); 0 unstable left out"]


def test_a_calibrations_other_state_is_checked_as_its_tables(tmp_path):
    for other, wrong in (([1], "other_state must hold positive handoff_s, alpha_s and beta_s_per_byte"),
                         (dict(handoff_s=1e-4, alpha_s=0, beta_s_per_byte=1e-10), "other_state must hold positive"),
                         (dict(handoff_s=1e-4, alpha_s=1e-6, beta_s_per_byte=1e-10, exchange=[[8, "x"]]),
                          "other_state.exchange must hold numbers only")):
        with pytest.raises(InputError, match=wrong):
            load_calibration(_write(tmp_path, "other.json", dict(CALIB, other_state=other)))
    good = dict(handoff_s=1e-4, alpha_s=1e-6, beta_s_per_byte=1e-10, exchange=[[8, 1e-6]])
    assert load_calibration(_write(tmp_path, "good.json", dict(CALIB, other_state=good)))["other_state"] == good
    busy = dict(ranks=2, threads=1, handoff_s=1e-4, copy=[[8, 1e-6]])
    for other, wrong in ((dict(copy=[[8, 1e-6]]), "busy.other_state must hold positive handoff_s;"),
                         (dict(handoff_s=5e-4, copy=[[8, None]]), "busy.other_state.copy must hold numbers only")):
        with pytest.raises(InputError, match=wrong):
            load_calibration(_write(tmp_path, "busy.json", dict(CALIB, busy=dict(busy, other_state=other))))
    busy["other_state"] = dict(handoff_s=5e-4, copy=[[8, 2e-6]])
    assert load_calibration(_write(tmp_path, "busy.json", dict(CALIB, busy=busy)))["busy"] == busy


def test_a_points_busy_rates_are_those_of_the_state_nearer_its_probe_on_any_scope():
    busy = dict(ranks=2, threads=1, handoff_s=1e-4, copy=[[8, 1e-6]], other_state=dict(handoff_s=5e-4, copy=[[8, 3e-6]]))
    calib = dict(CALIB, busy=busy, scope="inter-node")

    def probed(seconds):
        return {"load": {"handoff_probe_s": seconds}}
    assert calibration_in_state(calib, probed(2e-4)) == (calib, "reference")
    priced, state = calibration_in_state(calib, probed(3e-4))
    assert state == "other" and priced["busy"]["copy"] == [[8, 3e-6]] and priced["busy"]["threads"] == 1
    assert priced["pingpong"] == CALIB["pingpong"] and calib["busy"]["copy"] == [[8, 1e-6]]  # the messages kept
    assert calibration_in_state(calib, {}) == (calib, None)
    assert calibration_in_state(dict(calib, busy=dict(busy, handoff_s=None)), probed(3e-4)) == (
        dict(calib, busy=dict(busy, handoff_s=None)), None)  # an older file: no probe to compare with


def test_a_points_handoff_state_is_its_probe_over_the_calibrations_on_one_node_only():
    calib = dict(CALIB, handoff_s=2e-4, scope="intra-node")

    def probed(seconds):
        return {"load": {"handoff_probe_s": seconds}}
    assert handoff_state(calib, probed(5e-4)) == pytest.approx(2.5)
    assert handoff_state(dict(calib, scope="inter-node"), probed(5e-4)) is None  # its probe crossed the network
    assert handoff_state(calib, probed(None)) is None and handoff_state(calib, {}) is None
    assert handoff_state(None, probed(5e-4)) is None and handoff_state(CALIB, probed(5e-4)) is None  # older files


def test_a_points_memory_state_is_its_probe_over_the_calibrated_gemv_of_the_probes_bytes_at_its_sharing():
    gemv = {"float64": [[PROBE_BYTES, [2e-3, 1e-3]], [2 * PROBE_BYTES, [4e-3, 2e-3]]]}
    calib = dict(CALIB, gemv=gemv, busy=dict(ranks=2, threads=1, gemv={"float64": [[PROBE_BYTES, 3e-3],
                                                                                 [2 * PROBE_BYTES, 6e-3]]}))

    def probed(seconds):
        return {"load": {"memory_probe_s": seconds}, "blas_threads": 1}
    assert memory_state(calib, 1, probed(1.5e-3)) == pytest.approx(1.5)  # alone: both cores' threads
    assert memory_state(calib, 2, probed(3.3e-3)) == pytest.approx(1.1)  # two ranks share the node: busy
    assert memory_state(dict(calib, point_dtype="float32"), 2, probed(3e-3)) == pytest.approx(1.0)  # float64 probe
    assert memory_state(calib, 2, {"load": {"memory_probe_s": None}}) is None
    assert memory_state(calib, 2, {}) is None and memory_state(None, 2, probed(1e-3)) is None
    assert memory_state(CALIB, 2, probed(1e-3)) is None  # a calibration without GEMVs


def test_the_points_that_repeat_a_calibration_entry_give_a_drift_line_under_their_suites_error_line():
    table = [dict(suite="bcast", ranks=2, model_error=e, stable=s, calibration_entry=c)
             for e, s, c in ((0.4, True, True), (-0.2, True, True), (5.0, False, True), (0.01, True, False))]
    table.append(dict(suite="tp", ranks=2, model_error=0.1, stable=True, calibration_entry=False))
    lines = model_error_lines(table)
    assert lines[0] == ("report: bcast model error at >= 2 ranks: median 20%, max 40% over 3 stable points; "
                        "1 unstable left out")
    assert lines[1].startswith("report: bcast calibration drift: median 30%, max 40% over 2 stable points that "
                               "repeat a calibration entry (the same call and size on 2 ranks)")
    assert lines[2].startswith("report: tp model error") and len(lines) == 3


@pytest.mark.parametrize("suite", ["allreduce", "bcast"])
def test_mpis_call_on_two_ranks_at_a_calibrated_size_as_calibrated_is_a_calibration_entry(suite):
    model = get_model(suite, {"COLL_IN_PLACE": False, "COLL_OP": "sum", "COLL_ROOT": 0}
                      if suite == "allreduce" else {"COLL_IN_PLACE": False, "COLL_ROOT": 0})
    calib = dict(CALIB, library={"bcast": [[8, 1e-6], [BIG, 1e-3]]})

    def entry(variant="mpi", size=BIG, ranks=2, dtype="float64", **params):
        return model.measured_by_calibration(variant, size, ranks, dict(calib, point_dtype=dtype, point_params=params))
    assert entry() and entry(in_place=False)
    measured = (calib["allreduce"] if suite == "allreduce" else calib["library"]["bcast"])[-1][1]
    # the prediction is the entry (allreduce's adds the case's Python call, one overhead_s)
    assert abs(model.predict("mpi", BIG, 2, dict(calib, point_dtype="float64")) - measured) <= 1.01 * CALIB["overhead_s"]
    assert not any([entry(size=BIG - 8), entry(ranks=3), entry(ranks=1), entry("binomial" if suite == "bcast" else
                                                                                "ring"),
                    entry(dtype="float32"), entry(in_place=True)])
    assert not (entry(op="max") if suite == "allreduce" else entry(root=1))
    assert not get_model("reduce", {"COLL_IN_PLACE": False, "COLL_OP": "sum", "COLL_ROOT": 0}).measured_by_calibration(
        "mpi", BIG, 2, dict(calib, point_dtype="float64"))  # no reduce table: priced by its formula


def test_p2p_on_two_ranks_at_a_table_size_is_a_calibration_entry_and_other_suites_have_none():
    p2p = get_model("p2p")
    assert p2p.measured_by_calibration("latency", BIG, 2, CALIB) and p2p.measured_by_calibration("bandwidth", 1, 2,
                                                                                                   CALIB)
    assert not p2p.measured_by_calibration("latency", 4096, 2, CALIB)
    assert not p2p.measured_by_calibration("latency", BIG, 4, CALIB)
    assert not get_model("gemv").measured_by_calibration("rows", 1024, 2, CALIB)


def test_report_prints_the_error_lines_and_which_constants_projected(tmp_path):
    points = [point("rows", p, 1e-3 / p, size=1024) for p in (1, 2, 4)]
    points += [point("ring", p, 1e-4, size=4096, suite="allreduce") for p in (2, 4)]
    path = write_points(tmp_path / "a.csv", points)
    intra = _write(tmp_path, "intra.json", CALIB)
    inter = _write(tmp_path, "inter.json", dict(CALIB, scope="inter-node"))
    status, out, err = mlscale("report", path, "--out", str(tmp_path / "rep"), "--no-plots", "--model", intra,
                               "--model", inter, "--project", "64")
    assert status == 0, err
    lines = out.splitlines()
    assert sum(line.startswith("report: allreduce model error at >= 2 ranks: median ") and
               line.endswith(" over 2 stable points; 0 unstable left out") for line in lines) == 1
    assert sum(line.startswith("report: gemv model error at >= 2 ranks: ") for line in lines) == 1
    assert f"report: projection to 64 ranks uses inter-node message constants of {inter}, compute rates of " \
           f"{intra}" in lines
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "- allreduce model error at >= 2 ranks" in summary and "- projection to 64 ranks uses" in summary


def test_write_report_gives_no_error_line_without_a_model(tmp_path):
    path = write_points(tmp_path / "a.csv", [point("rows", p, 1e-3 / p) for p in (1, 2)])
    notes, _ = write_report([path], str(tmp_path / "out"), plots=False)
    assert not any("model error" in line for line in notes)


def test_a_calibration_from_another_host_or_hours_away_is_named_once():
    calib = dict(CALIB, path="c.json", host="node1", timestamp="2026-12-02T10:00:00+00:00")
    near = [dict(host="node1", timestamp="2026-12-02T10:06:00+00:00"),
            dict(host="node1", timestamp="2026-12-02T09:55:00+00:00")]
    assert provenance_note(calib, near) is None
    ten = [dict(host="node1", timestamp="2026-12-02T10:10:00+00:00")]
    assert APART_SECONDS == 600 and provenance_note(calib, ten) is None  # ten minutes apart: not named
    later = [dict(host="node1", timestamp="2026-12-02T10:25:00+00:00")]
    assert provenance_note(calib, later).startswith("report: note: c.json was measured 25 min from the farthest point")
    far = near + [dict(host="node1", timestamp="2026-12-02T12:06:00+00:00")]
    assert provenance_note(calib, far) == ("report: note: c.json was measured 2.1 h from the farthest point: its model "
                                           "errors also measure that difference (run mlscale calibrate beside the "
                                           "sweep, on its nodes)")
    other = [dict(host="node2", timestamp="2026-12-02T10:00:00+00:00"), dict(host="node3", timestamp="")]
    assert provenance_note(calib, other).startswith("report: note: c.json was measured on host node1 (the points: "
                                                    "node2, node3): ")
    assert provenance_note(dict(calib, timestamp="2026-12-02T10:00:00"), near + far) is None   # no zone: not a moment
    assert provenance_note(dict(CALIB, path="c.json"), other) is None   # a file that does not say
    assert provenance_note(calib, [dict(host="", timestamp="yesterday")]) is None


def test_the_report_prints_the_provenance_note_beside_the_error_lines(tmp_path):
    when = "2026-12-02T10:00:00+00:00"
    path = write_points(tmp_path / "a.csv", [point("rows", p, 1e-3 / p, host="node2", timestamp=when) for p in (1, 2)])
    calib = _write(tmp_path, "c.json", dict(CALIB, host="node1", timestamp=when))
    notes, doc = write_report([path], str(tmp_path / "out"), load_calibration(calib), plots=False)
    assert f"report: note: {calib} was measured on host node1 (the points: node2): its model errors also measure " \
           "that difference (run mlscale calibrate beside the sweep, on its nodes)" in notes
    assert sum("was measured on host" in note for note in doc["notes"]) == 1
