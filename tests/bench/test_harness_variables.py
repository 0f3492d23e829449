"""``MLSCALE_*`` variables: the harness's own, the suites' prefixes, and the typos neither knows."""
import pytest

from bench.faults import AGREE_GRACE_SECONDS, agree_grace_seconds, grace_seconds
from bench.registry import SUITES, case_class
from bench.settings import HARNESS_VARIABLES, SUITE_PREFIXES, resolve


def test_the_suite_prefixes_are_the_first_words_of_every_suites_settings():
    words = {setting.name.split("_")[0] for suite in SUITES for setting in case_class(suite).declared_settings}
    assert words == set(SUITE_PREFIXES)


def _warnings(suite, **environ):
    return resolve(case_class(suite).declared_settings, (), environ, suite).warnings


@pytest.mark.parametrize("suite, environ, expected", [
    ("allreduce", {"MLSCALE_GIRD": "2x1"}, ["MLSCALE_GIRD is not a variable of mlscale: ignored; did you mean "
                                            "MLSCALE_GRID?"]),
    ("gemm", {"MLSCALE_DEBGU": "1"}, ["MLSCALE_DEBGU is not a variable of mlscale: ignored; did you mean "
                                      "MLSCALE_DEBUG?"]),
    ("gemm", {"MLSCALE_NOTHING_LIKE_IT": "1"}, ["MLSCALE_NOTHING_LIKE_IT is not a variable of mlscale: ignored"]),
    ("gemm", {"MLSCALE_GEMM_PANL": "3"}, ["MLSCALE_GEMM_PANL is not a setting of suite 'gemm': ignored; did you "
                                          "mean MLSCALE_GEMM_PANEL?"]),
    ("allreduce", {"MLSCALE_DP_MODEL": "cnn", "MLSCALE_GRID": "2x1", "MLSCALE_MPIEXEC": "mpirun"}, []),
    ("allreduce", {"MLSCALE_GRACE_SECONDS": "2.5", "PATH": "/bin", "MLSCALEX": "1"}, []),
    ("p2p", {"MLSCALE_GRACE_SECONDS": "soon"}, ["MLSCALE_GRACE_SECONDS='soon': expected a positive number of "
                                                 "seconds; 10 used"]),
])
def test_a_variable_no_suite_nor_the_harness_knows_is_a_warning_with_the_close_match(suite, environ, expected):
    assert _warnings(suite, **environ) == expected


@pytest.mark.parametrize("text, seconds", [("1", 1.0), ("0.25", 0.25), ("0", None), ("-3", None), ("nan", None),
                                           ("inf", None), ("ten", None), (None, None)])
def test_grace_seconds_are_positive_and_finite(text, seconds):
    assert grace_seconds(text) == seconds


def test_the_grace_comes_from_the_environment_or_the_default(monkeypatch):
    assert "MLSCALE_GRACE_SECONDS" in HARNESS_VARIABLES
    monkeypatch.setenv("MLSCALE_GRACE_SECONDS", "0.5")
    assert agree_grace_seconds() == 0.5
    monkeypatch.setenv("MLSCALE_GRACE_SECONDS", "-1")
    assert agree_grace_seconds() == AGREE_GRACE_SECONDS
