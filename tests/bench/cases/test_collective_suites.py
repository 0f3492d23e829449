"""The suites allgather, reduce_scatter, alltoall, bcast and reduce: every variant set up, run, checked and
torn down as the harness does, on every rank count, in place and out of place, with uneven counts."""
import itertools
import json

import numpy as np
import pytest

from bench.registry import get_case
from bench.settings import resolve
from kernels.backend import get_backend
from kernels.errors import InputError
from tests.clitools import mlscale, rows_of
from tests.mpitools import all_ranks, combination

SUITES = ("allgather", "reduce_scatter", "alltoall", "bcast", "reduce")


def case_of(suite, **settings):
    """The suite's case with ``COLL_*`` settings given as ``--set`` would give them."""
    cls = type(get_case(suite, resolve((), (), {}, suite)))
    given = [f"COLL_{name.upper()}={value}" for name, value in settings.items()]
    return cls(resolve(cls.declared_settings, given, {}, suite))


def point_is_right(case, comm, size, variant, dtype="float64"):
    """Set up, run twice (the second from the cached plan), check and tear down one point; the wrong elements."""
    state = case.setup(comm, size, variant, get_backend("numpy"), dtype)
    try:
        case.run(state)
        case.run(state)
        return case.check(state)
    finally:
        case.teardown(state)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("suite", SUITES)
def test_every_variant_is_right_in_and_out_of_place_with_uneven_counts(comm, suite):
    reduces, rooted = suite in ("reduce_scatter", "reduce"), suite in ("bcast", "reduce")
    ops, roots = ("sum", "max") if reduces else ("sum",), sorted({0, comm.size - 1})
    for in_place, op, root, dtype in itertools.product((0, 1), ops, roots if rooted else (0,), ("float64", "float32")):
        settings = dict(in_place=in_place, **({"op": op} if reduces else {}), **({"root": root} if rooted else {}))
        case = case_of(suite, **settings)
        for variant, count in itertools.product([v for v in case.variants if v != "nccl"], (1, 7, 1003, 0)):
            if suite == "alltoall" and in_place and count % comm.size:
                continue
            with combination(suite, variant, count, dtype, settings):
                wrong = point_is_right(case, comm, count * np.dtype(dtype).itemsize, variant, dtype)
                assert all_ranks(comm, wrong == 0)
        state = case.setup(comm, 8 * comm.size, "mpi", get_backend("numpy"), "float64")
        params = case.params(state)
        case.teardown(state)
        assert params == {key: value for key, value in dict(in_place=bool(in_place), op=op, root=root).items()
                          if key in case.model.config}


@pytest.mark.mpi(min_size=1)
def test_points_a_suite_cannot_run_are_input_errors(comm):
    with pytest.raises(InputError, match="is not a rank of"):
        case_of("bcast", root=comm.size).check_ranks(comm.size, "binomial")
    if comm.size > 1:
        with pytest.raises(InputError, match="alltoall in place needs equal blocks"):
            case_of("alltoall", in_place=1).setup(comm, 8 * (comm.size + 1), "pairwise", get_backend("numpy"),
                                                  "float64")
    with pytest.raises(InputError, match="not a whole number of float64"):
        case_of("allgather").setup(comm, 12, "ring", get_backend("numpy"), "float64")


def test_a_sweep_of_every_variant_on_1_to_3_ranks_is_valid_and_records_the_settings(tmp_path):
    path = str(tmp_path / "reduce.csv")
    status, out, err = mlscale("sweep", "reduce", "--np", "3", "--ranks", "1:3", "--sizes", "8,8008", "--iters", "2",
                               "--warmup", "0", "--csv", path, MLSCALE_COLL_ROOT="1", MLSCALE_COLL_OP="max")
    assert status == 0, err
    rows = rows_of(path)
    assert {row["variant"] for row in rows} == {"mpi", "binomial", "rabenseifner", "auto"}
    assert {row["ranks"] for row in rows} == {"2", "3"}  # root 1 is no rank of one: skipped with a note
    assert "skipped mpi on 1 ranks: MLSCALE_COLL_ROOT=1 is not a rank of 1 ranks" in out
    assert all(row["wrong"] == "0" and float(row["busbw_gbs"]) > 0 for row in rows)
    assert {json.loads(row["params"])["root"] for row in rows} == {1}


@pytest.mark.parametrize("args, message", [
    (["bcast", "--variants", "nccl"], "variant 'nccl' cannot run on numpy: NCCL runs on device buffers only"),
    (["alltoall", "--variants", "nosuch"], "unknown variant 'nosuch' for suite 'alltoall'"),
    (["allgather", "--set", "COLL_OP=max"], "--set COLL_OP: not a setting of suite 'allgather'"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, args, message):
    status, out, err = mlscale("run", *args, "--sizes", "8", "--csv", str(tmp_path / "x.csv"))
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
