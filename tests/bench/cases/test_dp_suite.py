"""Suite ``dp`` end to end through the command line, on the small digits data set."""
import json
import re

import numpy as np
import pytest

from bench.models.dp import ZERO2_BUCKET_BYTES, mlp_widths, model_state_bytes, read_settings
from bench.registry import case_class
from bench.report.output import write_report
from bench.settings import resolve
from kernels.errors import InputError
from tests.bench.flops_rows import assert_rates, dense_flops
from tests.clitools import mlscale as run_mlscale
from tests.clitools import rows_of

SUITE = "bench.cases.dp:DataParallel"


def mlscale(settings, *args, ranks=None):
    """Run ``mlscale ARGS`` on the digits data with ``MLSCALE_DP_*`` ``settings``."""
    return run_mlscale(*args, ranks=ranks, MLSCALE_DP_DATASET="digits", **settings)


def test_sweep_trains_checks_and_records_settings(tmp_path):
    """Every kind of variant, the ZeRO stages too: their model state by ZeRO's accounting (SGD with momentum:
    one state vector), side by side with the others' in the report."""
    path = str(tmp_path / "dp.csv")
    variants = ("mpi", "mpi_overlap", "tree", "zero1", "zero2", "zero3")
    status, out, err = mlscale({}, "sweep", SUITE, "--np", "2", "--ranks", "1,2", "--sizes", "13",
                               "--variants", ",".join(variants), "--iters", "2", "--warmup", "1", "--csv", path)
    assert status == 0, err
    assert "comm_share=" in out
    rows = rows_of(path)
    assert [(row["ranks"], row["variant"]) for row in rows] == [(ranks, v) for ranks in "12" for v in variants]
    assert {row["wrong"] for row in rows} == {"0"}
    assert {row["dtype"] for row in rows} == {"float32"} and {row["size_unit"] for row in rows} == {"samples"}
    params = [json.loads(row["params"]) for row in rows]
    assert [p["bucket_bytes"] for p in params[:6]] == [0, 64 << 10, 0, 0, ZERO2_BUCKET_BYTES, 0]
    assert [p["overlap"] for p in params[:3]] == [False, True, False]
    for row, p in zip(rows, params):
        expected = model_state_bytes(row["variant"], p["parameters"], 4, int(row["ranks"]), "sgd")
        assert abs(p["model_state_bytes"] - expected) <= 0.05 * expected
        assert p["model_state_bytes"] <= p["peak_model_state_bytes"]
    _, document = write_report([path], str(tmp_path / "report"), plots=False)
    (table,) = [t for t in document["suites"][0]["model_state"] if t["ranks"] == 2]
    assert [r["variant"] for r in table["rows"]] == list(variants)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "### Model state and speed per variant: model mlp, 2 ranks" in summary
    assert {p["dataset"] for p in params} == {"digits"} and {p["model"] for p in params} == {"mlp"}
    for row, p in zip(rows, params):
        assert row["metric"] == "comm_share" and 0 <= float(row["metric_value"]) <= 1
        assert float(row["items_per_s"]) > 0 and p["steps"] >= 4
        assert 0 <= p["test_accuracy"] <= 1 and p["peak_memory_mib"] > 0 and p["epoch_s_estimate"] > 0
        assert p["samples_per_epoch"] == 1438 and p["epochs"] == p["steps"] * 13 / 1438
        assert (p["optimizer"], p["compute"], p["lr"], p["momentum"]) == ("sgd", "full", 0.01, 0.9)
        assert p["skipped_steps"] == 0 and p["loss_scale"] is None
        assert_rates(row, dense_flops(13, mlp_widths(64)), int(row["ranks"]))


def test_adam_in_mixed_precision_checks_against_float32_and_records_the_loss_scale(tmp_path):
    path = str(tmp_path / "dp.csv")
    for compute in ("float16", "bfloat16"):
        status, _, err = mlscale({}, "sweep", SUITE, "--np", "2", "--ranks", "1,2", "--sizes", "13", "--variants",
                                 "mpi,ring", "--iters", "3", "--warmup", "1", "--csv", path, "--set",
                                 "DP_OPTIMIZER=adam", "--set", f"DP_COMPUTE={compute}")
        assert status == 0, err
    rows = rows_of(path)
    assert len(rows) == 8 and {row["wrong"] for row in rows} == {"0"}
    for row in rows:
        p = json.loads(row["params"])
        assert json.loads(row["settings"]) == {"MLSCALE_DP_DATASET": "digits", "MLSCALE_DP_OPTIMIZER": "adam",
                                               "MLSCALE_DP_COMPUTE": p["compute"]}
        assert p["optimizer"] == "adam" and p["lr"] == 1e-3 and "momentum" not in p
        assert 0 <= p["skipped_steps"] < p["steps"] and p["peak_memory_mib"] > 0
        # float16: dynamic scaling from 2**16, halved per skipped step (no growth within 2000 steps)
        expected_scale = 2.0 ** (16 - p["skipped_steps"]) if p["compute"] == "float16" else 1.0
        assert p["loss_scale"] == expected_scale and 0 <= p["test_accuracy"] <= 1


def test_reduced_precision_accumulation_and_buckets_in_float64(tmp_path):
    path = str(tmp_path / "dp.csv")
    settings = dict(MLSCALE_DP_PRECISION="bfloat16", MLSCALE_DP_MICRO_BATCHES="2", MLSCALE_DP_BUCKET_BYTES="8K")
    status, _, err = mlscale(settings, "run", SUITE, "--sizes", "7", "--variants", "rabenseifner", "--iters", "2",
                             "--dtype", "float64", "--csv", path, ranks=2)
    assert status == 0, err
    (row,) = rows_of(path)
    params = json.loads(row["params"])
    assert row["wrong"] == "0" and row["dtype"] == "float64"
    assert (params["precision"], params["micro_batches"], params["bucket_bytes"]) == ("bfloat16", 2, 8192)
    assert params["buckets"] > 2


def test_impossible_settings_are_one_line_errors_with_status_2(tmp_path):
    """Models that need other data end the run (one line, status 2); malformed values are refused as the
    settings are read, before anything runs (the same one-line error on the command line)."""
    path = str(tmp_path / "dp.csv")
    for settings, variant, message in [
            (dict(MLSCALE_DP_MODEL="cnn"), "mpi", "needs 28x28 images"),
            (dict(MLSCALE_DP_MODEL="keras_cnn"), "mpi", "MLSCALE_DP_MODEL=keras_cnn needs 28x28 images"),
            (dict(MLSCALE_DP_OPTIMIZER="rmsprop"), "mpi", "MLSCALE_DP_OPTIMIZER='rmsprop'"),
            (dict(MLSCALE_DP_PRECISION="float16"), "zero1", "MLSCALE_DP_PRECISION=float16 is for the allreduce")]:
        status, _, err = mlscale(settings, "run", SUITE, "--sizes", "8", "--variants", variant, "--csv", path)
        assert status == 2, err
        assert message in err and len(err.strip().splitlines()) == 1
    declared = case_class("dp").declared_settings
    for settings, message in [(dict(MLSCALE_DP_COMPUTE="float8"), "MLSCALE_DP_COMPUTE='float8'"),
                              (dict(MLSCALE_DP_PRECISION="int8"), "MLSCALE_DP_PRECISION='int8'"),
                              (dict(MLSCALE_DP_MICRO_BATCHES="0"), "MLSCALE_DP_MICRO_BATCHES='0'"),
                              (dict(MLSCALE_DP_BUCKET_BYTES="1Q"), "MLSCALE_DP_BUCKET_BYTES: malformed size"),
                              (dict(MLSCALE_DP_ZERO_COLLECTIVES="tree"), "MLSCALE_DP_ZERO_COLLECTIVES='tree'")]:
        with pytest.raises(InputError, match=re.escape(message)):
            resolve(declared, (), settings, "dp")
    with pytest.raises(InputError, match="MLSCALE_DP_BUCKET_BYTES is for the other variants"):
        read_settings(resolve(declared, (), dict(MLSCALE_DP_BUCKET_BYTES="1K"), "dp"), "zero3")


def test_more_micro_batches_than_the_smallest_shard_holds_is_one_line_and_status_2(tmp_path):
    """On 2 ranks through the command line (shards of 17 and 16); on 1 rank in-process, where as many
    micro-batches as samples set up."""
    from mpi4py import MPI

    from bench.registry import get_case
    from kernels.backend import get_backend

    status, _, err = mlscale(dict(MLSCALE_DP_MICRO_BATCHES="17"), "sweep", SUITE, "--np", "2", "--sizes", "33",
                             "--variants", "mpi", "--iters", "1", "--warmup", "0", "--csv", str(tmp_path / "dp.csv"))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "MLSCALE_DP_MICRO_BATCHES=17 is more than the 16 samples of the smallest shard" in err
    backend = get_backend("numpy", MPI.COMM_SELF)
    for micro_batches in (17, 16):
        case = get_case("dp", resolve(case_class("dp").declared_settings, (f"DP_MICRO_BATCHES={micro_batches}",), {},
                                      "dp"))
        if micro_batches == 17:
            with pytest.raises(InputError, match="MLSCALE_DP_MICRO_BATCHES=17 is more than the 16 samples"):
                case.setup(MPI.COMM_SELF, 16, "mpi", backend, "float32")
        else:
            case.teardown(case.setup(MPI.COMM_SELF, 16, "mpi", backend, "float32"))


@pytest.mark.parametrize("settings", [dict(MLSCALE_DP_MODEL="cnn"),
                                      dict(MLSCALE_DP_MODEL="keras_cnn", MLSCALE_DP_OPTIMIZER="adam",
                                           MLSCALE_DP_COMPUTE="bfloat16")], ids=["cnn", "keras_cnn"])
def test_mnist_idx_files_from_a_directory(tmp_path, settings):
    from tests.kernels.test_datasets import write_idx

    rng = np.random.default_rng(0)
    for prefix, count in (("train", 40), ("t10k", 10)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, count, dtype=np.uint8))
    path = str(tmp_path / "dp.csv")
    status, _, err = run_mlscale("sweep", SUITE, "--np", "2", "--ranks", "2", "--sizes", "9", "--variants", "mpi",
                                 "--iters", "2", "--csv", path, MLSCALE_DP_DATASET=str(tmp_path), **settings)
    assert status == 0, err
    (row,) = rows_of(path)
    assert row["wrong"] == "0" and json.loads(row["settings"])["MLSCALE_DP_DATASET"] == str(tmp_path)
    status, _, err = run_mlscale("run", SUITE, "--sizes", "9", "--csv", path,
                                 MLSCALE_DP_DATASET=str(tmp_path / "missing"))
    assert status == 2 and "a directory holding the MNIST IDX files" in err
