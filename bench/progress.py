"""Live progress of a sweep: ``[k/N]`` lines, the time left, and ``--time-limit``.

Rank 0 keeps a `Progress` over the sweep's points (every rank count, variant and
size, in the order they run) and a `Console` that shows it: on a terminal one
line rewritten in place (``\\r``) and cleared before each table row; elsewhere
(a Slurm log, a pipe) one plain line per point.

How the time left is estimated (`estimate_point`): a point takes the wall time
(set-up, warm-up, timed runs, check) measured for the same variant and size on
another rank count when there is one (their mean); otherwise it is scaled from the
variant's finished sizes as a power law through the two sizes nearest to it,
``t = t0 (size / s0) ** e`` with ``e`` clamped to [0, 3]; from one size only, by the
median of what the other variants took at ``size`` over their time at that size (a
small size's fixed cost is no guide to a large one's), else ``e = 1``.
The time left is shown once every variant still to run has finished a point.

``--time-limit``: before each point, the sweep stops when the time since it
started plus the point's estimate exceeds the limit (`over_limit`; a variant not
run yet counts the mean of the finished points). Rank 0 decides, every rank
follows, the CSV keeps its whole rows and ``mlscale run`` exits with
`EXIT_TIME_LIMIT` after one line counting the points not measured.
"""
import math
import re
import time

from kernels.errors import InputError

#: Exit status of a sweep stopped by ``--time-limit`` (every measured point valid).
EXIT_TIME_LIMIT = 3
#: Largest exponent of the size scaling of a point's time (GEMM's n**3).
MAX_EXPONENT = 3.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_duration(text):
    """Seconds from ``90``, ``90s``, ``30m`` or ``2h`` (decimals allowed); `InputError` otherwise."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"malformed duration {text!r}: expected a positive number with an optional s, m or h "
                         "suffix (90, 90s, 30m, 2h)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


def format_duration(seconds):
    """``1h 02m``, ``4m 05s`` or ``12s`` (rounded up to whole seconds)."""
    total = math.ceil(max(seconds, 0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def status_line(k, total, variant, size_label, ranks, left=None):
    """``[k/N] VARIANT size=S ranks=P``, with ``  ~Xm Ys left`` when ``left`` (seconds) is known."""
    line = f"[{k}/{total}] {variant} size={size_label} ranks={ranks}"
    return line if left is None else f"{line}  ~{format_duration(left)} left"


def estimate_point(walls, variant, size):
    """Estimated wall seconds of the point ``(variant, size)``, or None when ``variant`` has no finished point.

    ``walls`` maps ``(variant, size)`` to the list of measured wall seconds of the
    finished points (over rank counts). See the module's docstring for the model.
    """
    if walls.get((variant, size)):
        return sum(walls[variant, size]) / len(walls[variant, size])
    known = sorted((s, sum(w) / len(w)) for (v, s), w in walls.items() if v == variant and w and s > 0)
    if not known or size <= 0:
        return None
    nearest = sorted(known, key=lambda item: abs(math.log(item[0] / size)))[:2]
    (s0, t0), exponent = nearest[0], 1.0
    if len(nearest) == 1:  # as the other variants grew from s0 to size, if any ran both
        ratios = sorted(sum(walls[v, size]) / len(walls[v, size]) / (sum(w) / len(w))
                        for (v, s), w in walls.items() if s == s0 and v != variant and w and walls.get((v, size)))
        if ratios:
            return t0 * ratios[len(ratios) // 2]
    if len(nearest) == 2:
        (s1, t1) = nearest[1]
        exponent = math.log(max(t1, 1e-12) / max(t0, 1e-12)) / math.log(s1 / s0)
    return t0 * (size / s0) ** min(max(exponent, 0.0), MAX_EXPONENT)


def time_left(walls, points):
    """Estimated seconds for ``points`` (``(ranks, variant, size)`` still to run), or None while
    one of their variants has no finished point."""
    total = 0.0
    for _, variant, size in points:
        estimate = estimate_point(walls, variant, size)
        if estimate is None:
            return None
        total += estimate
    return total


def over_limit(elapsed, estimate, limit):
    """True when a point estimated at ``estimate`` seconds, started ``elapsed`` seconds into the
    sweep, would end past ``limit`` (None: no limit)."""
    return limit is not None and elapsed + estimate > limit


class Progress:
    """Rank 0's account of a sweep's ``points`` (``(ranks, variant, size)`` in running order).

    Call `begin` before each point (it says whether to run it), `finish` after it,
    `passed` for a point skipped because the CSV holds it already.

    Parameters
    ----------
    points : list of tuple
        Every point of the sweep, all rank counts included, in the order they run.
    show : callable
        Called with each status line (`Console.status`).
    limit : float, optional
        ``--time-limit`` in seconds.
    clock : callable, optional
        Seconds since a fixed point (`time.monotonic`; tests inject their own).
    size_label : callable, optional
        How a size is printed (`bench.units.format_size`).
    """

    def __init__(self, points, show, limit=None, clock=time.monotonic, size_label=str):
        self.points, self.show, self.limit, self.clock = list(points), show, limit, clock
        self.size_label = size_label
        self.started = clock()
        self.walls = {}
        self.position = 0  # points begun or passed
        self.stopped = False
        self._began = None

    def passed(self):
        """The next point is already measured (resumed sweep): count it, show nothing."""
        self.position += 1

    def drop(self, ranks, variants):
        """Leave out the points of ``variants`` on ``ranks`` ranks still ahead (variants the backend
        cannot run): they count in no total."""
        ahead = [p for p in self.points[self.position:] if not (p[0] == ranks and p[1] in variants)]
        self.points = self.points[:self.position] + ahead

    def begin(self):
        """Show the next point's line and return True, or return False when ``limit`` says stop."""
        ranks, variant, size = self.points[self.position]
        now = self.clock()
        estimate = estimate_point(self.walls, variant, size)
        if estimate is None and self.walls:  # a variant not run yet: the mean finished point
            finished = [w for ws in self.walls.values() for w in ws]
            estimate = sum(finished) / len(finished)
        if over_limit(now - self.started, estimate or 0.0, self.limit):
            self.stopped = True
            return False
        self.position += 1
        self._began = now
        left = time_left(self.walls, self.points[self.position - 1:])
        self.show(status_line(self.position, len(self.points), variant, self.size_label(size), ranks, left))
        return True

    def finish(self):
        """Record the wall time of the point `begin` started."""
        _, variant, size = self.points[self.position - 1]
        self.walls.setdefault((variant, size), []).append(self.clock() - self._began)

    @property
    def not_measured(self):
        """Points left out by a stop (0 while not stopped)."""
        return len(self.points) - self.position if self.stopped else 0


class Console:
    """Rank 0's stdout during a sweep: table lines, and status lines rewritten in place on a terminal.

    ``tty``: status lines end in ``\\r`` (cleared before the next line); otherwise
    each status line is a plain line, so logs stay readable.
    """

    CLEAR = "\r\x1b[K"

    def __init__(self, stream, tty):
        self.stream, self.tty = stream, tty
        self._pending = False  # a status line is on screen

    def status(self, text):
        """Show a progress line."""
        if self.tty:
            self.stream.write(f"{self.CLEAR}{text}")
            self._pending = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, text):
        """Write a whole line (a table row, a note), clearing a status line first."""
        self.stream.write(f"{self.CLEAR if self._pending else ''}{text}\n")
        self._pending = False
        self.stream.flush()
