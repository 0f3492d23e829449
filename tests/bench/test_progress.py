"""Live progress (`bench.progress`): durations, the time-left model, the limit, the console; a fake clock."""
import io

import pytest

from bench.progress import (Console, Progress, estimate_point, format_duration, over_limit, parse_duration,
                            status_line, time_left)
from kernels.errors import InputError


class Clock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5m", 90),
                                           (" 2H ", 7200)])
def test_durations_accept_seconds_minutes_hours(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "5d", "m", "1h30m", "nan"])
def test_malformed_durations_are_input_errors(text):
    with pytest.raises(InputError, match="malformed duration"):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.2, "1s"), (59, "59s"), (65, "1m 05s"), (3599.5, "1h 00m"),
                                           (3720, "1h 02m"), (-3, "0s")])
def test_durations_print_as_hours_minutes_seconds(seconds, text):
    assert format_duration(seconds) == text


def test_status_line_names_the_point_and_the_time_left():
    assert status_line(3, 14, "smo", "2000", 2) == "[3/14] smo size=2000 ranks=2"
    assert status_line(3, 14, "smo", "2000", 2, 125) == "[3/14] smo size=2000 ranks=2  ~2m 05s left"


def test_a_point_measured_at_another_rank_count_takes_its_mean_wall():
    walls = {("ring", 64): [2.0, 4.0]}
    assert estimate_point(walls, "ring", 64) == 3.0
    assert estimate_point(walls, "tree", 64) is None


def test_an_unmeasured_size_follows_the_power_law_of_the_nearest_two():
    walls = {("gemm", 100): [1.0], ("gemm", 200): [8.0], ("gemm", 1): [0.5]}
    assert estimate_point(walls, "gemm", 400) == pytest.approx(64.0)   # n**3 from 100 and 200
    flat = {("p2p", 8): [1.0], ("p2p", 16): [1.0]}
    assert estimate_point(flat, "p2p", 1 << 20) == pytest.approx(1.0)  # latency-bound sizes stay flat
    assert estimate_point({("x", 10): [2.0]}, "x", 30) == pytest.approx(6.0)  # one size: linear
    others = {("x", 8): [0.5], ("y", 8): [0.25], ("y", 1 << 24): [1.0], ("z", 8): [1.0], ("z", 1 << 24): [2.0],
              ("w", 8): [1.0], ("w", 1 << 24): [3.0]}
    assert estimate_point(others, "x", 1 << 24) == pytest.approx(1.5)  # one size: the others' median growth (3x)


def test_the_exponent_is_clamped_to_0_and_3():
    shrinking = {("v", 10): [4.0], ("v", 20): [1.0]}
    assert estimate_point(shrinking, "v", 40) == pytest.approx(1.0)
    steep = {("v", 10): [1.0], ("v", 20): [1000.0]}
    assert estimate_point(steep, "v", 40) == pytest.approx(8000.0)


def test_time_left_is_unknown_until_every_pending_variant_ran():
    walls = {("a", 8): [1.0]}
    assert time_left(walls, [(1, "a", 8), (2, "a", 8)]) == 2.0
    assert time_left(walls, [(1, "a", 8), (1, "b", 8)]) is None
    assert time_left(walls, []) == 0.0


def test_the_limit_counts_elapsed_time_and_the_next_estimate():
    assert not over_limit(50, 10, None)
    assert not over_limit(50, 10, 60)
    assert over_limit(50, 10.5, 60)


def test_progress_shows_each_point_then_the_time_left_once_every_variant_ran():
    clock, lines = Clock(), []
    points = [(1, "a", 8), (1, "b", 8), (2, "a", 8), (2, "b", 8)]
    progress = Progress(points, lines.append, clock=clock)
    for wall in (3.0, 5.0, 3.0, 5.0):
        assert progress.begin()
        clock.now += wall
        progress.finish()
    assert lines == ["[1/4] a size=8 ranks=1", "[2/4] b size=8 ranks=1", "[3/4] a size=8 ranks=2  ~8s left",
                     "[4/4] b size=8 ranks=2  ~5s left"]
    assert progress.not_measured == 0


def test_a_resumed_point_counts_in_k_and_shows_nothing():
    lines = []
    progress = Progress([(2, "a", 8), (2, "a", 16)], lines.append, clock=Clock())
    progress.passed()
    assert progress.begin()
    assert lines == ["[2/2] a size=16 ranks=2"]


def test_a_variant_the_backend_cannot_run_leaves_the_count():
    lines = []
    points = [(1, "numpy", 8), (1, "cupy", 8), (2, "numpy", 8), (2, "cupy", 8)]
    progress = Progress(points, lines.append, clock=Clock())
    progress.drop(1, {"cupy"})
    assert progress.begin()
    progress.finish()
    progress.drop(2, {"cupy"})
    assert progress.begin()
    assert lines[0] == "[1/3] numpy size=8 ranks=1" and lines[1].startswith("[2/2] numpy size=8 ranks=2")


def test_the_limit_stops_before_a_point_that_would_end_past_it():
    clock, lines = Clock(), []
    points = [(1, "a", 8), (2, "a", 8), (2, "b", 8), (2, "b", 16)]
    progress = Progress(points, lines.append, limit=10, clock=clock)
    assert progress.begin()          # nothing measured yet: the first point starts
    clock.now += 4
    progress.finish()
    assert progress.begin()          # 4 s elapsed + 4 s estimated <= 10 s
    clock.now += 4
    progress.finish()
    assert not progress.begin()      # variant b not run yet: the mean finished point, 8 + 4 > 10
    assert progress.stopped and progress.not_measured == 2
    assert lines == ["[1/4] a size=8 ranks=1", "[2/4] a size=8 ranks=2"]


def test_a_larger_size_is_estimated_before_the_limit_decides():
    clock = Clock()
    progress = Progress([(1, "a", 8), (1, "a", 64)], lambda line: None, limit=20, clock=clock)
    assert progress.begin()
    clock.now += 3
    progress.finish()
    assert not progress.begin()      # 3 s + 8 x 3 s (one size: linear) > 20 s


def test_the_terminal_console_rewrites_one_line_and_clears_it_before_rows():
    stream = io.StringIO()
    console = Console(stream, tty=True)
    console.line("header")
    console.status("[1/2] a")
    console.status("[2/2] a")
    console.line("row")
    assert stream.getvalue() == "header\n\r\x1b[K[1/2] a\r\x1b[K[2/2] a\r\x1b[Krow\n"


def test_a_log_gets_plain_lines():
    stream = io.StringIO()
    console = Console(stream, tty=False)
    console.status("[1/2] a")
    console.line("row")
    assert stream.getvalue() == "[1/2] a\nrow\n"
