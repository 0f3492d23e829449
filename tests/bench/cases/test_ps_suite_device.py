"""Suite ``ps`` on a device backend (simulated GPU always, CuPy where a GPU is visible): MPI, 2-4 ranks."""
import pytest

from bench.cases.ps import ParameterServerSuite
from bench.settings import resolve
from tests.device_suites import check_point_on_device

pytestmark = pytest.mark.mpi


def _shared_state(state):
    ps = state.ps
    return [ps.shard, ps._gradient] if ps.is_server else [ps.flat_params, ps.flat_grads]


@pytest.mark.parametrize("variant", ["sync", "async", "ssp"])
def test_ps_trains_on_the_device_and_checks(device_backend, variant):
    case = ParameterServerSuite(resolve(ParameterServerSuite.declared_settings, ("PS_STALENESS=1",), {}, "ps"))
    check_point_on_device(case, 7, variant, device_backend, "float64", _shared_state)
