"""The benchmark case protocol every suite implements.

A case is a class with a name, its variants, what its size means, and four
methods. The harness calls them in this order for every measured point::

    state = case.setup(comm, size, variant, backend, dtype)   # inputs from a seed
    case.run(state)                                            # the timed work, repeated
    wrong = case.check(state)                                  # against the serial reference
    metrics = case.metrics(state, seconds)                     # rates for one run
    case.teardown(state)                                       # communicators etc.

``comm`` is the sub-communicator of the ranks taking part; ``size`` is the problem
size the point runs (for weak scaling already grown with the rank count, see
`Case.problem_size`). The state is whatever `setup` returns; `metrics` reads the
point's size, rank count and data type from it, so a case keeps no state itself.
"""
import math
import os
from dataclasses import dataclass
from typing import Optional

from bench.settings import resolve
from kernels.errors import InputError
from kernels.comm.traffic import BUS_FACTORS

@dataclass
class Metrics:
    """Rates of one measured point; None where a rate does not apply.

    Units are SI: GFLOP/s = 1e9 flop/s, GB/s = 1e9 bytes/s.
    """

    gflops: Optional[float] = None
    algbw_gbs: Optional[float] = None
    busbw_gbs: Optional[float] = None
    items_per_s: Optional[float] = None
    metric: str = ""
    metric_value: Optional[float] = None


def bandwidth_metrics(collective, nbytes, ranks, seconds, **extra):
    """`Metrics` of a communication benchmark moving ``nbytes`` per rank in ``seconds``.

    algbw = nbytes / seconds; busbw = algbw times the nccl-tests factor of ``collective``.
    """
    algbw = nbytes / seconds / 1e9 if seconds > 0 else math.nan
    return Metrics(algbw_gbs=algbw, busbw_gbs=algbw * BUS_FACTORS[collective](ranks), **extra)


class Case:
    """Base class of benchmark cases; subclasses set the attributes and methods.

    Attributes
    ----------
    name : str
        Suite name, as given on the command line.
    benchmark : str
        What the CSV's ``benchmark`` column says (e.g. ``allreduce``, ``pingpong``).
    variants : tuple of str
        Variant names; the first is the reference or library version.
    size_unit : str
        Unit of ``size`` (``bytes``, ``n``, ``samples``...), written to the CSV.
    size_help : str
        One line on what ``size`` means, shown by ``mlscale list``.
    default_sizes : str
        Sizes swept when ``--sizes`` is not given.
    metrics_help : str
        Which metrics the suite reports, shown by ``mlscale list``.
    description : str
        One paragraph on what the suite measures and how, shown by ``mlscale list``
        (its first sentence in the list of all suites).
    declared_settings : tuple of bench.settings.Setting
        The suite's settings (``MLSCALE_*`` / ``--set``), in the order ``mlscale list SUITE`` shows them.
    superlinear_reasons : dict
        Variant -> why its speedup may exceed the rank count (the report says so beside such points).
    host_only_variants : dict
        Variant -> why it cannot run on a device backend (a library with no device
        version, e.g. scikit-learn); a sweep on ``cupy`` skips them with that note.
    device_only_variants : dict
        Variant -> why it runs on a device backend only (cuBLAS, NCCL).
    backends : tuple of str
        The backends the suite runs on (`kernels.backend.BACKENDS` names), shown by
        ``mlscale list``; a run on another one is refused before anything starts.

    A case receives the resolved settings when it is made: ``Case(settings)``, a
    `bench.settings.Settings` mapping (name -> value) kept as ``self.settings``;
    without one, they are read from the ``MLSCALE_*`` environment variables.
    """

    name = ""
    benchmark = ""
    variants = ()
    size_unit = "bytes"
    size_help = ""
    default_sizes = "8:1M"
    metrics_help = ""
    dtypes = ("float64", "float32")
    description = ""
    declared_settings = ()
    superlinear_reasons = {}
    host_only_variants = {}
    device_only_variants = {}
    backends = ("numpy", "cupy")

    def __init__(self, settings=None):
        self.settings = resolve(self.declared_settings, (), os.environ, self.name) if settings is None else settings

    def unavailable(self, comm, variant, backend):
        """Why ``variant`` cannot run on ``backend`` here (one line), or None when it can.

        Called on every rank of ``comm`` before the variant's points, which makes
        it collective: every rank must return the same. The default reads
        `host_only_variants` and `device_only_variants`; a case whose variant
        depends on the machine (NCCL and one GPU per rank) overrides it.
        """
        on_device = backend.xp.__name__ != "numpy"
        reasons = self.host_only_variants if on_device else self.device_only_variants
        return reasons.get(variant)

    def check_ranks(self, ranks, variant):
        """Raise `InputError` when ``variant`` cannot run on ``ranks`` ranks."""

    def problem_size(self, size, ranks, scaling):
        """The size a point runs: ``size`` (strong) or grown so work per rank stays fixed (weak).

        The default weak rule multiplies by the rank count; cases whose work is not
        linear in ``size`` (GEMM: n^3) override it.
        """
        return size if scaling == "strong" else size * ranks

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Estimated peak bytes that the busiest rank allocates for one point (within about 2x).

        ``problem`` is the size after `problem_size`; ``check``: whether `check` runs
        (its serial reference is often the largest allocation). Counts the arrays of
        `setup`, `run` and `check`, not the process itself (the harness adds
        `bench.resources.RANK_BASELINE_BYTES`), so that `bench.resources` can refuse a
        point that cannot fit a node before anything runs. The default assumes an
        input and an output of ``problem`` bytes when ``size_unit`` is ``bytes``, and
        nothing otherwise; every suite whose memory grows with the size overrides it.
        """
        return 2 * problem if self.size_unit == "bytes" else 0

    def iterations(self, size):
        """Default ``(iters, warmup)`` for a point of this size."""
        return 20, 3

    def setup(self, comm, size, variant, backend, dtype):
        """Build the inputs of one point; return the state `run` and `check` use."""
        raise NotImplementedError

    def run(self, state):
        """The timed work of one iteration, nothing else."""
        raise NotImplementedError

    def check(self, state):
        """Compare the last run with the serial reference; return the number of wrong elements on this rank."""
        raise NotImplementedError

    def metrics(self, state, seconds):
        """`Metrics` of one run of the point ``state`` that took ``seconds``."""
        raise NotImplementedError

    def teardown(self, state):
        """Release what `setup` made that outlives the point (communicators); called on every rank."""

    def predict(self, variant, size, ranks, calib):
        """Modelled seconds of one run from the constants ``calib`` (see `bench.report.model`; terms
        in `bench.families.costs`), or None when the suite declares no cost model for ``variant``.
        ``size`` is the problem size (after `problem_size`). The report adds the point's
        ``point_dtype``, ``point_ranks`` and recorded ``point_params`` (a dict; a projection gets a measured
        row's) to ``calib``."""
        return None

    def params(self, state):
        """Extra settings of a point worth recording (a dict), written to the CSV's ``params``."""
        return {}


def parse_variants(case, text):
    """Return the variants named in the comma list ``text`` (all of them when empty)."""
    if not text:
        return list(case.variants)
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in case.variants]
    if unknown:
        raise InputError(
            f"unknown variant {unknown[0]!r} for suite {case.name!r}; choose from {', '.join(case.variants)}"
        )
    return names
