"""The ``attention`` suite end to end through the command line, and its check catching wrong results."""
import json

import numpy as np
import pytest
from mpi4py import MPI

from bench.cases.attention import Attention, draw_tokens
from kernels.backend import get_backend
from kernels.errors import InputError
from tests.bench.flops_rows import assert_rates
from tests.clitools import mlscale, rows_of

SUITE = "bench.cases.attention:Attention"


def test_causal_forward_and_backward_sweep(tmp_path):
    path = str(tmp_path / "attention.csv")
    status, _, err = mlscale("sweep", SUITE, "--np", "2", "--ranks", "1,2", "--sizes", "37", "--iters", "1",
                             "--warmup", "0", "--csv", path, MLSCALE_ATTN_CAUSAL="1", MLSCALE_ATTN_BACKWARD="1",
                             MLSCALE_ATTN_HEADS="2", MLSCALE_ATTN_DIM="8", MLSCALE_ATTN_TILE="5",
                             MLSCALE_ATTN_KEY_TILE="7")
    assert status == 0, err
    rows = rows_of(path)
    assert sorted((row["variant"], row["ranks"]) for row in rows) == sorted(
        (variant, ranks) for variant in Attention.variants for ranks in ("1", "2"))
    assert {row["wrong"] for row in rows} == {"0"} and {row["size_unit"] for row in rows} == {"tokens"}
    for row in rows:
        params = json.loads(row["params"])
        settings = (params["heads"], params["dim"], params["causal"], params["backward"], params["tiles"])
        assert settings == (2, 8, True, True, [5, 7])
        assert row["metric"] == "imbalance" and float(row["metric_value"]) >= 1.0
        assert float(row["items_per_s"]) > 0 and len(params["compute_s_per_rank"]) == int(row["ranks"])
        assert params["computing_ranks"] == (1 if row["variant"] == "full" else int(row["ranks"]))
        assert_rates(row, (4 + 10) * 37 * 37 * 2 * 8 / 2, params["computing_ranks"])  # causal: half the scores
        if row["ranks"] == "2" and row["variant"] != "full":
            assert min(params["bytes_sent_per_rank"]) > 0


def test_float32_forward_records_memory_and_skips_impossible_ulysses(tmp_path):
    path = str(tmp_path / "attention.csv")
    status, out, err = mlscale("sweep", SUITE, "--np", "3", "--ranks", "3", "--sizes", "50", "--iters", "1",
                               "--warmup", "0", "--dtype", "float32", "--csv", path, MLSCALE_ATTN_DIM="4")
    assert status == 0, err
    rows = rows_of(path)
    assert [row["variant"] for row in rows] == ["full", "ring", "ring_zigzag"]
    assert "skipped ulysses on 3 ranks" in out
    peaks = {row["variant"]: json.loads(row["params"])["peak_mem_mb_per_rank"] for row in rows}
    assert {row["metric"] for row in rows} == {"peak_mem_mb"} and {row["wrong"] for row in rows} == {"0"}
    assert peaks["full"][0] > max(peaks["full"][1:]) and min(peaks["ring"]) > 0


@pytest.mark.parametrize("args, environment, message", [
    (["--variants", "ulysses"], {}, "divisible"),
    ([], {"MLSCALE_ATTN_CAUSAL": "2"}, "MLSCALE_ATTN_CAUSAL"),
    ([], {"MLSCALE_ATTN_HEADS": "0"}, "MLSCALE_ATTN_HEADS"),
])
def test_impossible_settings_are_input_errors(tmp_path, args, environment, message):
    status, _, err = mlscale("sweep", SUITE, "--np", "3", "--sizes", "8", "--csv", str(tmp_path / "a.csv"), *args,
                             **environment)
    assert status == 2 and message in err


@pytest.mark.parametrize("variant", Attention.variants)
def test_check_counts_wrong_elements(monkeypatch, variant):
    """On one rank, a correct run checks clean; a corrupted output row, lse or gradient does not."""
    monkeypatch.setenv("MLSCALE_ATTN_BACKWARD", "1")
    monkeypatch.setenv("MLSCALE_ATTN_CAUSAL", "1")
    case = Attention()
    state = case.setup(MPI.COMM_SELF, 45, variant, get_backend("numpy"), "float64")
    case.run(state)
    case.run(state)
    assert case.check(state) == 0
    metrics = case.metrics(state, 1.0)
    assert metrics.metric == "imbalance" and metrics.metric_value == 1.0 and metrics.items_per_s == 45
    for index in range(5):
        saved = state.result[index].copy()
        state.result[index][0, -1] += 1e-6
        assert case.check(state) >= 1
        state.result[index][...] = saved


def test_tokens_do_not_depend_on_the_split():
    whole = draw_tokens([(0, 1100)], 2, 3, np.float64)
    pieces = draw_tokens([(700, 1100), (3, 600)], 2, 3, np.float64)
    np.testing.assert_array_equal(pieces, np.concatenate([whole[:, :, 700:], whole[:, :, 3:600]], axis=2))


def test_bad_sizes_and_backends():
    case = Attention()
    with pytest.raises(InputError, match="at least one token"):
        case.setup(MPI.COMM_SELF, 0, "ring", get_backend("numpy"), "float64")
    case.check_ranks(4, "ulysses")
    with pytest.raises(InputError, match="divisible"):
        case.check_ranks(3, "ulysses")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("causal", ["0", "1"])
@pytest.mark.parametrize("variant", Attention.variants)
def test_every_variant_runs_and_checks_on_the_device(comm, monkeypatch, device_backend, variant, causal):
    """Setup, run, check on device arrays (23 tokens: uneven shards and tiles; 12 heads divide by 1-4 ranks)."""
    for name, value in dict(BACKWARD="1", CAUSAL=causal, HEADS="12", DIM="4", TILE="8", KEY_TILE="11").items():
        monkeypatch.setenv(f"MLSCALE_ATTN_{name}", value)
    case = Attention()
    state = case.setup(comm, 23, variant, device_backend, "float64")
    case.run(state)
    case.run(state)
    on_device = all(device_backend.is_device_array(array) for array in state.result)
    assert len(state.result) == 5 and comm.allreduce(int(on_device)) == comm.size
    assert comm.allreduce(case.check(state)) == 0
    assert case.metrics(state, 1.0).items_per_s == 23
