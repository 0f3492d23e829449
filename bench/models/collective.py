"""What the models of the collective suites share (`bench.families.collective`): settings, variants,
rank rules, the cost model of every hand-written algorithm from its own steps, and the memory model.

A hand-written algorithm is modelled from the `parallel.collectives.schedule.Schedule` it runs
(`bench.models.collective_terms.hand_written`): each step (exchanges, one-way messages, reductions,
copies) priced from the calibration, on the busiest of a few sampled ranks, plus the Python path of one
call. MPI's variant is priced by the library terms of its suite (`bench.models.terms`); ``nccl`` is not
modelled.
"""
import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.settings import Setting, choice, flag, integer
from kernels.errors import InputError

IN_PLACE = Setting("COLL_IN_PLACE", flag, False, None, "1: in place (MPI_IN_PLACE), 0: out of place")
OP = Setting("COLL_OP", choice, "sum", ("sum", "max"), "the reduction")
ROOT = Setting("COLL_ROOT", integer, 0, 0, "the root rank (below the rank count)")


def read_settings(settings):
    """The settings as the case and model use them: ``in_place``, and ``op`` / ``root`` where declared."""
    names = {"COLL_IN_PLACE": "in_place", "COLL_OP": "op", "COLL_ROOT": "root"}
    return {names[name]: value for name, value in settings.items() if name in names}


class CollectiveModel(Model):
    """Base of the collectives' models. Subclasses set ``name``, ``algorithms`` (the hand-written
    variants by name: schedule builders ``(rank, p, n, itemsize, in_place) -> Schedule``), ``reduces``,
    ``rooted`` and `library` (MPI's cost)."""

    algorithms = {}
    #: Hand-written algorithms over NCCL's point-to-point wire (``ring+nccl``: device only, not modelled).
    wire_variants = ()
    reduces = False
    rooted = False
    size_unit = "bytes"
    device_only_variants = {"nccl": "NCCL runs on device buffers only (--backend cupy)"}
    settings_reader = staticmethod(read_settings)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.variants = ("mpi",) + tuple(cls.algorithms) + ("nccl",) + tuple(cls.wire_variants)
        cls.declared_settings = (IN_PLACE,) + ((OP,) if cls.reduces else ()) + ((ROOT,) if cls.rooted else ())

    def check_ranks(self, ranks, variant):
        root = self.config.get("root", 0)
        if root >= ranks:
            raise InputError(f"MLSCALE_COLL_ROOT={root} is not a rank of {ranks} ranks")

    def library(self, calib, nbytes, ranks):
        """Modelled seconds of MPI's call on ``ranks`` ranks (``nbytes``: the suite's size)."""
        raise NotImplementedError

    def predict(self, variant, size, ranks, calib):
        if variant == "nccl" or variant in self.wire_variants:  # NCCL's transport: not calibrated
            return None
        if variant == "mpi":
            return self.library(calib, size, ranks)
        item = terms.itemsize(calib)
        return collective_terms.hand_written(calib, self.algorithms[variant], ranks, size // item, item,
                                             in_place=self.config["in_place"])

    def measured_by_calibration(self, variant, size, ranks, calib):
        """MPI's call on two ranks at a size of its calibrated table (``allreduce``, else ``library``), set up as
        the calibration sets it up: float64, out of place, sum, root 0 (the point's recorded settings, else the
        model's)."""
        table = calib.get("allreduce") if self.name == "allreduce" else calib.get("library", {}).get(self.name)
        settings = dict(self.config, **{key: value for key, value in calib.get("point_params", {}).items()
                                        if key in ("in_place", "op", "root")})
        return (variant == "mpi" and ranks == 2 and bool(table) and terms.holds(table, size)
                and calib.get("point_dtype", "float64") == "float64" and not settings["in_place"]
                and settings.get("op", "sum") == "sum" and settings.get("root", 0) == 0)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Send and receive buffers and the algorithm's scratch, about ``problem`` bytes each; the check
        draws one rank's input at a time (as int64, then cast) beside the result it builds."""
        reference = 8 * (problem // np.dtype(dtype).itemsize) + 2 * problem
        return 3 * problem + (reference if check else 0)
