"""The tables a suite's kind calls for: bus bandwidth and latency (communication), batch size and model state
(training), the compute rate per rank against the calibrated GEMM peak (compute and training).

Both take entries of `bench.report.scaling.scaling_table` and return plain
numbers; `bench.report.summary` formats them, `bench.report.output` writes them
as JSON.
"""
import math
from collections import defaultdict

#: Columns that, with the rank count, make one communication table (sizes down, variants across).
COMMUNICATION_GROUP = ("benchmark", "backend", "dtype", "scaling", "settings")
#: Columns that, with model and rank count, make one batch-size table.
BATCH_GROUP = ("backend", "dtype", "variant", "scaling", "settings")
#: Columns that, with model and rank count, make one model-state table (its variants side by side).
STATE_GROUP = ("backend", "dtype", "scaling", "settings")
#: Columns that make one compute-rate table (variant, scaling, size and rank count are its rows).
RATE_GROUP = ("benchmark", "backend", "dtype", "settings")
#: What a compute-rate table keeps of each point.
RATE_FIELDS = ("variant", "scaling", "ranks", "threads", "gflops", "gflops_per_rank", "gemm_peak_gflops",
               "peak_fraction", "stable")
#: The metric a latency test records (one-way latency in microseconds).
LATENCY_METRIC = "latency_us"
#: What a communication table keeps of each point (`bench.report.scaling.scaling_table`'s entries).
POINT_FIELDS = ("variant", "t_med_s", "t_min_s", "t_max_s", "algbw_gbs", "busbw_gbs", "vs_ref", "predicted_s",
                "model_error", "wrong", "stable", "ref_stable")


def communication_tables(entries):
    """Bus bandwidth, ratio to the reference and latency against size, per rank count >= 2.

    One dict per (`COMMUNICATION_GROUP`, rank count): ``group``, ``ranks``,
    ``variants`` (in order of appearance), ``sizes`` (sorted), ``points`` (size,
    variant, t_med_s, t_min_s, t_max_s, algbw_gbs, busbw_gbs, vs_ref, predicted_s,
    model_error, wrong, stable, ref_stable), ``average_busbw`` (variant -> the mean
    bus bandwidth over its sizes, as nccl-tests' "Avg bus bandwidth"; unstable
    points included) and ``latency`` (size, variant, latency_s, stable of the
    points whose metric is `LATENCY_METRIC`). One rank sends nothing, so
    1-rank points have no table.
    """
    groups = defaultdict(list)
    for entry in entries:
        if entry["ranks"] >= 2:
            groups[tuple(entry[c] for c in COMMUNICATION_GROUP) + (entry["ranks"],)].append(entry)
    tables = []
    for key in sorted(groups):
        members = groups[key]
        variants = list(dict.fromkeys(e["variant"] for e in members))
        busbw = defaultdict(list)
        for entry in members:
            busbw[entry["variant"]].append(entry["busbw_gbs"])
        tables.append(dict(
            group=dict(zip(COMMUNICATION_GROUP, key[:-1])), ranks=key[-1], variants=variants,
            sizes=sorted({int(e["size"]) for e in members}),
            points=[dict(size=int(e["size"]), **{c: e[c] for c in POINT_FIELDS})
                    for e in sorted(members, key=lambda e: (int(e["size"]), variants.index(e["variant"])))],
            average_busbw={v: sum(values) / len(values) for v, values in busbw.items()},
            latency=[dict(size=int(e["size"]), variant=e["variant"], latency_s=e["metric_value"] * 1e-6,
                          stable=e["stable"])
                     for e in sorted(members, key=lambda e: int(e["size"]))
                     if e["metric"] == LATENCY_METRIC and e["metric_value"] is not None],
        ))
    return tables


def compute_rate_tables(entries):
    """GFLOP/s per computing rank and its fraction of the calibrated GEMM peak at the point's dtype, threads and
    ranks per node, per `RATE_GROUP`: how near the machine's limit a suite's compute runs (a slow step makes
    communication look cheap).

    For the points that record ``gflops_per_rank`` and were reported with a calibration (``peak_fraction``
    known: `bench.report.scaling.compute_rate`). Returns one dict per table: ``group`` and ``rows`` (size and
    `RATE_FIELDS`), by variant, scaling, size and rank count.
    """
    groups = defaultdict(list)
    for entry in entries:
        if entry.get("peak_fraction") is not None:
            groups[tuple(entry[c] for c in RATE_GROUP)].append(entry)
    return [dict(group=dict(zip(RATE_GROUP, key)),
                 rows=[dict(size=int(e["size"]), **{c: e[c] for c in RATE_FIELDS})
                       for e in sorted(members, key=lambda e: (e["variant"], e["scaling"], int(e["size"]), e["ranks"]))])
            for key, members in groups.items()]


def batch_size_tables(entries, model):
    """Time per epoch and peak memory against the global batch, per model, rank count and `BATCH_GROUP`.

    For training suites whose points record ``samples_per_epoch`` (or, from older
    results, ``epoch_s_estimate``) in ``params``: the time per epoch is the
    measured median step time x ``ceil(samples_per_epoch / batch)`` (else the
    suite's own estimate, marked ``estimate``); the peak memory is
    ``peak_memory_mib`` (None when not recorded). The batch is the global one:
    the suite model's ``problem_size`` of the point (``size`` x ranks under weak scaling).
    Returns one dict per table: ``model``, ``ranks``, ``group`` and ``rows``
    (batch, time_per_epoch_s, time_source, peak_memory_mib, stable), sorted by batch.
    """
    groups = defaultdict(list)
    for entry in entries:
        params = entry["params"]
        if entry["size_unit"] != "samples" or not ({"samples_per_epoch", "epoch_s_estimate"} & set(params)):
            continue
        key = (str(params.get("model", "default")), entry["ranks"]) + tuple(entry[c] for c in BATCH_GROUP)
        groups[key].append(entry)
    tables = []
    for key in sorted(groups):
        rows = []
        for entry in groups[key]:
            batch = _global_batch(entry, model)
            seconds, source = _epoch_seconds(entry, batch)
            memory = entry["params"].get("peak_memory_mib")
            rows.append(dict(batch=batch, time_per_epoch_s=seconds, time_source=source,
                             peak_memory_mib=float(memory) if _finite(memory) else None, stable=entry["stable"]))
        tables.append(dict(model=key[0], ranks=key[1], group=dict(zip(BATCH_GROUP, key[2:])),
                           rows=sorted(rows, key=lambda r: r["batch"])))
    return tables


def model_state_tables(entries, model):
    """Speed and model state of every variant side by side, per model, rank count and `STATE_GROUP`.

    For training suites whose points record ``model_state_bytes`` in ``params``
    (``dp``: the parameters, gradients and optimiser state of the busiest rank).
    Returns one dict per table: ``model``, ``ranks``, ``group`` and ``rows`` (batch,
    variant, items_per_s, vs_ref, model_state_bytes, peak_model_state_bytes,
    stable, ref_stable), by batch then in the order the variants appear.
    """
    groups = defaultdict(list)
    for entry in entries:
        if _finite(entry["params"].get("model_state_bytes")):
            groups[(str(entry["params"].get("model", "default")), entry["ranks"])
                   + tuple(entry[c] for c in STATE_GROUP)].append(entry)
    tables = []
    for key in sorted(groups):
        variants = list(dict.fromkeys(e["variant"] for e in groups[key]))
        rows = [dict(batch=_global_batch(e, model), variant=e["variant"], items_per_s=_global_batch(e, model) /
                     e["t_med_s"], vs_ref=e["vs_ref"], model_state_bytes=e["params"]["model_state_bytes"],
                     peak_model_state_bytes=e["params"].get("peak_model_state_bytes"), stable=e["stable"],
                     ref_stable=e["ref_stable"]) for e in groups[key]]
        tables.append(dict(model=key[0], ranks=key[1], group=dict(zip(STATE_GROUP, key[2:])),
                           rows=sorted(rows, key=lambda r: (r["batch"], variants.index(r["variant"])))))
    return tables


def _global_batch(entry, model):
    size, ranks, scaling = int(entry["size"]), entry["ranks"], entry["scaling"]
    if model is not None:
        return model.problem_size(size, ranks, scaling)
    return size if scaling == "strong" else size * ranks


def _epoch_seconds(entry, batch):
    """(seconds per epoch, where they come from): measured step x steps per epoch, the suite's estimate, or None."""
    params = entry["params"]
    samples = params.get("samples_per_epoch")
    if _finite(samples) and samples > 0 and batch > 0:
        return entry["t_med_s"] * math.ceil(samples / batch), "measured"
    estimate = params.get("epoch_s_estimate")
    if _finite(estimate):
        return float(estimate), "estimate"
    return None, None


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
