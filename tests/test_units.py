"""Size and rank-list parsing."""
import pytest

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
