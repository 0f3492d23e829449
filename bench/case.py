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
`bench.models.base.Model.problem_size`). The state is whatever `setup` returns;
`metrics` reads the point's size, rank count and data type from it, so a case keeps
no state itself. A suite's cost and memory models and the facts the report needs
(name, variants, size unit, settings) live in its model, ``bench/models/<suite>.py``;
the case names it as ``model_class``.
"""
import math
import os
from dataclasses import dataclass
from typing import Optional

from bench.models.base import FACTS, default_model
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

    model_class : type
        The suite's `bench.models.base.Model` subclass; a case that names one takes
        the model's facts (`bench.models.base.FACTS`: name, variants, size_unit,
        declared_settings and the variant notes) unless it sets them itself. None
        for a custom case, whose model is `bench.models.base.default_model`.

    A case receives the resolved settings when it is made: ``Case(settings)``, a
    `bench.settings.Settings` mapping (name -> value) kept as ``self.settings``;
    without one, they are read from the ``MLSCALE_*`` environment variables. Its
    ``model`` is its model made with the same settings (what the harness asks for
    problem sizes and memory).
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
    model_class = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "model_class" in cls.__dict__:
            for fact in FACTS:
                if fact not in cls.__dict__:
                    setattr(cls, fact, getattr(cls.model_class, fact))

    def __init__(self, settings=None):
        self.settings = resolve(self.declared_settings, (), os.environ, self.name) if settings is None else settings
        self.model = self.model_class(self.settings) if self.model_class else default_model(self)

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
        """Raise `InputError` when ``variant`` cannot run on ``ranks`` ranks (the model's rule, by default)."""
        self.model.check_ranks(ranks, variant)

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
