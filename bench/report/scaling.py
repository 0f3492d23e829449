"""Scaling tables from results CSVs: speedup, efficiency, Karp-Flatt, Amdahl / Gustafson fits, models.

Suites are of two kinds (`suite_kind`). A *communication* suite (every row's size
in bytes with a bus bandwidth: ``p2p``, ``allreduce``) is compared variant against
reference at the same size and rank count only (``vs_ref`` = T_ref / T, for
variants that move the same bytes per run); speedup, efficiency, Karp-Flatt, fits
and projections are left out, since a collective's "speedup" over its own 1-rank
copy is not a quantity. For a *compute* suite, the time at p ranks is compared
with the time at the smallest rank count measured (1 when present): speedup
S = T_base / T_p x base ranks (strong scaling), efficiency E = S / p (strong) or
T_1 / T_p (weak), and the Karp-Flatt serial fraction e = (1/S - 1/p) / (1 - 1/p).
Each variant is also compared with the suite's reference variant at the same point
(a reference that only runs on one rank, such as ``numpy`` with all BLAS threads,
is taken at 1 rank, so ``vs_ref`` compares explicit with implicit parallelism).
Groups with two or more rank counts get a least-squares Amdahl serial fraction f
(strong: 1/S = f + (1 - f)/p) or Gustafson serial fraction s (weak:
p E = p - s (p - 1)). With a calibration (`bench.report.model`), each point gets the
suite's predicted time and the relative error, and ``project`` rank counts of
compute suites get predictions only.

Every entry carries its row's stability (`bench.stability`): ``spread`` and
``stable`` (True, False, or None for a row written before the columns existed:
unknown, counted as stable, never as unstable) and ``ref_stable``, the same of
the reference point its ``vs_ref`` divides by. `unstable` and `ratio_unstable`
are the only tests of it the report makes.
"""
import json
import os
from collections import defaultdict

from bench.csvio import read_rows, row_problem
from bench.models import get_model
from bench.models import terms
from bench.models.base import MAX_PROJECTED_RANKS
from bench.report.model import calibration_in_state, for_projection, handoff_state, memory_state
from kernels.errors import InputError

GROUP = ("suite", "benchmark", "variant", "backend", "dtype", "scaling", "size", "settings")
SCALING_COLUMNS = GROUP + ("size_unit", "ranks", "threads", "t_med_s", "spread", "stable", "speedup", "efficiency",
                           "karp_flatt", "vs_ref", "predicted_s", "model_error", "algbw_gbs", "busbw_gbs", "gflops",
                           "gflops_per_rank", "gemm_peak_gflops", "peak_fraction", "metric", "metric_value", "accuracy",
                           "wrong")
FIT_COLUMNS = GROUP + ("rank_counts", "law", "serial_fraction", "unstable_points")
PROJECTION_COLUMNS = GROUP + ("ranks", "predicted_s")
COMMUNICATION, COMPUTE = "communication", "compute"
#: The ``params`` entry shown as the suite's accuracy beside its own metric (``dp``).
ACCURACY_PARAM = "test_accuracy"
#: The ``params`` entry of a compute or training suite's achieved rate per computing rank (`bench.models.flops`).
RATE_PARAM = "gflops_per_rank"


def load_results(paths):
    """Valid rows of every CSV in ``paths`` and a warning line (or None) counting the rows skipped.

    A later row replaces an earlier one of the same point. A row that is not a
    valid point (`bench.csvio.row_problem`: a cut row, NaN or non-positive time,
    an empty field, another schema...) is skipped and enters no table or fit.
    """
    latest, skipped, total = {}, [], 0
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"no such results file: {path}")
        for line, row in read_rows(path):
            total += 1
            problem = row_problem(row)
            if problem:
                skipped.append(f"{path} line {line}: {problem}")
                continue
            latest[tuple(row[c] for c in GROUP) + (row["ranks"],)] = row
    first = f" (first: {skipped[0]})" if skipped else ""
    if not latest:
        raise InputError(f"no measured points in {', '.join(paths)}"
                         + (f": all {total} rows are invalid{first}" if skipped else ""))
    warning = (f"report: warning: skipped {len(skipped)} invalid row{'s' if len(skipped) > 1 else ''} of {total}"
               f"{first}") if skipped else None
    return list(latest.values()), warning


class Suites:
    """The suites' models (`bench.models`) by suite name, loaded once with the settings of the ``MLSCALE_*``
    variables; None for a suite without a model (a custom ``module:Class`` case) or whose settings do not
    resolve."""

    def __init__(self):
        self._models = {}

    def __getitem__(self, name):
        if name not in self._models:
            try:
                self._models[name] = get_model(name)
            except InputError:
                self._models[name] = None
        return self._models[name]


def _predict(model, key, ranks, calib, params=None):
    """The model's prediction, with the point's dtype, ranks and recorded ``params`` in the calibration (see
    `bench.models.base.Model.predict`)."""
    if model is None or calib is None:
        return None
    return model.predict(*_point(model, key, ranks, calib, params))


def _measured_by_calibration(model, key, ranks, calib, params):
    """Whether the model's prediction of the point is a calibration entry itself
    (`bench.models.base.Model.measured_by_calibration`)."""
    return model is not None and calib is not None and model.measured_by_calibration(
        *_point(model, key, ranks, calib, params))


def _point(model, key, ranks, calib, params):
    """``(variant, problem size, ranks, calib)`` of a point as the model's methods take them."""
    suite, benchmark, variant, backend, dtype, scaling, size, settings = key
    return (variant, model.problem_size(int(size), ranks, scaling), ranks,
            dict(calib, point_dtype=dtype, point_ranks=ranks, point_params=params or {}))


def unstable(point):
    """Whether a point (an entry, or any dict with its ``stable``) was measured unstable; unknown is not."""
    return point.get("stable") is False


def ratio_unstable(point):
    """Whether a ratio to the reference rests on an unstable point: this one or the reference's."""
    return unstable(point) or point.get("ref_stable") is False


def _stable(row):
    """A row's ``stable`` column as True, False or None (empty: a file written before the column)."""
    return {"1": True, "0": False}.get(str(row.get("stable") or ""))


def suite_kind(rows):
    """`COMMUNICATION` when every row measures bytes with a bus bandwidth (p2p, collectives), else `COMPUTE`."""
    return COMMUNICATION if all(r["size_unit"] == "bytes" and r["busbw_gbs"] for r in rows) else COMPUTE


def scaling_table(rows, calib=None, suites=None):
    """One dict per row: speedup, efficiency, Karp-Flatt (compute suites), ratio to the reference, model.

    Each entry also carries the row's ``kind`` (`suite_kind` of its suite), size
    unit, fastest and slowest times, bandwidths, stability (``spread``, ``stable``,
    ``ref_stable``), the suite's own metric, ``accuracy`` (`ACCURACY_PARAM`
    from ``params``, when recorded) and ``params`` (a dict); with a calibration, the node state its probes saw
    (``memory_state``, ``handoff_state``) and the calibration state that priced it (``calibration_state``:
    `bench.report.model.calibration_in_state`).
    """
    suites = suites or Suites()
    kinds = {name: suite_kind([r for r in rows if r["suite"] == name]) for name in {r["suite"] for r in rows}}
    groups = defaultdict(list)
    for row in rows:
        groups[tuple(row[c] for c in GROUP)].append(row)
    reference = {}
    for key, members in groups.items():
        if key[2] == reference_variant(key[0], rows, suites, key[3]):
            for row in members:
                reference[_peer_key(key, row["ranks"])] = row
    table = []
    for key in sorted(groups, key=_sort_key):
        members = sorted(groups[key], key=lambda r: int(r["ranks"]))
        base_ranks, base_time = int(members[0]["ranks"]), float(members[0]["t_med_s"])
        strong, compute = key[5] == "strong", kinds[key[0]] == COMPUTE
        for row in members:
            ranks, seconds = int(row["ranks"]), float(row["t_med_s"])
            speedup = base_time / seconds * (base_ranks if strong else 1) if compute else None
            if compute:
                ref = reference.get(_peer_key(key, row["ranks"]), reference.get(_peer_key(key, 1)))
            else:
                ref = reference.get(_peer_key(key, row["ranks"]))
                ref = ref if ref is not None and _same_bytes(ref, row) else None
            params = _params(row)
            priced, state = calibration_in_state(calib, params)
            predicted = _predict(suites[key[0]], key, ranks, priced, params)
            table.append(dict(
                zip(GROUP, key), kind=kinds[key[0]], size_unit=row["size_unit"], ranks=ranks,
                threads=int(row["threads"]), t_med_s=seconds,
                t_min_s=float(row["t_min_s"]), t_max_s=float(row["t_max_s"]), spread=_number(row.get("spread")),
                stable=_stable(row), ref_stable=_stable(ref) if ref is not None else None,
                speedup=speedup, efficiency=(speedup / ranks if strong else base_time / seconds) if compute else None,
                karp_flatt=_karp_flatt(speedup, ranks) if compute and strong and base_ranks == 1 else None,
                vs_ref=float(ref["t_med_s"]) / seconds if ref is not None else None, predicted_s=predicted,
                model_error=(predicted - seconds) / seconds if predicted is not None else None,
                calibration_entry=predicted is not None and _measured_by_calibration(suites[key[0]], key, ranks,
                                                                                     priced, params),
                memory_state=memory_state(priced, _on_node(row), params), handoff_state=handoff_state(priced, params),
                calibration_state=state,
                algbw_gbs=_number(row["algbw_gbs"]), busbw_gbs=_number(row["busbw_gbs"]),
                **compute_rate(row, params, calib), metric=row["metric"],
                metric_value=_number(row["metric_value"]), accuracy=_number(params.get(ACCURACY_PARAM)),
                wrong=row["wrong"], params=params,
            ))
    return table


def compute_rate(row, params, calib):
    """``gflops`` (the row's: every rank), ``gflops_per_rank`` (`RATE_PARAM`, recorded by the compute and training
    suites), and with a calibration ``gemm_peak_gflops``, the calibrated rate of its largest GEMM at the row's dtype,
    BLAS threads and ranks per node (`bench.models.terms.gemm_peak`: the ``busy`` rate on 2+ ranks of a node), and
    ``peak_fraction`` = gflops_per_rank / that peak; None where unknown."""
    value = params.get(RATE_PARAM)
    per_rank = _number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    peak = None
    if calib is not None and per_rank is not None:
        peak = terms.gemm_peak(dict(calib, point_dtype=row["dtype"]), _on_node(row), int(row["threads"])) / 1e9
    return dict(gflops=_number(row.get("gflops")), gflops_per_rank=per_rank, gemm_peak_gflops=peak,
                peak_fraction=per_rank / peak if peak else None)


def _on_node(row):
    """Ranks sharing a node at a row's point (its ranks over its nodes, rounded up)."""
    return -(-int(row["ranks"]) // max(int(_number(row.get("nodes")) or 1), 1))


def reference_variant(suite, rows, suites, backend="numpy"):
    """The suite's reference on ``backend``: its first variant that runs there (gemm: ``numpy`` on
    the host, ``cupy`` on a GPU), or the first measured of its `reference_variants` (dp: ``keras``, else
    ``mpi``), or (a suite this installation cannot load) the first one read."""
    model = suites[suite]
    if not model:
        return next(r["variant"] for r in rows if r["suite"] == suite)
    elsewhere = model.device_only_variants if backend == "numpy" else model.host_only_variants
    runnable = [variant for variant in model.variants if variant not in elsewhere] or list(model.variants[:1])
    preferred = [variant for variant in model.reference_variants if variant in runnable] or runnable[:1]
    measured = {r["variant"] for r in rows if r["suite"] == suite and r["backend"] == backend}
    return next((variant for variant in preferred if variant in measured), preferred[0])


def _same_bytes(ref, row):
    """Whether two rows of a communication suite move the same bytes per run (algbw x time)."""
    ref_bytes, row_bytes = (float(r["algbw_gbs"] or 0) * float(r["t_med_s"]) for r in (ref, row))
    return abs(ref_bytes - row_bytes) <= 1e-3 * max(ref_bytes, row_bytes)


def _number(text):
    if text is None or text == "":
        return None
    value = float(text)
    return value if value == value else None


def _params(row):
    """The row's ``params`` as a dict (an empty one when the column is empty or not a JSON object)."""
    try:
        params = json.loads(row.get("params") or "{}")
    except ValueError:
        return {}
    return params if isinstance(params, dict) else {}


def _peer_key(key, ranks):
    return (key[0], key[1]) + key[3:] + (str(ranks),)


def _karp_flatt(speedup, ranks):
    if ranks < 2 or speedup <= 0:
        return None
    return (1 / speedup - 1 / ranks) / (1 - 1 / ranks)


def _sort_key(key):
    suite, benchmark, variant, backend, dtype, scaling, size, settings = key
    return suite, benchmark, backend, dtype, settings, scaling, variant, int(size)


def serial_fractions(table):
    """Amdahl (strong) or Gustafson (weak) serial fraction per compute group with >= 2 rank counts from 1 rank,
    with the number of its points that were unstable (``unstable_points``)."""
    groups = defaultdict(list)
    for entry in table:
        groups[tuple(entry[c] for c in GROUP)].append(entry)
    fits = []
    for key, entries in groups.items():
        counts = [e["ranks"] for e in entries]
        if len(entries) < 2 or counts[0] != 1 or entries[0]["kind"] != COMPUTE:
            continue
        points = [(e["ranks"], e["speedup"], e["efficiency"]) for e in entries if e["ranks"] > 1]
        if key[5] == "strong":
            xs = [1 - 1 / p for p, _, _ in points]
            ys = [1 / s - 1 / p for p, s, _ in points]
            law = "amdahl"
        else:
            xs = [p - 1 for p, _, _ in points]
            ys = [p - p * e for p, _, e in points]
            law = "gustafson"
        fraction = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        fits.append(dict(zip(GROUP, key), rank_counts=" ".join(map(str, counts)), law=law,
                         serial_fraction=fraction, unstable_points=sum(map(unstable, entries))))
    return fits


def projections(table, calib, rank_counts, suites=None):
    """Predicted seconds at ``rank_counts`` for every group of a compute suite that declares a cost model,
    with inter-node message constants when the calibration has them (`bench.report.model.for_projection`).

    Raises `InputError` for a rank count above `bench.models.base.MAX_PROJECTED_RANKS`.
    """
    if rank_counts and max(rank_counts) > MAX_PROJECTED_RANKS:
        raise InputError(f"--project {max(rank_counts)}: the cost models project to at most {MAX_PROJECTED_RANKS} "
                         "ranks")
    suites = suites or Suites()
    calib = for_projection(calib)[0]
    groups = {tuple(e[c] for c in GROUP): e["params"] for e in table if e["kind"] == COMPUTE}
    rows = []
    for key in sorted(groups, key=_sort_key):
        for ranks in rank_counts:
            predicted = _predict(suites[key[0]], key, ranks, calib, groups[key])
            if predicted is not None:
                rows.append(dict(zip(GROUP, key), ranks=ranks, predicted_s=predicted))
    return rows
