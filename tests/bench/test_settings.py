"""Settings declared per suite: resolution, validation, the key and column, warnings, ``mlscale list``."""
import argparse
import json
import os

import pytest

from bench.options import add_measure_options, make_config
from bench.registry import SUITES, case_class
from bench.settings import Setting, canonical, choice, flag, integer, resolve
from kernels.errors import InputError
from tests.clitools import mlscale, rows_of

DECLARED = (Setting("DP_MODEL", choice, "mlp", ("mlp", "cnn"), "model"),
            Setting("DP_MICRO_BATCHES", integer, 1, 1, "micro-batches"),
            Setting("DP_FLAG", flag, False, None, "a flag"))


def parse_measure_options(*argv):
    parser = argparse.ArgumentParser()
    add_measure_options(parser)
    return parser.parse_args(list(argv))


def test_set_wins_over_the_environment_and_defaults_stay_out_of_the_key():
    settings = resolve(DECLARED, ["dp_model=CNN", "MLSCALE_DP_FLAG=yes"],
                       {"MLSCALE_DP_MODEL": "mlp", "MLSCALE_DP_MICRO_BATCHES": "1"}, "dp")
    assert dict(settings) == {"DP_MODEL": "cnn", "DP_MICRO_BATCHES": 1, "DP_FLAG": True}
    assert settings.column() == '{"MLSCALE_DP_FLAG": "1", "MLSCALE_DP_MODEL": "cnn"}'
    assert settings.assignments() == ["DP_FLAG=1", "DP_MODEL=cnn"]
    assert resolve(DECLARED, ["DP_MODEL=mlp"], {}, "dp").column() == "{}"


@pytest.mark.parametrize("assignment, message", [
    ("DP_MODLE=cnn", "--set DP_MODLE: not a setting of suite 'dp' (its settings are DP_MODEL, DP_MICRO_BATCHES, "
                     "DP_FLAG); did you mean DP_MODEL?"),
    ("NOTHING_LIKE_IT=1", "not a setting of suite 'dp'"),
    ("DP_MODEL", "--set 'DP_MODEL': expected NAME=VALUE"),
    ("DP_MODEL=rnn", "MLSCALE_DP_MODEL='rnn': choose from mlp, cnn"),
    ("DP_MICRO_BATCHES=0", "MLSCALE_DP_MICRO_BATCHES='0': expected an integer >= 1"),
    ("DP_FLAG=2", "MLSCALE_DP_FLAG='2': expected 0 or 1"),
])
def test_unknown_names_and_bad_values_are_input_errors(assignment, message):
    with pytest.raises(InputError) as caught:
        resolve(DECLARED, [assignment], {}, "dp")
    assert message in str(caught.value)


def test_stray_variables_of_the_suite_prefix_warn_and_others_are_ignored():
    environ = {"MLSCALE_DP_MODLE": "cnn", "MLSCALE_PP_WIDTH": "oops", "MLSCALE_DEBUG": "1", "MLSCALE_GRID": "x"}
    settings = resolve(DECLARED, (), environ, "dp")
    assert settings.warnings == ["MLSCALE_DP_MODLE is not a setting of suite 'dp': ignored; "
                                 "did you mean MLSCALE_DP_MODEL?"]
    assert settings.column() == "{}"


def test_set_reaches_the_case_without_touching_the_environment(monkeypatch):
    monkeypatch.delenv("MLSCALE_PP_WIDTH", raising=False)
    monkeypatch.setenv("MLSCALE_PP_LAYERS", "not a number")  # --set wins: never parsed
    before = {name: value for name, value in os.environ.items() if name.startswith("MLSCALE_")}
    case, _ = make_config(parse_measure_options("pp", "--set", "PP_WIDTH=24", "--set", "PP_LAYERS=3"), 2)
    assert (case.width, case.layers, case.settings["PP_BALANCE"]) == (24, 3, None)  # None: derived per model
    assert {name: value for name, value in os.environ.items() if name.startswith("MLSCALE_")} == before


def test_every_suite_declares_valid_unique_settings():
    for name in SUITES:
        case = case_class(name)
        assert case.description and case.description.count("\n") == 0, name
        names = [setting.name for setting in case.declared_settings]
        assert len(names) == len(set(names)), name
        for setting in case.declared_settings:
            assert setting.help and not setting.name.startswith("MLSCALE_"), setting
            if setting.default is not None:
                assert setting.parse(canonical(setting.default)) == setting.default, setting
        defaults = resolve(case.declared_settings, (), {}, name)
        assert defaults.column() == "{}" and not defaults.warnings, name


def test_unknown_set_name_is_one_line_with_status_2():
    status, out, err = mlscale("sweep", "dp", "--np", "1", "--set", "DP_MODLE=cnn")
    assert (status, out) == (2, "")
    assert err.splitlines() == ["mlscale: error: --set DP_MODLE: not a setting of suite 'dp' (its settings are "
                                "DP_MODEL, DP_OPTIMIZER, DP_COMPUTE, DP_DATASET, DP_BUCKET_BYTES, DP_PRECISION, "
                                "DP_MICRO_BATCHES, DP_ZERO_COLLECTIVES); "
                                "did you mean DP_MODEL?"]


def test_only_the_suites_own_settings_enter_the_column(tmp_path):
    """A variable of another suite left in the shell keeps the key; the suite's own changes it."""
    path = str(tmp_path / "gemv.csv")
    common = ("run", "gemv", "--variants", "2d", "--sizes", "8", "--iters", "1", "--warmup", "0", "--csv", path)
    status, _, err = mlscale(*common, MLSCALE_DP_MODEL="cnn", MLSCALE_PP_WIDTH="nonsense")
    assert status == 0, err
    status, out, err = mlscale(*common, MLSCALE_DP_MODEL="mlp")
    assert status == 0 and "nothing measured" in out, err
    status, _, err = mlscale(*common, "--set", "grid=1X1")
    assert status == 0, err
    assert [row["settings"] for row in rows_of(path)] == ["{}", json.dumps({"MLSCALE_GRID": "1x1"})]


def test_a_misspelt_variable_of_the_suite_is_a_warning(tmp_path):
    status, _, err = mlscale("run", "gemm", "--variants", "numpy", "--sizes", "8", "--iters", "1", "--warmup", "0",
                             "--csv", str(tmp_path / "g.csv"), MLSCALE_GEMM_PANLE="8")
    assert status == 0
    assert err.splitlines() == ["mlscale: warning: MLSCALE_GEMM_PANLE is not a setting of suite 'gemm': ignored; "
                                "did you mean MLSCALE_GEMM_PANEL?"]


def test_list_survives_a_bad_value_of_one_suite_and_shows_declarations():
    status, out, err = mlscale("list", MLSCALE_DP_MODEL="rnn", MLSCALE_GRID="2by2")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "p2p: variants latency, bandwidth; backends numpy, cupy"
    assert sum(line.startswith(f"{name}: variants ") for line in lines for name in SUITES) == len(SUITES)
    status, out, err = mlscale("list", "dp", MLSCALE_DP_MODEL="rnn")
    assert status == 0, err
    assert out.startswith("dp: variants keras, mpi, mpi_overlap, ")
    assert "Data-parallel training steps" in out and "Settings (`SETTINGS`)" not in out
    rows = [line.split() for line in out.splitlines()]
    assert ["DP_MODEL", "mlp", "mlp|cnn|keras_cnn", "model"] == rows[-8][:4]
    assert ["DP_MICRO_BATCHES", "1", "integer", ">=", "1"] == rows[-2][:5]
    assert ["DP_ZERO_COLLECTIVES", "mpi", "mpi|ring|auto"] == rows[-1][:3]
    status, out, _ = mlscale("list", "p2p")
    assert status == 0 and out.splitlines()[-1] == "    settings: none"
    status, out, _ = mlscale("list", "allreduce")
    assert status == 0 and out.splitlines()[-1].split()[:3] == ["COLL_OP", "sum", "sum|max"]
