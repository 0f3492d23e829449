"""What the tests of the hand-written collectives share: dtypes, lengths and exact inputs, refusals, roots,
and the inspection of cached plans (persistent requests) with the test of repeated calls built on it."""
import itertools
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

from parallel.collectives import plans, release_plans
from parallel.collectives.base import reduce_ufunc
from tests.mpitools import all_ranks, combination

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.complex128, np.uint8]
#: Lengths by rule, for tests that run on several communicators: "p-1", "p" and "p+1" from the rank count,
#: "100KiB" about 100 KiB of the dtype (`length_by_rule`).
LENGTH_RULES = [0, 1, "p-1", "p", "p+1", 7, 1003, "100KiB"]


def length_by_rule(rule, p, dtype):
    """The length a rule of `LENGTH_RULES` (or a plain length) gives on ``p`` ranks for ``dtype``."""
    rules = {"p-1": p - 1, "p": p, "p+1": p + 1, "100KiB": (100 << 10) // np.dtype(dtype).itemsize}
    return rules.get(rule, rule)


def lengths(comm, dtype):
    """The lengths every collective is tested at: empty, below, at and above ``p``, uneven, and about
    100 KiB of ``dtype`` (3 items past a multiple of every rank count up to 8)."""
    p = comm.size
    return [0, 1, p - 1, p, p + 1, 7, 1003, (100 << 10) // np.dtype(dtype).itemsize // 840 * 840 + 3]


def exact_values(n, dtype, seed=0):
    """Small non-negative integers of ``dtype`` (complex ones with an imaginary part), changing with ``seed``."""
    values = (np.arange(n) * 7 + seed * 13) % 101
    if np.dtype(dtype).kind == "c":
        return (values + 1j * (values % 5)).astype(dtype)
    return values.astype(dtype)


def ops_of(dtype):
    """The reductions a dtype is tested with: "sum", and "max" unless it is complex."""
    return ["sum"] if np.dtype(dtype).kind == "c" else ["sum", "max"]


def contribution(rank, n, dtype, call=0):
    """Rank ``rank``'s exact input (small integers; a call number changes it, so a stale result shows)."""
    return exact_values(n, dtype, seed=rank + 5 * call)


def reference(p, n, dtype, op, call=0):
    """The reduction over ``p`` ranks of `contribution`, in ``dtype`` (sums of uint8 wrap as the algorithms' do)."""
    stacked = np.array([contribution(rank, n, dtype, call) for rank in range(p)]).reshape(p, n)
    return reduce_ufunc(op).reduce(stacked, axis=0, dtype=dtype)


def roots(comm):
    """The first, the last and a middle rank."""
    return sorted({0, comm.size // 2, comm.size - 1})


def read_only(n):
    """A vector of ``n`` zeros that cannot be written."""
    array = np.zeros(n)
    array.setflags(write=False)
    return array


def refusals():
    """``(sendbuf, recvbuf, op, error, message)``: calls on one rank (vectors of 4 items) that every reducing
    collective refuses, whatever its layout of ``recvbuf``."""
    return [
        (np.zeros(4, np.float32), np.zeros(4), "sum", TypeError, "float32"),
        (np.zeros(4), read_only(4), "sum", ValueError, "read-only"),
        (np.zeros(4, bool), np.zeros(4, bool), "sum", TypeError, "supported"),
        (np.zeros((2, 2)), np.zeros(4), "sum", ValueError, "1-D"),
        (np.zeros(8)[::2], np.zeros(4), "sum", ValueError, "contiguous"),
        ([0.0] * 4, np.zeros(4), "sum", TypeError, "buffer"),
        (np.zeros(4), np.zeros(4), "prod", ValueError, "unknown reduction op"),
        (np.zeros(4), np.zeros(4), MPI.MIN, ValueError, "unknown reduction op"),
        (np.zeros(4, complex), np.zeros(4, complex), "max", TypeError, "max"),
    ]


def assert_refusals(call, cases, name):
    """Each case ``(*arguments, error, message)`` makes ``call(*arguments)`` raise ``error`` matching
    ``message``; a failure names ``name`` and the message."""
    for *arguments, error, message in cases:
        with combination(name, message), pytest.raises(error, match=message):
            call(*arguments)


def plans_of(comm):
    """The cached plans (`parallel.collectives.plans`) of ``comm``."""
    return [entry for entry in plans._CACHE.values() if isinstance(entry, plans._Plan) and entry.comm == comm]


@contextmanager
def duplicate_without_plans(comm):
    """A duplicate of ``comm`` with no cached plans, released and freed afterwards."""
    dup = comm.Dup()
    try:
        yield dup
    finally:
        release_plans(dup)
        dup.Free()


def requests_released(comm, run):
    """``run()`` twice (the second on persistent requests where a plan has messages), then `release_plans`:
    whether the requests were made (or there were no messages to make them for) and are freed now."""
    run()
    run()
    requests = [request for plan in plans_of(comm) for request in plan.requests]
    made = bool(requests) or comm.size == 1
    release_plans(comm)
    return made and all(request == MPI.REQUEST_NULL for request in requests) and not plans_of(comm)


def plan_cases(comm, rooted=False):
    """The cases of a persistent-plan test, as dicts: ``n`` 1, ``p + 1`` and 1003, ``root`` each of `roots`
    (when ``rooted``), ``in_place`` False and True."""
    axes = {"n": [1, comm.size + 1, 1003], **({"root": roots(comm)} if rooted else {}), "in_place": [False, True]}
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def assert_repeats_until_released(comm, algorithm, session, rooted=False):
    """The persistent-plan test of a collective, for each case of `plan_cases` on a duplicate of ``comm``
    without plans.

    ``session(fresh, **case)`` calls the collective several times on the same buffers (their contents
    changing between calls) and returns ``(verdicts, repeat)``: one verdict per call, and ``repeat()``, one
    more call on those buffers. Every verdict must hold and ``repeat`` must run on persistent requests
    that `release_plans` frees (`requests_released`), on every rank; a failure names ``algorithm`` and the
    case.
    """
    for case in plan_cases(comm, rooted):
        with combination(algorithm, *(f"{name}={value}" for name, value in case.items())), \
                duplicate_without_plans(comm) as fresh:
            verdicts, repeat = session(fresh, **case)
            released = requests_released(fresh, repeat)          # collective: on every rank, whatever the verdicts
            assert all_ranks(fresh, all(verdicts) and released)
