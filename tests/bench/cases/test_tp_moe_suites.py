"""Suites ``tp`` and ``moe`` end to end through the command line, with tiny layers."""
import json

from tests.bench.flops_rows import assert_rates, dense_flops
from tests.clitools import mlscale as run_mlscale
from tests.clitools import rows_of

TP, MOE = "bench.cases.tp:TensorParallel", "bench.cases.moe:MixtureOfExperts"


def mlscale(settings, *args, ranks=None):
    """Run ``mlscale ARGS`` (under ``mpiexec -n RANKS`` when given) with extra environment ``settings``."""
    return run_mlscale(*args, ranks=ranks, **settings)


def test_tp_sweep_checks_every_variant_and_skips_serial_on_two_ranks(tmp_path):
    path = str(tmp_path / "tp.csv")
    status, out, err = mlscale(dict(MLSCALE_TP_HIDDEN="8", MLSCALE_TP_FFN="7"), "sweep", TP, "--np", "2",
                               "--ranks", "1,2", "--sizes", "5", "--iters", "2", "--warmup", "1", "--csv", path,
                               "--set", "TP_COLLECTIVES=ring")  # the hand-written ring: the same bytes counted
    assert status == 0, err
    assert "skipped serial on 2 ranks" in out
    rows = rows_of(path)
    assert [(row["ranks"], row["variant"]) for row in rows] == [
        ("1", "allreduce"), ("1", "sequence"), ("1", "serial"), ("2", "allreduce"), ("2", "sequence")]
    assert {row["wrong"] for row in rows} == {"0"} and {row["size_unit"] for row in rows} == {"tokens"}
    for row in rows:
        params = json.loads(row["params"])
        ranks = int(row["ranks"])
        # 5 tokens x 8 float64 = 320 bytes; per run 2 allreduces (or 2 allgathers + 2 reduce-scatters)
        assert params["bytes_sent_per_rank"] == [640 if ranks == 2 else 0] * ranks
        assert (params["hidden"], params["ffn"], params["collectives"]) == (8, 7, "ring")
        assert json.loads(row["settings"])["MLSCALE_TP_COLLECTIVES"] == "ring" and len(params["peak_mem_mb_per_rank"]) == ranks
        assert row["metric"] == "comm_share" and 0 <= float(row["metric_value"]) <= 1
        assert float(row["items_per_s"]) > 0
        assert_rates(row, dense_flops(5, (8, 7, 8)), ranks)


def test_moe_run_with_drops_checks_and_records_routing(tmp_path):
    path = str(tmp_path / "moe.csv")
    settings = dict(MLSCALE_MOE_HIDDEN="6", MLSCALE_MOE_FFN="5", MLSCALE_MOE_EXPERTS_PER_RANK="2",
                    MLSCALE_MOE_CAPACITY="0.5")
    status, out, err = mlscale(settings, "run", MOE, "--sizes", "13", "--iters", "2", "--dtype", "float32",
                               "--csv", path, ranks=2)
    assert status == 0, err
    rows = rows_of(path)
    assert [row["variant"] for row in rows] == ["top1", "top2"] and {row["wrong"] for row in rows} == {"0"}
    for row in rows:
        params = json.loads(row["params"])
        assert row["metric"] == "dropped_fraction" and 0 < float(row["metric_value"]) < 1
        assert params["experts"] == 4 and params["capacity_factor"] == 0.5
        assert params["capacity_per_rank"] == [-(-params["top_k"] * n // 8) for n in (7, 6)]
        assert params["load_imbalance"] >= 1 and params["aux_loss"] > 0
        assert min(params["bytes_sent_per_rank"]) > 0 and len(params["peak_mem_mb_per_rank"]) == 2
        kept = params["top_k"] * 13 - params["dropped"]  # expert rows computed, and the gate's 13 x 6 x 4 GEMMs
        assert_rates(row, dense_flops(kept, (6, 5, 6)) + dense_flops(13, (6, 4)), 2)


def test_impossible_settings_are_one_line_errors_with_status_2(tmp_path):
    path = str(tmp_path / "x.csv")
    for suite, settings, args, message in [
            (TP, dict(MLSCALE_TP_HIDDEN="0"), (), "MLSCALE_TP_HIDDEN='0'"),
            (TP, dict(MLSCALE_TP_FFN="1"), ("--variants", "allreduce", "--ranks", "2", "--np", "2"),
             "ffn 1 cannot be split over 2 ranks"),
            (MOE, dict(MLSCALE_MOE_CAPACITY="lots"), (), "MLSCALE_MOE_CAPACITY='lots'")]:
        status, _, err = mlscale(settings, "sweep", suite, "--sizes", "4", "--csv", path, *args)
        assert status == 2, err
        assert message in err and len(err.strip().splitlines()) == 1
