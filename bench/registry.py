"""Suites by name. Cases are imported only when used, so optional libraries stay optional."""
import importlib

from bench.case import Case
from kernels.errors import InputError

SUITES = {
    "p2p": "bench.cases.p2p:PointToPoint",
    "allreduce": "bench.cases.allreduce:Allreduce",
    "allgather": "bench.cases.allgather:Allgather",
    "reduce_scatter": "bench.cases.reduce_scatter:ReduceScatter",
    "alltoall": "bench.cases.alltoall:Alltoall",
    "bcast": "bench.cases.bcast:Bcast",
    "reduce": "bench.cases.reduce:Reduce",
    "blas1": "bench.cases.blas1:Blas1",
    "gemv": "bench.cases.gemv:Gemv",
    "gemm": "bench.cases.gemm:Gemm",
    "dp": "bench.cases.dp:DataParallel",
    "ps": "bench.cases.ps:ParameterServerSuite",
    "svm": "bench.cases.svm:SVMSuite",
    "tp": "bench.cases.tp:TensorParallel",
    "moe": "bench.cases.moe:MixtureOfExperts",
    "pp": "bench.cases.pp:PipelineSuite",
    "hybrid": "bench.cases.hybrid:Hybrid",
    "conv": "bench.cases.conv:HaloConv",
    "attention": "bench.cases.attention:Attention",
}


def case_class(name):
    """Return the case class of suite ``name``.

    ``name`` is a suite of `SUITES`, or ``package.module:Class`` for a case of your
    own (a `bench.case.Case` subclass importable from the current environment).
    Raises `InputError` for an unknown suite, a spec that does not import or
    names something other than a `Case` subclass.
    """
    spec = SUITES.get(name, name)
    module_name, _, class_name = spec.partition(":")
    if not class_name:
        raise InputError(f"unknown suite {name!r}; choose from {', '.join(SUITES)} (or give module:Class)")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise InputError(f"cannot load suite {name!r}: {error}") from None
    if not (isinstance(found, type) and issubclass(found, Case)):
        raise InputError(f"suite {name!r} is not a bench.case.Case subclass (see bench/case.py)")
    return found


def get_case(name, settings=None):
    """Return a new case object of suite ``name`` (see `case_class`) with ``settings``
    (a `bench.settings.Settings`; default: from the ``MLSCALE_*`` variables)."""
    return case_class(name)(settings)
