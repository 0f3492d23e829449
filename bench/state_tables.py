"""The node's two handoff states in the message tables `bench.message_tables` measures.

Each sample of the tables follows a handoff probe (`bench.message_tables.handoff_prober`: an exchange of 1 MiB
each rank has just written). On this 2-core VM the probe ran in one of two states that flipped every few to 20
seconds, 5x apart (medians 91 and 467 us), and every message moved with it: MPI_Reduce_scatter of 8 B on 2 ranks
was priced 8-77 % slow by tables of the other state. `reference_state` says which samples lie in the state most
of them saw: the tables at the top of a calibration; `short_of_samples` which entries still lack samples in a
state, for the calibration to sample while the node is in it. `other_state_tables` makes the tables of the other state
from the samples taken in it, where they cover enough of the entries: the report prices a point whose own probe
lies nearer that state with them (`bench.report.model.calibration_in_state`).
"""
import bisect
import itertools
from collections import namedtuple

import numpy as np

#: The keys of entries short of samples in the fast and in the slow state (`short_of_samples`), and the seconds
#: that part the states (`state_threshold`).
ShortOfSamples = namedtuple("ShortOfSamples", "fast slow threshold")

#: The probes hold two states where, split in two groups (`state_threshold`), their medians lie at least this
#: factor apart: here 5x (91 and 467 us), while one state's probes spread continuously over 2-3x (84-300 us in a
#: calibration that saw one state; 280-830 us in another). A split from the fastest probe instead took the tail
#: of one state for another.
STATE_GAP = 3.0
#: A state is sought for the entries short of its samples only where at least this share of the probes lay in it
#: (in the calibrations of pass k the other state had 1-60 % of them; an outlier is not a state).
MIN_STATE_SHARE = 0.05
#: Samples after the rounds, in units of the entries, that may go to finding each entry its samples in both
#: states (about 5 s each in a full calibration's message tables here).
HUNT_ROUNDS = 4
#: The other state's tables are kept when at least this share of each table's entries has a sample in it (a
#: calibration here took 93 of its 600 samples in the other state, spread over the tables).
MIN_COVERAGE = 0.25


def state_threshold(probes):
    """The seconds that part two states among the ``probes`` (seconds): of the splits of the sorted probes in
    two, the one whose groups vary least about their means in log (one-dimensional 2-means), taken halfway (in
    log) between its groups where their medians lie `STATE_GAP` apart or more; None where they do not (one
    state) or there are fewer than two probes."""
    logs = np.sort(np.log(np.asarray(probes, float)))
    if len(logs) < 2:
        return None
    below = np.arange(1, len(logs))
    sums, squares = np.cumsum(logs), np.cumsum(logs**2)
    within = squares[-1] - sums[:-1] ** 2 / below - (sums[-1] - sums[:-1]) ** 2 / (len(logs) - below)
    split = int(np.argmin(within)) + 1
    if np.median(logs[split:]) - np.median(logs[:split]) < np.log(STATE_GAP):
        return None
    return float(np.exp((logs[split - 1] + logs[split]) / 2))


def reference_state(probes):
    """Which of the handoff ``probes`` (seconds) lie in the state most of them saw, as booleans: those at or
    below `state_threshold`, or, when they are fewer than half, the others; all where it finds one state."""
    values = np.asarray(probes, float)
    threshold = state_threshold(values)
    fast = values <= threshold if threshold is not None else np.ones(len(values), bool)
    return fast if 2 * fast.sum() >= len(values) else ~fast


def short_of_samples(probes, need):
    """`ShortOfSamples`: the keys of ``probes`` (``{key: [seconds, ...]}``, the probe before each of an entry's
    samples) with fewer than ``need`` probes at or below `state_threshold` of them all, those with fewer than
    ``need`` above it, and the threshold; each state sought only where `MIN_STATE_SHARE` of all the probes lay
    in it, none where they show one state."""
    threshold = state_threshold([value for values in probes.values() for value in values])
    if threshold is None:
        return ShortOfSamples([], [], None)
    fast = {key: sum(value <= threshold for value in values) for key, values in probes.items()}
    total, fast_total = sum(len(values) for values in probes.values()), sum(fast.values())
    seen = fast_total >= MIN_STATE_SHARE * total, total - fast_total >= MIN_STATE_SHARE * total
    return ShortOfSamples([key for key, count in fast.items() if seen[0] and count < need],
                          [key for key, count in fast.items() if seen[1] and len(probes[key]) - count < need],
                          threshold)


class StateSamples:
    """The samples of `state_samples` by key, the handoff probe before each, and whether each lies in the
    reference state (`reference_state` of all the probes)."""

    def __init__(self, samples, probes):
        self.samples, self.probes = samples, probes
        flags = iter(reference_state([value for values in probes.values() for value in values]).tolist())
        self.in_state = {key: [next(flags) for _ in values] for key, values in probes.items()}

    def kept(self):
        """``{key: [seconds, ...]}``: each entry's samples in the reference state (all of them where none is)."""
        return {key: self._where(key, True) or values for key, values in self.samples.items()}

    def others(self):
        """``{key: [seconds, ...]}``: each entry's samples in the other state (maybe none)."""
        return {key: self._where(key, False) for key in self.samples}

    def handoff(self, reference=True):
        """The median probe of the reference (or the other) state; None where it has none."""
        values = [value for key in self.probes for value, flag in zip(self.probes[key], self.in_state[key])
                  if flag == reference]
        return float(np.median(values)) if values else None

    def other_count(self):
        """How many samples lie in the other state."""
        return sum(flags.count(False) for flags in self.in_state.values())

    def _where(self, key, reference):
        return [value for value, flag in zip(self.samples[key], self.in_state[key]) if flag == reference]


def state_samples(keys, probe, sample, rounds, hunt=HUNT_ROUNDS):
    """`StateSamples` of ``keys``: ``sample(key)`` (seconds) over ``rounds`` rounds that visit each key in turn,
    each right after ``probe()`` (seconds of the handoff probe, the same on every rank that samples); then, while
    some key has fewer than ``min(rounds, 2)`` samples in a state the probes saw (`short_of_samples`), a probe
    and a sample of a key short of the state it found (or, when none is, of the next key in turn), at most
    ``hunt`` times the keys: a sweep run after a calibration lands in either state."""
    samples, probes = {key: [] for key in keys}, {key: [] for key in keys}

    def take(key, seconds):
        probes[key].append(seconds)
        samples[key].append(sample(key))

    for _ in range(rounds):
        for key in keys:
            take(key, probe())
    in_turn = itertools.cycle(keys)
    for _ in range(hunt * len(keys)):
        short = short_of_samples(probes, min(rounds, 2))
        if not short.fast and not short.slow:
            break
        seconds = probe()
        wanted = short.fast if seconds <= short.threshold else short.slow
        take(wanted[0] if wanted else next(in_turn), seconds)
    return StateSamples(samples, probes)


def other_state_seconds(reference, other):
    """``{key: seconds}`` of the other state from ``other`` (its entries' medians, absent where it has no
    sample), each missing entry its ``reference`` seconds times the median other / reference ratio of the
    entries of its table (the key's first part) measured in both (1 in a table with none); None when fewer than
    `MIN_COVERAGE` of all entries have a sample in it."""
    if len(other) < MIN_COVERAGE * len(reference):
        return None
    ratios = {}
    for key, seconds in other.items():
        ratios.setdefault(key[0], []).append(seconds / reference[key])
    return {key: other.get(key, base * float(np.median(ratios.get(key[0], [1.0])))) for key, base in reference.items()}


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
