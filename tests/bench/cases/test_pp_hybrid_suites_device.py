"""Suites ``pp`` and ``hybrid`` on a device backend (simulated GPU always, CuPy where a GPU is visible): MPI."""
import pytest

from bench.cases.hybrid import Hybrid
from bench.cases.pp import PipelineSuite
from bench.settings import resolve
from tests.device_suites import check_point_on_device

pytestmark = pytest.mark.mpi


def _stage_arrays(stage):
    return [param for param, _ in stage.parameters()] + [stage._grad_sum]


@pytest.mark.parametrize("variant", ["gpipe", "1f1b", "pipedream"])
def test_pp_trains_on_the_device_and_checks(device_backend, variant):
    settings = ("PP_WIDTH=6", "PP_LAYERS=3", "PP_MICROBATCHES=3")
    case = PipelineSuite(resolve(PipelineSuite.declared_settings, settings, {}, "pp"))
    check_point_on_device(case, 9, variant, device_backend, "float64",
                          lambda state: _stage_arrays(state.pipeline) + [state.data[0]])


@pytest.mark.parametrize("variant", Hybrid.variants[:-1])
def test_hybrid_trains_on_the_device_and_checks(device_backend, variant):
    settings = ("HYBRID_HIDDEN=6", "HYBRID_FFN=5", "HYBRID_BLOCKS=2", "HYBRID_MICROBATCHES=2")
    case = Hybrid(resolve(Hybrid.declared_settings, settings, {}, "hybrid"))
    check_point_on_device(case, 24, variant, device_backend, "float64",
                          lambda state: _stage_arrays(state.trainer.pipeline))
