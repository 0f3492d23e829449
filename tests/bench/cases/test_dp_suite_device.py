"""Suite ``dp`` on a device backend (simulated GPU always, CuPy where a GPU is visible): MPI, 1-4 ranks."""
import pytest

from bench.cases.dp import DataParallel
from bench.settings import resolve
from tests.device_suites import check_point_on_device

pytestmark = pytest.mark.mpi

#: (variant, settings): every exchange, 16-bit exchange and compute, Adam, accumulation and buckets; the
#: sharded variants on the hand-written collectives (staged as one call) and on MPI's (each call staged).
POINTS = [
    ("mpi", ()),
    ("mpi_overlap", ("DP_BUCKET_BYTES=1K", "DP_MICRO_BATCHES=2")),
    ("ring", ("DP_OPTIMIZER=adam",)),
    ("rabenseifner", ("DP_PRECISION=bfloat16",)),
    ("mpi", ("DP_PRECISION=float16", "DP_BUCKET_BYTES=4K")),
    ("mpi", ("DP_COMPUTE=float16", "DP_OPTIMIZER=adam")),
    ("mpi_overlap", ("DP_COMPUTE=bfloat16", "DP_PRECISION=bfloat16", "DP_BUCKET_BYTES=2K")),
    ("zero2", ("DP_ZERO_COLLECTIVES=ring", "DP_MICRO_BATCHES=2", "DP_BUCKET_BYTES=8K")),
    ("zero3", ("DP_OPTIMIZER=adam", "DP_COMPUTE=float16")),
]


def device_outputs(state):
    """The arrays a step leaves: the parameters (a sharded trainer's shards), the gradients, the data."""
    trainer = state.trainer
    if state.settings["sharding"]:
        return trainer.param_pieces + trainer.grad_pieces + [state.data[0]]
    return [trainer.flat_params, trainer.flat_grads, state.data[0]]


@pytest.mark.parametrize("variant, assignments", POINTS)
def test_dp_trains_on_the_device_and_checks(device_backend, variant, assignments):
    dtype = "float32" if any("COMPUTE" in word for word in assignments) else "float64"
    case = DataParallel(resolve(DataParallel.declared_settings, ("DP_DATASET=digits",) + assignments, {}, "dp"))
    check_point_on_device(case, 13, variant, device_backend, dtype, device_outputs)
