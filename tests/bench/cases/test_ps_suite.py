"""The ``ps`` suite end to end through the command line: valid rows, its settings, its input errors."""
import json
from types import SimpleNamespace

import pytest

from bench.cases.ps import ParameterServerSuite
from kernels.backend import get_backend
from kernels.errors import InputError
from bench.models.dp import mlp_widths
from tests.bench.flops_rows import assert_rates, dense_flops
from tests.clitools import mlscale, rows_of

SUITE = "bench.cases.ps:ParameterServerSuite"


def test_sweep_of_every_mode_is_valid(tmp_path):
    path = str(tmp_path / "ps.csv")
    status, out, err = mlscale("sweep", SUITE, "--np", "3", "--ranks", "1:3", "--sizes", "7", "--iters", "2",
                               "--warmup", "1", "--csv", path, MLSCALE_PS_STALENESS="1")
    assert status == 0, err
    rows = rows_of(path)
    assert sorted((row["variant"], row["ranks"]) for row in rows) == [
        ("async", "2"), ("async", "3"), ("ssp", "2"), ("ssp", "3"), ("sync", "2"), ("sync", "3")]
    assert {row["wrong"] for row in rows} == {"0"}
    assert {row["suite"] for row in rows} == {"ps"}
    assert all(float(row["items_per_s"]) > 0 for row in rows)
    for row in rows:
        params = json.loads(row["params"])
        assert row["metric"] == ("comm_share" if row["variant"] == "sync" else "max_staleness")
        assert (params["servers"], params["workers"], params["model"]) == (1, int(row["ranks"]) - 1, "mlp")
        assert params["bound"] == {"sync": 0, "ssp": 1, "async": None}[row["variant"]]
        if row["variant"] == "ssp":
            assert params["max_staleness"] <= 1
        assert_rates(row, dense_flops(7, mlp_widths(784)), params["workers"])  # the servers compute no gradient
    assert "skipped sync on 1 ranks" in out


def test_two_servers_in_float32(tmp_path):
    path = str(tmp_path / "ps.csv")
    status, _, err = mlscale("sweep", SUITE, "--np", "3", "--variants", "sync,ssp", "--sizes", "5", "--iters", "1",
                             "--warmup", "0", "--dtype", "float32", "--csv", path, MLSCALE_PS_SERVERS="2")
    assert status == 0, err
    rows = rows_of(path)
    assert len(rows) == 2 and {row["wrong"] for row in rows} == {"0"}
    assert {json.loads(row["params"])["servers"] for row in rows} == {2}


def test_impossible_settings_are_input_errors(tmp_path):
    path = str(tmp_path / "ps.csv")
    status, _, err = mlscale("sweep", SUITE, "--np", "2", "--variants", "sync", "--sizes", "8", "--csv", path,
                             MLSCALE_PS_SERVERS="2")
    assert status == 2 and "servers" in err
    status, _, err = mlscale("sweep", SUITE, "--np", "2", "--sizes", "8", "--csv", path, MLSCALE_PS_MODEL="rnn")
    assert status == 2 and "MLSCALE_PS_MODEL" in err


def test_rank_and_batch_checks(monkeypatch):
    case = ParameterServerSuite()
    case.check_ranks(2, "sync")
    with pytest.raises(InputError, match="ranks"):
        case.check_ranks(1, "ssp")
    with pytest.raises(InputError, match="global batch"):
        case.setup(SimpleNamespace(size=3, rank=0), 1, "async", get_backend("numpy"), "float64")
    monkeypatch.setenv("MLSCALE_PS_SERVERS", "3")
    with pytest.raises(InputError, match="servers"):
        ParameterServerSuite().check_ranks(3, "async")
    monkeypatch.setenv("MLSCALE_PS_STALENESS", "-1")
    with pytest.raises(InputError, match="MLSCALE_PS_STALENESS"):
        ParameterServerSuite()
