"""A suite's model: its cost model, its memory model and the facts the report needs of it.

A model runs nothing: it knows the suite's name, variants, size unit and settings,
the variants that run on one kind of backend only, why a variant may scale
superlinearly, the weak-scaling rule (`Model.problem_size`), the estimated peak
bytes of a point (`Model.memory_bytes`, which `bench.resources` checks against a
node) and the modelled seconds of a run (`Model.predict`, in the terms of
`bench.models.terms`). The harness and the report ask the model, never the case;
a case (`bench.case.Case`) names its model class and takes these facts from it.
"""
import math
import os

from bench.settings import resolve

#: The largest rank count a model projects to (`mlscale report --project`): 2**20, beyond today's largest
#: MPI jobs, and well inside the C ``int`` that ``MPI_Dims_create`` (the models' process grids) takes.
MAX_PROJECTED_RANKS = 1 << 20
#: The facts a case takes from its model class (`bench.case.Case.model_class`).
FACTS = ("name", "variants", "size_unit", "declared_settings", "superlinear_reasons", "host_only_variants",
         "device_only_variants")


class Model:
    """Base class of the suites' models; subclasses set the facts and override the methods.

    Attributes
    ----------
    name, variants, size_unit, declared_settings
        As `bench.case.Case` describes them.
    superlinear_reasons : dict
        Variant -> why its speedup may exceed the rank count (the report says so beside such points).
    host_only_variants, device_only_variants : dict
        Variant -> why it runs on the host only / on a device only.

    A model gets the suite's resolved settings, ``Model(settings)`` (a
    `bench.settings.Settings` mapping); without them, they are read from the
    ``MLSCALE_*`` environment variables (as `mlscale report` does).
    """

    name = ""
    variants = ()
    size_unit = "bytes"
    declared_settings = ()
    superlinear_reasons = {}
    host_only_variants = {}
    device_only_variants = {}
    #: ``reader(settings)``: the settings as the suite's model and case use them, kept as ``config`` (None: none).
    settings_reader = None
    #: The variants the report may compare the others with (``vs_ref``), in order: the first one measured
    #: (empty: the first variant that runs on the backend).
    reference_variants = ()

    def __init__(self, settings=None):
        self.settings = resolve(self.declared_settings, (), os.environ, self.name) if settings is None else settings
        self.config = self.settings_reader(self.settings) if self.settings_reader else None

    def check_ranks(self, ranks, variant):
        """Raise `kernels.errors.InputError` when ``variant`` cannot run on ``ranks`` ranks (default: it can)."""

    def problem_size(self, size, ranks, scaling):
        """The size a point runs: ``size`` (strong) or grown so work per rank stays fixed (weak).

        The default weak rule multiplies by the rank count; suites whose work is not
        linear in ``size`` (GEMM: n^3) override it.
        """
        return size if scaling == "strong" else size * ranks

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Estimated peak bytes that the busiest rank allocates for one point (within about 2x).

        ``problem`` is the size after `problem_size`; ``check``: whether the case's
        check runs (its serial reference is often the largest allocation). Counts the
        arrays of set-up, run and check, not the process itself (the harness adds
        `bench.resources.RANK_BASELINE_BYTES`), so that `bench.resources` can refuse a
        point that cannot fit a node before anything runs. The default assumes an
        input and an output of ``problem`` bytes when ``size_unit`` is ``bytes``, and
        nothing otherwise; every suite whose memory grows with the size overrides it.
        """
        return 2 * problem if self.size_unit == "bytes" else 0

    def predict(self, variant, size, ranks, calib):
        """Modelled seconds of one run from the constants ``calib`` (see `bench.report.model`; terms
        in `bench.models.terms`), or None when the suite declares no cost model for ``variant``.
        ``size`` is the problem size (after `problem_size`). The report adds the point's
        ``point_dtype``, ``point_ranks`` and recorded ``point_params`` (a dict; a projection gets a measured
        row's) to ``calib``."""
        return None

    def measured_by_calibration(self, variant, size, ranks, calib):
        """Whether `predict` returns, for this point, an entry the calibration measured itself (the same call,
        size and rank count, ``calib`` as `predict` gets it): its model error then measures how the node changed
        between calibrate and the sweep, not the model (`bench.report.output.model_error_lines`). Default: no
        point is."""
        return False


def balanced_dims(ranks, axes):
    """``MPI.Compute_dims(ranks, axes)``: ``ranks`` split over ``axes`` grid axes as evenly as possible,
    largest first (a tuple).

    MPI computes it when it is initialised (a job's grids are MPI's); the commands that
    start no MPI job (``sweep`` before its launch, ``report``) get MPICH's choice without
    MPI: the smallest spread between the largest and the smallest factor, then the
    largest first factor (the same as ``MPI_Dims_create`` of MPICH for every count tried).
    """
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        return tuple(MPI.Compute_dims(ranks, axes))
    low = [d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0]
    divisors = sorted(set(low + [ranks // d for d in low]), reverse=True)

    def splits(count, left, most):
        if left == 1:
            yield from [(count,)] if count <= most else []
            return
        for first in (d for d in divisors if d <= most and count % d == 0):
            yield from ((first,) + rest for rest in splits(count // first, left - 1, first))
    return min(splits(ranks, axes, ranks), key=lambda dims: (dims[0] - dims[-1], -dims[0]))


def default_model(case):
    """The model of a case with no model module (a custom ``module:Class`` suite): its own facts, no
    prediction, and the default memory estimate of its size unit."""
    model = Model(case.settings)
    for fact in FACTS:
        setattr(model, fact, getattr(case, fact))
    return model
