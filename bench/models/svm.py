"""Model of suite ``svm`` (`bench.cases.svm`): training the serial and distributed SVMs."""
from pathlib import Path

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.models.terms import log2_ceil
from bench.settings import Setting
from kernels.errors import InputError
from svm.datasets import NAMES, SYNTHETIC_FEATURES, TEST_FRACTION
from svm.solver.smo import DEFAULT_CACHE_BYTES

#: Estimator of each variant, as ``module:Class`` (imported lazily).
ESTIMATORS = {"sklearn": "sklearn.svm:SVC", "smo": "svm.solver.svc:SVC", "dis_smo": "svm.distributed.dis_smo:DisSMO",
              "cascade": "svm.distributed.cascade:CascadeSVM", "dcsvm": "svm.distributed.dcsvm:DCSVM",
              "cpsvm": "svm.distributed.casvm:CPSVM", "casvm": "svm.distributed.casvm:CASVM"}
#: (samples, features) of the bundled sets (`svm.datasets.NAMES`), for the memory estimate.
DATA_SHAPES = {"digits": (1797, 64), "mnist": (5000, 784), "breast_cancer": (569, 30)}
#: Features of the generated sets (`svm.datasets.GENERATED`), drawn for the size asked for.
GENERATED_FEATURES = {"synthetic": SYNTHETIC_FEATURES, "moons": 2}


def data_source(variable, text, allowed):
    """The data set: a name of `svm.datasets.NAMES` or an existing svmlight file."""
    if text not in NAMES and not Path(text).is_file():
        raise InputError(f"{variable} must be one of {', '.join(NAMES)} or an svmlight file, got {text!r}")
    return text


DATA = Setting("SVM_DATA", data_source, "mnist", "|".join(NAMES) + "|FILE",
               "data set: a bundled name or an svmlight / LIBSVM file (mnist: at most 4,000 training samples)")


#: Calls of one Dis-SMO iteration on a rank, counted in `svm.distributed.dis_smo`: select_i (two masks, two
#: candidates: argmax and fetch, the records array, the counted Allreduce) about 16, select_j (the cached row,
#: the second-order gain in six passes, a candidate of four payloads, the Allreduce) about 25, update (the pair
#: step's scalar arithmetic, alpha and the index sets of two samples, the row of j, three passes on F) about 30.
ITERATION_CALLS = 70
#: Element-wise passes of one Dis-SMO iteration over a rank's block: select_i five (two masks, a negation,
#: two argmax), select_j twelve (the mask and the gain's terms, its clip and mask, the argmax), update three.
PASSES = 20
#: Calls of one kernel row computed (`svm.solver.gram.Kernel.block` for RBF: the product, the norms, five
#: in-place passes, the cache's insertion).
ROW_CALLS = 10
#: Calls of the Python reduction op (`svm.distributed.dis_smo._keep_better`: two buffer views, the comparison in
#: five passes, the masked copy) a rank runs at each step of an ``Allreduce`` of candidates: 8-13 us here, as an
#: ``Allreduce`` with it took 22-27 us against 6-7 us with ``MPI.MAX`` on 2 ranks.
OP_CALLS = 12
#: Bytes of the two ``Allreduce`` of candidate records per iteration (two records, then one).
CANDIDATE_BYTES = (96, 48)
#: Columns of a calibrated kernel row (`bench.local_rates`' ``kernel_rows``): the row's calls, `ROW_CALLS`, are
#: spread over them in the calibrated rate.
KERNEL_COLUMNS = 2000
#: Why a variant's speedup may exceed the rank count (shown by `mlscale report` beside such points).
_SMALLER = "SMO's cost grows faster than linearly with the samples, and this variant solves {}"
_PARTITIONED = _SMALLER.format("p problems of n/p samples and no global one: smaller problems, not the same one faster")


def _candidates(calib, ranks):
    """Seconds of one iteration's two ``Allreduce`` of candidates on ``ranks`` ranks: MPI's allreduce of their
    bytes (`collective_terms.allreduce`) and, at each of its log2 p steps, the Python reduction op
    (`OP_CALLS` calls)."""
    return sum(collective_terms.allreduce(calib, nbytes, ranks) + terms.calls(calib, OP_CALLS * log2_ceil(ranks))
               for nbytes in CANDIDATE_BYTES)


def _kernel_row(calib, columns, ranks, features):
    """Seconds of one RBF kernel row of ``columns`` entries of ``features`` features: its `ROW_CALLS` calls, and
    the entries at the calibrated rate (`terms.kernel_rows`, measured at `KERNEL_COLUMNS` entries a row) less
    those calls, scaled by ``features`` / 784."""
    call = terms.calls(calib, ROW_CALLS)
    entry = max(1 / terms.kernel_rows(calib, ranks) - call / KERNEL_COLUMNS, 0.0)
    return call + columns * entry * features / 784


def _iteration_terms(calib, block):
    """The counted local work of one Dis-SMO iteration on a block of ``block`` samples: `ITERATION_CALLS`
    calls and `PASSES` passes over the block's float64 entries, each at a copy's time."""
    return terms.calls(calib, ITERATION_CALLS) + PASSES * terms.copy(calib, 8 * block)


class SVMModel(Model):
    name = "svm"
    variants = tuple(ESTIMATORS)
    size_unit = "samples"
    declared_settings = (DATA,)
    host_only_variants = {"sklearn": "scikit-learn's SVC runs on the host only"}
    superlinear_reasons = {
        "cpsvm": _PARTITIONED,
        "casvm": _PARTITIONED,
        "cascade": _SMALLER.format("sub-problems first and passes on only their support vectors"),
        "dcsvm": _SMALLER.format("sub-problems first, then a global solve warm-started from their support vectors"),
    }

    def __init__(self, settings=None):
        super().__init__(settings)
        self.data = self.settings[DATA.name]

    def predict(self, variant, size, ranks, calib):
        """``dis_smo`` only, given the iterations the fit took (``n_iter`` in the point's params: Dis-SMO
        follows serial SMO's iterates, so the count is the same at every rank count) and the kernel rows it
        computed (``kernel_rows`` in params, its cache's misses; a file without them: every row the iterations
        could touch, at most n).

        Per iteration: the local work of a rank's n / p samples on the line through the two calibrated
        one-rank iterations around that block (``smo_iteration``, `terms.fitted_step`: measured as a solve
        runs them, after a kernel row has taken the caches, where the same calls in tight loops took a half to
        a third of the time; it holds the candidates' Python path on one rank and the cache's work on a miss)
        over the terms `_iteration_terms`; then the two ``Allreduce`` of candidates (`_candidates`: MPI's
        small allreduce and the Python reduction op, `OP_CALLS` calls at each of its log2 p steps). Per kernel row
        (`_kernel_row`): its calls and the rank's n / p columns at the calibrated rate (a row of 250 columns
        took 31 us here, 1.5x its columns' share of a 2000-column row). Then the final gathers. A calibration
        without ``smo_iteration`` (older files): the terms alone. None for the other variants: their iteration counts (cascade
        passes, k-means, per-partition solves) are no function of the constants, so a model would only
        restate the measurement."""
        params = calib.get("point_params") or {}
        if variant != "dis_smo" or not params.get("n_iter"):
            return None
        iterations, local = int(params["n_iter"]), size / ranks
        if "smo_iteration" in calib:
            fixed, scale = terms.fitted_step(calib, "smo_iteration", lambda block: _iteration_terms(calib, block),
                                             ranks, local)
            local_step = fixed + scale * _iteration_terms(calib, local)
        else:
            local_step = _iteration_terms(calib, local) + terms.calls(calib, 4)
        computed = params.get("kernel_rows") or min(size, 2 * iterations)
        row = _kernel_row(calib, local, ranks, params.get("n_features", 784))
        return iterations * (local_step + _candidates(calib, ranks)) + computed * row + \
            collective_terms.allgather(calib, 8 * size, ranks)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """The whole data set in float64 on every rank (the loaded set, its split copies; for an
        svmlight file, twice the file's bytes as a guess), kernel-row caches bounded by
        `svm.solver.smo.DEFAULT_CACHE_BYTES` or the ``n x n`` Gram matrix, and the check's serial
        reference fit on rank 0 (as much again)."""
        samples, features = DATA_SHAPES.get(self.data, (None, None))
        if self.data in GENERATED_FEATURES:
            samples, features = round(problem / (1 - TEST_FRACTION)) + 1, GENERATED_FEATURES[self.data]
        data = 3 * 8 * samples * features if samples else 2 * Path(self.data).stat().st_size
        cache = min(DEFAULT_CACHE_BYTES, 8 * problem * problem) + 8 * problem * 64
        return data + cache * (2 if check else 1)
