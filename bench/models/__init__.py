"""The suites' models by name (`bench.models.base.Model`), imported only when used.

One module per suite, ``bench/models/<suite>.py``; `terms` holds the cost-model
terms they share, `blas` what the BLAS suites' models share, `collective` what the models of
the collective suites (allgather, reduce_scatter, alltoall, bcast, reduce) share. Models never import
cases (`bench.cases`) or the case registry; the report reads models only.
"""
import importlib

#: Suite name -> its model class in ``bench.models.<suite>``.
MODELS = {
    "p2p": "PointToPointModel",
    "allreduce": "AllreduceModel",
    "allgather": "AllgatherModel",
    "reduce_scatter": "ReduceScatterModel",
    "alltoall": "AlltoallModel",
    "bcast": "BcastModel",
    "reduce": "ReduceModel",
    "blas1": "Blas1Model",
    "gemv": "GemvModel",
    "gemm": "GemmModel",
    "dp": "DataParallelModel",
    "ps": "ParameterServerModel",
    "svm": "SVMModel",
    "tp": "TensorParallelModel",
    "moe": "MixtureOfExpertsModel",
    "pp": "PipelineModel",
    "hybrid": "HybridModel",
    "conv": "HaloConvModel",
    "attention": "AttentionModel",
}


def get_model(suite, settings=None):
    """The model of ``suite`` with ``settings`` (default: from the ``MLSCALE_*`` variables), or None for
    a suite without one (a custom ``module:Class`` case). Raises `kernels.errors.InputError` for
    settings that do not resolve."""
    if suite not in MODELS:
        return None
    return getattr(importlib.import_module(f"bench.models.{suite}"), MODELS[suite])(settings)
