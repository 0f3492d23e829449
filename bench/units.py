"""Parsing and printing sizes (``8:64M``, ``1K,4K``) and rank lists (``1,2,4``, ``1:4``)."""
import re

from kernels.errors import InputError

SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: Largest size accepted (an int64 count of bytes or elements): ranges of powers of two stay short.
MAX_SIZE = (1 << 63) - 1
#: Most rank counts one range may name (``1:4096``); a longer range is refused before it is built.
MAX_RANK_COUNTS = 4096
_NUMBER = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.IGNORECASE)


def parse_size(text):
    """Return the integer ``text`` names: digits with an optional K, M or G (powers of 1024)."""
    match = _NUMBER.match(text)
    if not match:
        raise InputError(f"malformed size {text!r}: expected digits with an optional K, M or G suffix")
    value = int(match.group(1)) * SUFFIXES[match.group(2).upper()]
    if value > MAX_SIZE:
        raise InputError(f"size {text.strip()!r} is too large (at most {MAX_SIZE}, 2^63 - 1)")
    return value


def parse_sizes(text):
    """Sizes from ``LO:HI`` (every power of two in [LO, HI]) or a comma list (``1K,4K,100``)."""
    if ":" in text:
        low_text, _, high_text = text.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise InputError(f"malformed sizes {text!r}: the lower bound is above the upper one")
        first = max(low - 1, 0).bit_length()  # 2**first is the smallest power of two >= low
        sizes = [1 << exponent for exponent in range(first, high.bit_length()) if 1 << exponent <= high]
        if not sizes:
            raise InputError(f"sizes {text!r} contain no power of two")
        return sizes
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise InputError("no sizes given")
    return sizes


def parse_ranks(text, job_size):
    """Rank counts from a comma list (``1,2,4``) or a range (``1:4`` is 1, 2, 3, 4).

    Raises `InputError` for malformed text, counts below 1, counts above ``job_size``,
    or a range of more than `MAX_RANK_COUNTS` counts. A range's bounds are checked
    before its counts are listed, so ``1:1000000000`` costs nothing.
    """
    try:
        if ":" in text:
            low, _, high = text.partition(":")
            low, high = int(low), int(high)
            bounds = [low, high]
        else:
            bounds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"malformed rank list {text!r}: expected e.g. 1,2,4 or 1:4") from None
    if not bounds or min(bounds) < 1:
        raise InputError(f"malformed rank list {text!r}: rank counts must be >= 1")
    if bounds[0] > bounds[-1] and ":" in text:
        raise InputError(f"malformed rank range {text!r}: the lower bound is above the upper one")
    if max(bounds) > job_size:
        raise InputError(f"asked for {max(bounds)} ranks but the MPI job has {job_size}; start it with more (--np)")
    if ":" not in text:
        return sorted(set(bounds))
    if high - low + 1 > MAX_RANK_COUNTS:
        raise InputError(f"rank range {text!r} names {high - low + 1} rank counts, more than {MAX_RANK_COUNTS}; "
                         f"list the counts instead, e.g. {low},{2 * low},{4 * low}")
    return list(range(low, high + 1))


def format_size(value):
    """``1048576 -> '1M'``, ``1536 -> '1536'``: the largest suffix that divides exactly."""
    for suffix in ("G", "M", "K"):
        if value and value % SUFFIXES[suffix] == 0:
            return f"{value // SUFFIXES[suffix]}{suffix}"
    return str(value)
