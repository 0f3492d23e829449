"""What `bench.sweep.run_sweep` returns (`SweepResult`): the notes on what it skipped, the points it did not
measure, the wrong elements; the configuration is left as it was given."""
import dataclasses

import pytest

from bench.sweep import SweepConfig, SweepResult, plan_points, run_sweep
from kernels.errors import InputError
from tests.fake_cases import AlwaysWrong, TinyCase


class OddRanksOnly(TinyCase):
    """A case that cannot run on even rank counts."""

    def check_ranks(self, ranks, variant):
        if ranks % 2 == 0:
            raise InputError(f"odd rank counts only, not {ranks}")


def config_for(comm, path, ranks, **options):
    return SweepConfig(suite="fake", variants=["only"], sizes=[4, 8], ranks=ranks, csv_path=comm.bcast(str(path)),
                       dtype="float64", **options)


def test_plan_points_returns_its_notes_and_leaves_the_config_alone():
    config = SweepConfig(suite="fake", variants=["only"], sizes=[4], ranks=[1, 2, 3], csv_path="unused.csv",
                         dtype="float64")
    before = dataclasses.asdict(config)
    plan, notes = plan_points(OddRanksOnly(), config)
    assert plan == [(1, "only"), (3, "only")] and notes == ["skipped only on 2 ranks: odd rank counts only, not 2"]
    assert dataclasses.asdict(config) == before


@pytest.mark.mpi(min_size=1)
def test_the_result_holds_the_skipped_pairs_and_the_wrong_elements(comm, tmp_path):
    ranks = list(range(1, comm.size + 1))
    config = config_for(comm, tmp_path / "odd.csv", ranks)
    before = dataclasses.asdict(config)
    result = run_sweep(comm, OddRanksOnly(), config, emit=lambda row: None)
    assert isinstance(result, SweepResult) and (result.wrong, result.not_measured) == (0, 0)
    assert [note for note in result.skipped if note.startswith("skipped")] == [
        f"skipped only on {count} ranks: odd rank counts only, not {count}" for count in ranks if count % 2 == 0]
    assert dataclasses.asdict(config) == before
    wrong = run_sweep(comm, AlwaysWrong(), config_for(comm, tmp_path / "wrong.csv", [comm.size]),
                      emit=lambda row: None)
    assert (wrong.wrong, wrong.not_measured) == (2 * comm.size, 0)  # one per rank and point


@pytest.mark.mpi(min_size=1)
def test_the_result_counts_the_points_a_time_limit_left_out(comm, tmp_path):
    rows = []
    config = config_for(comm, tmp_path / "late.csv", [comm.size], time_limit=-1.0)  # every point ends past it
    result = run_sweep(comm, TinyCase(), config, emit=rows.append)
    assert (result.not_measured, result.wrong, rows) == (2, 0, [])
