"""Size and rank-list parsing."""
import pytest

from bench import units
from bench.units import format_size, parse_ranks, parse_sizes
from kernels.errors import InputError


def test_range_gives_powers_of_two_between_bounds():
    assert parse_sizes("8:64") == [8, 16, 32, 64]
    assert parse_sizes("100:1K") == [128, 256, 512, 1024]
    assert parse_sizes("1M:4M") == [1 << 20, 1 << 21, 1 << 22]


def test_list_keeps_order_and_suffixes():
    assert parse_sizes("4K,1k,3") == [4096, 1024, 3]
    assert parse_sizes("2G") == [2 << 30]


@pytest.mark.parametrize("text", ["", "8:", "x", "1T", "64:8", "9:15", "1.5K"])
def test_bad_sizes(text):
    with pytest.raises(InputError):
        parse_sizes(text)


def test_ranks():
    assert parse_ranks("1:4", 4) == [1, 2, 3, 4]
    assert parse_ranks("4,1,2,2", 4) == [1, 2, 4]


@pytest.mark.parametrize("text", ["0", "1,x", "3:1", "5"])
def test_bad_ranks(text):
    with pytest.raises(InputError):
        parse_ranks(text, 4)


def test_format_size():
    assert [format_size(v) for v in (8, 1024, 1536, 1 << 20, 3 << 30)] == ["8", "1K", "1536", "1M", "3G"]


def test_a_huge_rank_range_is_refused_before_its_counts_are_listed():
    import tracemalloc

    tracemalloc.start()
    try:
        for text in ("1:10000000", "1:1000000000"):
            with pytest.raises(InputError, match="rank counts, more than"):
                parse_ranks(text, 1 << 40)
        with pytest.raises(InputError, match="MPI job has 4"):
            parse_ranks("1:1000000000", 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert parse_ranks(f"1:{units.MAX_RANK_COUNTS}", 1 << 40)[-1] == units.MAX_RANK_COUNTS


def test_a_reversed_rank_range_says_so():
    with pytest.raises(InputError, match="lower bound is above"):
        parse_ranks("3:1", 4)


def test_sizes_beyond_int64_are_refused_and_ranges_stay_short():
    with pytest.raises(InputError, match="too large"):
        parse_sizes("1:99999999999999999999G")
    with pytest.raises(InputError, match="too large"):
        parse_sizes("8," + "9" * 40)
    assert parse_sizes("1:8G") == [1 << e for e in range(34)]
    assert parse_sizes("0:3") == [1, 2] and parse_sizes("5:8") == [8]
