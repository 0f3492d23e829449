"""Sweeps of rank counts x variants x sizes inside one MPI job.

Each rank count runs on a sub-communicator of the job's first ranks, so one
launch (one Slurm job) measures every count; ranks left out wait in a sleeping
barrier so that they do not steal cores from the ranks being measured.

No error is assumed to happen on every rank: the steps where a rank can fail
alone outside timed work (setup, check, metrics, teardown, writing a row) run
through `bench.faults.agree`; an error inside timed work raised on every rank is raised on every
rank too (`bench.faults.failing_together`), and on some ranks alone (the others wait in a
collective) it aborts the job (`bench.faults.abort_job`).
"""
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import List, Optional

from mpi4py import MPI
from threadpoolctl import threadpool_limits

from bench.case import parse_variants
from bench.csvio import ResultsFile, point_key
from bench.faults import AGREED, AgreedInputError, abort_job, agree, agreed_error, sleeping_barrier, uninterrupted
from bench.load import MemoryProbe
from bench.point import measure_point
from bench.progress import Progress
from bench.provenance import device_description, mpi_library, placement
from bench.stability import MAX_POINT_SECONDS, MAX_SPREAD
from bench.units import format_size
from kernels.backend import get_backend
from kernels.errors import InputError

SCALINGS = ("strong", "weak")


@dataclass
class SweepConfig:
    """What one `mlscale run` measures (parsed, validated command-line options)."""

    suite: str
    variants: List[str]
    sizes: List[int]
    ranks: List[int]
    csv_path: str
    scaling: str = "strong"
    iters: Optional[int] = None
    warmup: Optional[int] = None
    threads: Optional[int] = None
    backend: str = "numpy"
    dtype: Optional[str] = None
    check: bool = True
    variants_named: bool = False
    time_limit: Optional[float] = None
    max_spread: float = MAX_SPREAD
    max_point_seconds: float = MAX_POINT_SECONDS
    remeasure_unstable: bool = False
    memory_probe: bool = True


@dataclass
class SweepResult:
    """What one `run_sweep` did, for the command line to report.

    Attributes
    ----------
    wrong : int
        Wrong elements the checks found on every rank (0: all valid, or checks off).
    skipped : list of str
        One note per thing left out: a ``(ranks, variant)`` pair the case cannot run,
        a variant the backend cannot run, a placement the provenance could not confirm.
    not_measured : int
        Points ``--time-limit`` left out (the sweep stopped before them).
    """

    wrong: int = 0
    skipped: List[str] = field(default_factory=list)
    not_measured: int = 0

    def note(self, text):
        """Add the note ``text`` once."""
        if text not in self.skipped:
            self.skipped.append(text)


def plan_points(case, config):
    """Return the ``(ranks, variant)`` pairs to run and the notes on those skipped; drop impossible ones or raise.

    A pair the case cannot run (a square grid on 3 ranks, say) is skipped with a
    note; a variant named with ``--variants`` that runs at no rank count, or a plan
    with nothing left, is an `InputError`.
    """
    if config.scaling not in SCALINGS:
        raise InputError(f"unknown scaling {config.scaling!r}; choose strong or weak")
    if config.dtype not in case.dtypes:
        raise InputError(f"suite {case.name!r} runs dtype {' or '.join(case.dtypes)}, not {config.dtype!r}")
    if config.backend not in case.backends:
        raise InputError(f"suite {case.name!r} runs on backend {' or '.join(case.backends)}, not {config.backend!r}")
    plan, refusals, notes = [], {}, []
    for ranks in config.ranks:
        for variant in config.variants:
            try:
                case.check_ranks(ranks, variant)
            except InputError as error:
                refusals.setdefault(variant, str(error))
                notes.append(f"skipped {variant} on {ranks} ranks: {error}")
                continue
            plan.append((ranks, variant))
    if config.variants_named:
        for variant in config.variants:
            if variant in refusals and all(v != variant for _, v in plan):
                raise InputError(refusals[variant])
    if not plan:
        raise InputError(next(iter(refusals.values())))
    return plan, notes


def run_sweep(comm, case, config, emit, show=None):
    """Measure every planned point; rank 0 appends CSV rows and calls ``emit(row)``; return a `SweepResult`.

    Before each point rank 0 calls ``show(line)`` with its ``[k/N]`` line and the
    time left (`bench.progress.Progress`); when ``config.time_limit`` says the next
    point would end past it, every rank stops there and the result's ``not_measured``
    counts the points left out. The result also holds the wrong elements the checks
    found and the notes on what was skipped (all of them on rank 0, which takes part in
    every rank count). Every rank of ``comm`` must call this.
    Raises an `AGREED` error on every rank together, or aborts the job when a rank
    fails alone (see the module's docstring).
    """
    config.variants = parse_variants(case, ",".join(config.variants))
    plan, skipped = plan_points(case, config)
    result = SweepResult(skipped=skipped)
    results, error = None, None
    if comm.rank == 0:
        try:
            results = ResultsFile(config.csv_path, remeasure_unstable=config.remeasure_unstable)
        except InputError as failure:
            error = ("input", str(failure))
    error = comm.bcast(error, root=0)
    if error:
        raise agreed_error(error)
    progress = None
    if comm.rank == 0:
        points = [(ranks, variant, size) for ranks in sorted({r for r, _ in plan})
                  for variant in [v for r, v in plan if r == ranks] for size in config.sizes]
        progress = Progress(points, show or (lambda line: None), config.time_limit, size_label=format_size)
    try:
        _measure_plan(comm, case, config, plan, results, emit, progress, result)
    finally:
        if results is not None:
            results.close()
    return result


def _measure_plan(comm, case, config, plan, results, emit, progress, result):
    """Measure the ``(ranks, variant)`` pairs of ``plan``, one sub-communicator per rank count, into
    ``result``; stop after the rank count where ``progress`` (rank 0's) said stop."""
    backend = agree(comm, get_backend, config.backend, comm)
    library = mpi_library()
    device = agree(comm, device_description, backend)
    for ranks in sorted({r for r, _ in plan}):
        sub = comm.Split(0 if comm.rank < ranks else MPI.UNDEFINED, comm.rank)
        failure = None
        if sub != MPI.COMM_NULL:
            try:
                result.wrong += _measure_rank_count(sub, case, config, backend, results, (library, device),
                                                    [v for r, v in plan if r == ranks], emit, progress, result)
            except AGREED as error:  # raised on every rank of sub
                failure = ("input" if isinstance(error, InputError) else "rank", str(error))
            except Exception as error:  # noqa: BLE001 - this rank alone: the others wait in a collective
                abort_job(error)
                raise
            finally:
                sub.Free()
        sleeping_barrier(comm)
        failure, result.not_measured = comm.bcast((failure, progress.not_measured if progress else 0), root=0)
        if failure:
            raise agreed_error(failure)  # rank 0 is in every sub-communicator
        if result.not_measured:
            break


def _measure_rank_count(sub, case, config, backend, results, provenance, variants, emit, progress, result):
    """Measure every point of ``variants`` x sizes on ``sub`` (``provenance``: MPI library and device
    of the rows) until ``progress`` says stop; note what is skipped in ``result``; return the wrong
    elements found."""
    where = placement(sub)
    if where.note:
        result.note(where.note)
    threads = config.threads or max(1, (os.cpu_count() or 1) // where.ranks_here)
    settings = agree(sub, case.settings.column)
    available = _available(sub, case, config, backend, variants, result)
    if progress:
        progress.drop(sub.size, set(variants) - set(available))
    node = sub.Split_type(MPI.COMM_TYPE_SHARED)
    probe = MemoryProbe(node) if config.memory_probe else None
    try:
        return _measure_points(sub, node, probe, threads, case, config, backend, results, provenance, available,
                               emit, progress, where.nodes, settings)
    finally:
        if probe is not None:
            probe.close()
        node.Free()


def _measure_points(sub, node, probe, threads, case, config, backend, results, provenance, available, emit,
                    progress, nodes, settings):
    """The points of `_measure_rank_count` (``node``: this rank's node communicator, ``probe``: a `MemoryProbe`
    on it or None)."""
    wrong_total = 0
    for variant in available:
        for size in config.sizes:
            base = dict(
                suite=case.name, benchmark=case.benchmark, variant=variant, backend=config.backend,
                dtype=config.dtype, ranks=sub.size, nodes=nodes, threads=threads,
                scaling=config.scaling, size=size, size_unit=case.size_unit, settings=settings,
            )
            if sub.bcast(results is not None and point_key(base) in results.done, root=0):
                if progress:
                    progress.passed()
                continue
            if not sub.bcast(progress and progress.begin(), root=0):
                return wrong_total
            with threadpool_limits(limits=threads):
                row = measure_point(sub, node, threads, case, config, backend, variant, size, probe)
            if progress:
                progress.finish()
            wrong_total += row["wrong"] or 0
            row.update(base, mpi_library=provenance[0], device=provenance[1], host=socket.gethostname())
            agree(sub, _record, results, row, emit)
    return wrong_total


def _available(sub, case, config, backend, variants, result):
    """The variants of ``variants`` that ``case`` can run on ``backend`` with the ranks of ``sub``.

    `bench.case.Case.unavailable` is asked on every rank (it is collective); rank 0's
    answer counts. A variant it refuses is skipped with a note in ``result`` (one per reason), or, when the
    variants were named (``--variants``), refused on every rank with an `AgreedInputError`.
    """
    kept, skipped = [], {}
    for variant in variants:
        reason = sub.bcast(agree(sub, case.unavailable, sub, variant, backend), root=0)
        if reason is None:
            kept.append(variant)
        elif config.variants_named:
            raise AgreedInputError(f"variant {variant!r} cannot run on {config.backend}: {reason}")
        else:
            skipped.setdefault(reason, []).append(variant)
    for reason, names in skipped.items():  # one note for the variants skipped for one reason
        result.note(f"{', '.join(names)} skipped on {config.backend}: {reason}")
    return kept


def _record(results, row, emit):
    """On rank 0 (which holds ``results``): append ``row`` whole, then show it."""
    if results is None:
        return
    row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with uninterrupted():
        results.append(row)
    emit(row)
