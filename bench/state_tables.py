"""The node's two handoff states in the message tables `bench.message_tables` measures.

Each sample of the tables follows a handoff probe (`bench.message_tables.handoff_prober`: an exchange of 1 MiB
each rank has just written). On this 2-core VM the probe ran in one of two states that flipped every few to 20
seconds, 5x apart (medians 91 and 467 us), and every message moved with it: MPI_Reduce_scatter of 8 B on 2 ranks
was priced 8-77 % slow by tables of the other state. `reference_state` says which samples lie in the state most
of them saw: the tables at the top of a calibration. `other_state_tables` makes the tables of the other state
from the samples taken in it, where they cover enough of the entries: the report prices a point whose own probe
lies nearer that state with them (`bench.report.model.calibration_in_state`).
"""
import bisect

import numpy as np

#: A probe more than this many times the fastest one is in the other state (the two were 5x apart here; the
#: probes of one state spanned 2.2x at most, transitions aside).
STATE_GAP = 2.0
#: The other state's tables are kept when at least this share of each table's entries has a sample in it (a
#: calibration here took 93 of its 600 samples in the other state, spread over the tables).
MIN_COVERAGE = 0.25


def reference_state(probes):
    """Which of the handoff ``probes`` (seconds) lie in the state most of them saw, as booleans: those within
    `STATE_GAP` times the fastest, or, when they are fewer than half, the others."""
    values = np.asarray(probes, float)
    fast = values <= STATE_GAP * values.min()
    return fast if 2 * fast.sum() >= len(values) else ~fast


def other_state_tables(reference, other):
    """The tables of the other state, ``{table: [[n, seconds], ...]}`` as ``reference`` (the reference state's),
    from ``other`` (the same shape, None where the other state has no sample): an entry without one is its
    reference seconds times the other / reference ratio of the nearest size of its table measured in both (the
    reference seconds in a table with none); None when some table has a sample in fewer than `MIN_COVERAGE` of
    its entries."""
    if any(sum(seconds is not None for _, seconds in table) < MIN_COVERAGE * len(table) for table in other.values()):
        return None
    return {name: _filled(reference[name], table) for name, table in other.items()}


def _filled(reference, other):
    both = [(n, seconds / base) for (n, base), (_, seconds) in zip(reference, other) if seconds is not None]
    sizes = [n for n, _ in both]

    def ratio(n):
        if not both:
            return 1.0
        at = bisect.bisect_left(sizes, n)
        near = [i for i in (at - 1, at) if 0 <= i < len(both)]
        return both[min(near, key=lambda i: abs(np.log(sizes[i] / n)))][1]
    return [[n, seconds if seconds is not None else base * ratio(n)] for (n, base), (_, seconds) in zip(reference, other)]
