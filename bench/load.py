"""The load on a point's nodes while it was measured: what else ran there, recorded with every row.

Around each point (`PointLoad`), the first rank of every node reads the node's CPU time
(``/proc/stat``: busy = user + nice + system + irq + softirq + steal, in clock ticks) and its
runnable tasks (``/proc/loadavg``), and every rank its own process's CPU time (`os.times`,
its BLAS threads included). What the node's CPUs spent beyond the job's own processes is
CPU time taken by processes outside the job; over the point's wall time and the node's
cores it is the share of the node they took (``others``, 0 to 1). The row's params get
``load`` = ``{"others": the largest share of any node, "runnable": the most runnable tasks
of any node at the start, "cores": that node's cores, "oversubscribed": whether ranks x
threads exceed the cores of some node}``. Where ``/proc`` cannot be read (not Linux), the
figures are None. A point where ``others`` exceeds `BUSY_SHARE`, or that oversubscribes a
node, counts as measured on a busy node (`busy`; the sweep's closing line counts them).

The node's memory speed (`MemoryProbe`, made once per rank count): right before each point (at most once a
second, `PROBE_EVERY_S`), every rank of a node times the GEMV of the calibrated ``gemv`` table's 32 MiB entry
at once, as ``mlscale calibrate`` times its ``busy`` table (`bench.interleaved.interleaved_samples`).
``load`` gets ``memory_probe_s``: the slowest node's seconds (its first rank's median). On this 2-core VM
the memory bandwidth left to the job moved between two states for tens of seconds at a time (a 64 MiB GEMV
per rank on two ranks 2.5-2.8 ms, then 3.4-3.7 ms; an 8 MiB copy 0.45-0.55 ms, then 0.8-0.9 ms) with no
load visible in ``/proc``; over 90 s the probe's log correlated at 0.9 with both. The report compares it
with the calibration's entry (`bench.report.model.memory_state`). On a node with two ranks or more, its first
two then time the handoff probe (`bench.message_tables.handoff_prober`: an exchange of 1 MiB each has just
written, which ran at 85-190 us or 400-700 us here by turns of a few to 20 seconds, as did MPI's out-of-place
collectives, while the GEMV probe moved 1.4x the other way), ``PROBE_ROUNDS`` samples: ``load`` gets
``handoff_probe_s``, the slowest node's median (None where every node holds one rank), which the report
compares with the calibration's ``handoff_s`` (`bench.report.model.handoff_state`).

Communication per point: one ``Split_type`` (made once per rank count by the caller: the
node communicator), two reductions of a few numbers on it and one allgather on the point's
communicator; the probe: one broadcast of a flag and, when it runs, one reduction of one number,
`PROBE_ROUNDS` barriers and one more on the node communicator, and on its first two ranks `PROBE_ROUNDS` handoff
samples (4 exchanges of 1 MiB each way, a barrier and a reduction of one number each).
"""
import os
import time

import numpy as np

from kernels.errors import InputError

#: Other processes taking more than this share of a node's cores make its point "busy".
BUSY_SHARE = 0.1
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal
#: Side of the probe's float64 matrix: 32 MiB per rank, beyond the last-level cache of a node whose ranks share it.
PROBE_SIDE = 2048
PROBE_BYTES = PROBE_SIDE * PROBE_SIDE * 8
#: Rounds of the probe and seconds each lasts at least (3 x 2 timed and 2 untimed GEMVs of 1-1.7 ms here:
#: 15-25 ms a point).
PROBE_ROUNDS, PROBE_LEAST_S = 3, 0.003
#: Seconds a probe stands for: a point sooner after the last one records that (the states it tells apart lasted
#: tens of seconds here; probing each of the default sweep's 300 small points took 9 % of its time).
PROBE_EVERY_S = 1.0
#: ``MLSCALE_MEMORY_PROBE=0`` leaves the probe out (``1``, the default: in), as the tests' many small sweeps do.
PROBE_VARIABLE = "MLSCALE_MEMORY_PROBE"


def node_cpu_seconds():
    """Seconds of CPU time the node spent busy since boot (``/proc/stat``), or None where unreadable."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()[1:]
        return sum(int(fields[index]) for index in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def runnable_tasks():
    """Tasks runnable now on this node (the fourth field of ``/proc/loadavg``, before the slash), or None."""
    try:
        with open("/proc/loadavg") as handle:
            return int(handle.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_seconds():
    times = os.times()
    return times.user + times.system


def memory_probe_enabled(environ):
    """Whether `PROBE_VARIABLE` in ``environ`` leaves the probe in (unset or ``1``) or out (``0``);
    `kernels.errors.InputError` for another value."""
    text = environ.get(PROBE_VARIABLE, "1").strip()
    if text not in ("0", "1"):
        raise InputError(f"{PROBE_VARIABLE} must be 0 (no memory probe) or 1, got {text!r}")
    return text == "1"


class MemoryProbe:
    """Collective on ``node`` (the ranks of one node): holds this rank's `PROBE_BYTES` matrix and, on the node's
    first two ranks, their pair communicator (`close` frees it); a call times the GEMV on every rank of the node
    at once (at the BLAS threads in force), then the handoff on the pair, and returns ``(this rank's median GEMV
    seconds, the pair's median handoff seconds or None off the pair)``, or the last call's figures when that was
    less than `PROBE_EVERY_S` ago by the node's first rank's ``clock`` (which it broadcasts on the node)."""

    def __init__(self, node, clock=time.monotonic):
        from mpi4py import MPI  # starts MPI: not for the commands that run no job

        self.node, self.clock = node, clock
        self.matrix, self.vector = np.full((PROBE_SIDE, PROBE_SIDE), 0.5), np.full(PROBE_SIDE, 0.5)
        self.last, self.when = None, None
        self.pair = node.Split(0 if node.rank < 2 and node.size > 1 else MPI.UNDEFINED, node.rank)

    def __call__(self):
        if self.node.bcast(self.last is None or self.clock() - self.when >= PROBE_EVERY_S, root=0):
            self.last, self.when = self._measure(), self.clock()
        return self.last

    def close(self):
        """Free the pair communicator (collective on ``node``'s first two ranks)."""
        from mpi4py import MPI

        if self.pair != MPI.COMM_NULL:
            self.pair.Free()

    def _measure(self):
        from mpi4py import MPI

        from bench.interleaved import interleaved_samples
        from bench.message_tables import handoff_prober

        samples = interleaved_samples({"gemv": self._product}, self.node, PROBE_ROUNDS, PROBE_LEAST_S,
                                      warm={"gemv"})["gemv"]
        handoff = None
        if self.pair != MPI.COMM_NULL:
            prober = handoff_prober(self.pair)
            handoff = float(np.median([prober() for _ in range(PROBE_ROUNDS)]))
        self.node.Barrier()
        return float(np.median(samples)), handoff

    def _product(self):
        return self.matrix @ self.vector


class PointLoad:
    """Collective: made on every rank of ``comm`` (``node``: its ranks on this node) before a point, `finish`
    after it; ``threads`` is the BLAS threads per rank; ``probe``: a `MemoryProbe` on ``node`` to run first."""

    def __init__(self, comm, node, threads, probe=None):
        self.comm, self.node, self.threads = comm, node, threads
        self.leader = node.rank == 0
        self.memory, self.handoff = probe() if probe is not None else (None, None)
        self.start_wall, self.start_own = time.monotonic(), _own_cpu_seconds()
        self.start_node = node_cpu_seconds() if self.leader else None
        self.runnable = runnable_tasks() if self.leader else None

    def finish(self):
        """The point's ``load`` params (see the module), the same on every rank."""
        own = self.node.allreduce(_own_cpu_seconds() - self.start_own)
        wall = time.monotonic() - self.start_wall
        cores = os.cpu_count() or 1
        others = None
        if self.leader:
            end_node = node_cpu_seconds()
            if self.start_node is not None and end_node is not None and wall > 0:
                others = min(1.0, max(0.0, (end_node - self.start_node - own) / (wall * cores)))
        nodes = [entry for entry in self.comm.allgather(
            (others, self.runnable, cores, self.node.size * self.threads, self.memory, self.handoff)
            if self.leader else None) if entry]
        shares = [share for share, *_ in nodes if share is not None]
        busiest = max(nodes, key=lambda entry: entry[1] if entry[1] is not None else -1)
        return {"others": round(max(shares), 3) if shares else None, "runnable": busiest[1], "cores": busiest[2],
                "oversubscribed": any(used > cores for _, _, cores, used, *_ in nodes),
                "memory_probe_s": _slowest(entry[4] for entry in nodes),
                "handoff_probe_s": _slowest(entry[5] for entry in nodes)}


def _slowest(probes):
    """The largest of the figures ``probes`` that are not None, rounded to 0.1 us; None when none are."""
    known = [seconds for seconds in probes if seconds is not None]
    return round(max(known), 7) if known else None


def busy(load):
    """Whether a point's ``load`` params say its node was busy: others above `BUSY_SHARE`, or oversubscribed."""
    return bool(load) and ((load.get("others") or 0) > BUSY_SHARE or bool(load.get("oversubscribed")))


def busy_summary(busy_points, total):
    """The closing line of a sweep with ``busy_points`` of its ``total`` points on a busy node, or None."""
    if not busy_points:
        return None
    return (f"# {busy_points} of {total} points ran on a busy node (other processes took over {BUSY_SHARE:.0%} of its "
            f"cores, or ranks x threads exceeded them: params load); their times may not be the machine's")
