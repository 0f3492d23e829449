"""Parsing and printing sizes (``8:64M``, ``1K,4K``) and rank lists (``1,2,4``, ``1:4``)."""
import re

from kernels.errors import InputError

SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_NUMBER = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.IGNORECASE)


def parse_size(text):
    """Return the integer ``text`` names: digits with an optional K, M or G (powers of 1024)."""
    match = _NUMBER.match(text)
    if not match:
        raise InputError(f"malformed size {text!r}: expected digits with an optional K, M or G suffix")
    return int(match.group(1)) * SUFFIXES[match.group(2).upper()]


def parse_sizes(text):
    """Sizes from ``LO:HI`` (every power of two in [LO, HI]) or a comma list (``1K,4K,100``)."""
    if ":" in text:
        low_text, _, high_text = text.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise InputError(f"malformed sizes {text!r}: the lower bound is above the upper one")
        power = 1
        while power < low:
            power *= 2
        sizes = []
        while power <= high:
            sizes.append(power)
            power *= 2
        if not sizes:
            raise InputError(f"sizes {text!r} contain no power of two")
        return sizes
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise InputError("no sizes given")
    return sizes


def parse_ranks(text, job_size):
    """Rank counts from a comma list (``1,2,4``) or a range (``1:4`` is 1, 2, 3, 4).

    Raises `InputError` for malformed text, counts below 1, or counts above ``job_size``.
    """
    try:
        if ":" in text:
            low, _, high = text.partition(":")
            counts = list(range(int(low), int(high) + 1))
        else:
            counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"malformed rank list {text!r}: expected e.g. 1,2,4 or 1:4") from None
    if not counts or min(counts) < 1:
        raise InputError(f"malformed rank list {text!r}: rank counts must be >= 1")
    if max(counts) > job_size:
        raise InputError(f"asked for {max(counts)} ranks but the MPI job has {job_size}; start it with more (--np)")
    return sorted(set(counts))


def format_size(value):
    """``1048576 -> '1M'``, ``1536 -> '1536'``: the largest suffix that divides exactly."""
    for suffix in ("G", "M", "K"):
        if value and value % SUFFIXES[suffix] == 0:
            return f"{value // SUFFIXES[suffix]}{suffix}"
    return str(value)
