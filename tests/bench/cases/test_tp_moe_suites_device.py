"""Suites ``tp`` and ``moe`` on a device backend (simulated GPU always, CuPy where a GPU is visible): MPI."""
import pytest

from bench.cases.moe import MixtureOfExperts
from bench.cases.tp import TensorParallel
from bench.settings import resolve
from tests.device_suites import check_point_on_device

pytestmark = pytest.mark.mpi


def _results_and_grads(state):
    return list(state.result) + [grad for _, grad in state.model.parameters()]


@pytest.mark.parametrize("variant, collectives", [(variant, "mpi") for variant in TensorParallel.variants]
                         + [("allreduce", "recursive"), ("sequence", "ring")])
def test_tp_runs_on_the_device_and_checks(device_backend, variant, collectives):
    settings = ("TP_HIDDEN=8", "TP_FFN=7", f"TP_COLLECTIVES={collectives}")  # hand-written: staged as one call
    case = TensorParallel(resolve(TensorParallel.declared_settings, settings, {}, "tp"))
    check_point_on_device(case, 5, variant, device_backend, "float64", _results_and_grads)


@pytest.mark.parametrize("variant, dtype, alltoall", [("top1", "float64", "mpi"), ("top2", "float32", "mpi"),
                                                     ("top2", "float64", "pairwise")])
def test_moe_runs_on_the_device_and_checks(device_backend, variant, dtype, alltoall):
    settings = ("MOE_HIDDEN=6", "MOE_FFN=5", "MOE_EXPERTS_PER_RANK=2", "MOE_CAPACITY=0.5", f"MOE_ALLTOALL={alltoall}")
    case = MixtureOfExperts(resolve(MixtureOfExperts.declared_settings, settings, {}, "moe"))
    check_point_on_device(case, 13, variant, device_backend, dtype, _results_and_grads)
