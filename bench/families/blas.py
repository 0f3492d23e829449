"""What the suites ``blas1``, ``gemv`` and ``gemm`` share: seeded inputs, checks, the run, metrics.

Implicit against explicit parallelism. The library variants (``numpy``; in blas1
``numpy_dot``, ``numpy_nrm2``, ``numpy_axpy``), first in each suite (the report's
reference), are one process calling the BLAS library on the
whole problem with every BLAS thread the harness gives it; the other variants
are the hand-written kernels of kernels/ on ``p`` ranks, one block each, with
the threads per rank the harness pins (default: the node's cores / ranks). A
library variant runs on one rank only (`check_ranks` raises InputError
otherwise): a sweep over ranks 1,2 measures it at 1 rank, where that rank gets
every core, and skips it at 2 with a note. So compare ``numpy`` at 1 rank with a
kernel at p ranks; the report's ``vs_ref`` compares variants at the same rank
count, i.e. a kernel on one rank against the library.

Weak scaling keeps the work per rank fixed: n is multiplied by p^(1/e) for work
growing as n^e (rounded to an integer).

Settings (`bench.models.blas`: `GRID` for gemv 2d and gemm summa, summa_lookahead, summa_shared,
`PANEL` and `REPLICAS` for gemm; recorded in ``params``): a grid without ``ranks``
ranks is an InputError (skipped with a note in sweeps that do not name the variant).
The cost models, the rank counts that fit and the grids are the suites' models'
(`bench.models.blas`, `bench.models.blas1` / `gemv` / `gemm`).

Inputs. Row i of a global matrix M (A, B; the vectors x and y are the rows of a
matrix ``VECTOR_ROW`` wide, read in order) is drawn from the generator seeded
with (SEED, M, i): integers in [-64, 64) divided by 64. Any rank builds any block
without the global matrix (a block of columns generates its full rows and keeps
its columns, p times the work of a row block), and checks regenerate what they
need. These 7-bit values make float64 sums exact in any order (nrm2's square
root aside); checks still allow for rounding.

Checks compare with a float64 reference regenerated from the seed: an entry is
wrong when ``|result - reference| > 2 k eps(dtype) s`` or NaN, with ``k`` the
number of terms summed and ``s`` the matching sum of magnitudes (|A| |B| for
GEMM): the rounding bound of any summation order, for result and reference.
TF32 (CuPy's float32 matrix products with ``CUPY_TF32=1``, recorded as param
``tf32`` by gemv and gemm) rounds the factors to 10 mantissa bits, so float32
is then checked with TF32's eps, ``2**-10``, instead of float32's ``2**-23``.

Backends. On ``numpy`` everything is on the host. On ``cupy`` the inputs are drawn
on the host with the same seeds, moved to the device once in setup, and the
kernels run there on the backend's communicator (`kernels.backend.Backend.comm`:
grids are built on it); checks move results to the host. The NumPy library
variants are host-only (one process, threaded BLAS); gemm's ``cupy`` (``matmul``
on one GPU, cuBLAS) is its device counterpart and device-only.

Metrics: gflops (nominal flops of the suite / time), metric ``comm_share`` =
communication seconds / (communication + computation) seconds, summed over ranks
and runs, from the kernels' ``timings`` (waiting for a late rank counts as
communication; for the overlapping GEMMs only the exposed part: posting and waiting on
requests). params: exposed_comm_s and busy_s (those seconds per run, mean over ranks),
layout (grid shape), panel (the summa variants), replicas (25d), node_shared (summa_shared),
comm_bytes_per_rank (from the cost model), blas_threads (as pinned in setup),
tf32 (gemv, gemm: whether CuPy computes float32 products in TF32; false on numpy).
"""
import os
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info

from bench.case import Case, Metrics
from bench.models.blas import CHUNK_ROWS, VECTOR_ROW, is_library
from kernels.backend import array_module
from kernels.distmatrix import DistMatrix, timed
from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from kernels.gemm import grid_25d

SEED = 2024
MATRIX_IDS = {"A": 1, "B": 2, "x": 3, "y": 4}
TF32_EPS = 2.0 ** -10     # TF32 keeps 10 of float32's 23 mantissa bits



def seeded_rows(name, rows, width, dtype="float64"):
    """Rows ``rows`` (a sequence of indices) of the seeded global matrix ``name`` with ``width`` columns."""
    block = np.empty((len(rows), width), dtype)
    for position, row in enumerate(rows):
        block[position] = np.random.default_rng([SEED, MATRIX_IDS[name], row]).integers(-64, 64, width) / 64
    return block


def seeded_vector(name, start, stop, dtype="float64"):
    """Entries ``[start, stop)`` of the seeded vector ``name``."""
    first = start // VECTOR_ROW
    flat = seeded_rows(name, range(first, -(-stop // VECTOR_ROW)), VECTOR_ROW, dtype).ravel()
    return flat[start - first * VECTOR_ROW:stop - first * VECTOR_ROW].copy()


def seeded_matrix(name, n, comm, layout, dtype, backend):
    """This rank's block of the seeded ``n x n`` matrix ``name`` as a `DistMatrix` (no communication).

    Drawn on the host, then moved once into ``backend``'s memory.
    """
    matrix = DistMatrix.zeros(comm, (n, n), layout, dtype)
    first, last = matrix.row_range
    for start in range(first, last, CHUNK_ROWS):
        rows = range(start, min(last, start + CHUNK_ROWS))
        matrix.local[start - first:rows.stop - first] = seeded_rows(name, rows, n, dtype)[:, matrix.col_slice]
    return DistMatrix(comm, backend.from_host(matrix.local), matrix.shape, layout)


def count_wrong(result, expected, magnitude, terms, dtype, eps=None):
    """Entries farther from ``expected`` than ``2 terms eps magnitude``; NaN counts as wrong.

    ``result`` is on the host; ``eps`` defaults to ``dtype``'s machine epsilon.
    """
    eps = np.finfo(dtype).eps if eps is None else eps
    bound = 2 * terms * eps * np.asarray(magnitude)
    return int(np.count_nonzero(~(np.abs(np.asarray(result, np.float64) - expected) <= bound)))


def tf32_enabled(backend):
    """Whether ``backend`` multiplies float32 matrices in TF32 (CuPy with ``CUPY_TF32`` > 0, as CuPy reads it)."""
    try:
        return backend.name == "cupy" and int(os.environ.get("CUPY_TF32", "0")) > 0
    except ValueError:
        return False


def library_kernel(function, *args):
    """A kernel calling ``function(*args)``, timed as computation (the library variants never communicate)."""
    xp = array_module(*args)

    def kernel(timings):
        with timed(timings, "compute", xp):
            return function(*args)
    return kernel


def _blas_threads():
    return max((lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"), default=None)


@dataclass
class _State:
    comm: object                               # the backend's communicator (Backend.comm)
    variant: str
    size: int
    dtype: str
    backend: object
    data: dict = field(default_factory=dict)   # "layout" and the inputs (A, B, x, y), per suite
    kernel: object = None                      # callable(timings) -> result
    result: object = None
    runs: int = 0
    timings: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)


class BlasCase(Case):
    """What the three suites share: the set-up, the run and metrics; rank counts, grids and costs
    are the model's (``self.model``, a `bench.models.blas.BlasModel`).

    A suite implements ``build(state)`` (fills ``state.kernel`` and ``state.data``, with
    ``"layout"`` a string or a `ProcessGrid`), ``check`` and ``flops(n)`` (nominal,
    global). ``matrix_products`` (gemv, gemm) records param ``tf32``.
    """

    matrix_products = False

    def teardown(self, state):
        layout = state.data.get("layout")
        if isinstance(layout, ProcessGrid):
            layout.free()

    def layout(self, comm, variant, one_d):
        """Where ``variant`` puts its matrices on ``comm``: its `ProcessGrid` (freed by `teardown`), or ``one_d``."""
        if variant == "25d":
            return grid_25d(comm, self.model.replicas)
        dims = self.model.grid_dims(variant, comm.size)
        return ProcessGrid(comm, dims) if dims else one_d

    def setup(self, comm, size, variant, backend, dtype):
        if size < 1:
            raise InputError(f"{self.name}: n must be >= 1, got {size}")
        reason = self.unavailable(comm, variant, backend)
        if reason:
            raise InputError(f"{self.name} {variant} on the {backend.name} backend: {reason}")
        self.check_ranks(comm.size, variant)
        state = _State(backend.comm(comm), variant, size, dtype, backend)
        self.build(state)
        layout = state.data["layout"]
        label = "x".join(map(str, layout.dims)) if isinstance(layout, ProcessGrid) else (
            "1 process" if is_library(variant) else layout)
        words = self.model.cost(variant, size, comm.size).words
        state.params = dict(layout=label, comm_bytes_per_rank=round(words * np.dtype(dtype).itemsize),
                            blas_threads=_blas_threads())
        if self.matrix_products:
            state.params["tf32"] = tf32_enabled(backend)
        if variant.startswith("summa"):
            state.params["panel"] = self.model.panel
        if variant == "25d":
            state.params["replicas"] = self.model.replicas
        return state

    def run(self, state):
        state.result = state.kernel(state.timings)
        state.runs += 1

    def metrics(self, state, seconds):
        """Rates of the point; collective (one small ``Allreduce`` of the phase times)."""
        spent = np.array([state.timings.get("comm", 0.0), sum(state.timings.values())])
        state.comm.Allreduce(MPI.IN_PLACE, spent, op=MPI.SUM)
        per_run = max(1, state.runs) * state.comm.size
        state.params.update(exposed_comm_s=round(spent[0] / per_run, 6), busy_s=round(spent[1] / per_run, 6))
        rates = dict(gflops=self.flops(state.size) / seconds / 1e9, **self.rates(state, seconds)) if seconds > 0 else {}
        return Metrics(metric="comm_share", metric_value=spent[0] / spent[1] if spent[1] > 0 else 0.0, **rates)

    def rates(self, state, seconds):
        """algbw: the cost model's bytes sent per rank / time (None for variants that do not communicate)."""
        nbytes = state.params["comm_bytes_per_rank"]
        return {"algbw_gbs": nbytes / seconds / 1e9 if nbytes else None}

    def params(self, state):
        return state.params

    def check_eps(self, state):
        """Epsilon of the check: TF32's for float32 products in TF32, else None (the dtype's own)."""
        return TF32_EPS if state.params.get("tf32") and np.dtype(state.dtype) == np.float32 else None
