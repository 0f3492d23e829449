"""What a report says about one suite: its digest, superlinear points, and the tables of its kind.

`analyse` turns the entries of `bench.report.scaling.scaling_table` into one dict
per suite, the single source of both the Markdown (`bench.report.summary`) and the
JSON document (`bench.report.output`): plain numbers, no formatting.
"""
from collections import defaultdict

from bench.report.scaling import COMMUNICATION, GROUP, reference_variant, unstable
from bench.report.tables import batch_size_tables, communication_tables, compute_rate_tables, model_state_tables

#: Most sizes a digest shows (the smallest, the largest and evenly spread ones between).
DIGEST_SIZES = 6
#: Efficiency above which a point is flagged superlinear (5 % over linear: less is within noise).
SUPERLINEAR_EFFICIENCY = 1.05
GENERIC_SUPERLINEAR_REASON = ("each rank's share of the data may fit in a faster level of the memory hierarchy "
                              "(cache), or the parallel variant does less work than the serial one")
#: The columns that, with size and rank count, make one digest cell; several values give several digests.
DIGEST_GROUP = ("benchmark", "backend", "dtype", "scaling", "settings")


def analyse(table, fits, projected, rows, suites):
    """One dict per suite, in the order the suites first appear in ``table``.

    Keys: ``suite``, ``kind``, ``reference``, ``size_unit``, ``digest`` (a list of
    `digest` tables), ``superlinear``, ``points`` (the entries), ``fits``,
    ``projection``, ``batch_size`` (`bench.report.tables.batch_size_tables`), ``model_state``
    (`bench.report.tables.model_state_tables`), ``compute_rate`` (`bench.report.tables.compute_rate_tables`:
    empty without a calibration) and,
    for communication suites, ``communication``
    (`bench.report.tables.communication_tables`).
    """
    reports = []
    for suite in dict.fromkeys(e["suite"] for e in table):
        entries = [e for e in table if e["suite"] == suite]
        reference = reference_variant(suite, rows, suites, entries[0]["backend"])
        report = dict(suite=suite, kind=entries[0]["kind"], reference=reference, size_unit=entries[0]["size_unit"],
                      digest=digest(entries, reference, entries[0]["kind"]), superlinear=superlinear(entries, suites[suite]),
                      points=entries, fits=[f for f in fits if f["suite"] == suite],
                      projection=[p for p in projected if p["suite"] == suite],
                      batch_size=batch_size_tables(entries, suites[suite]),
                      model_state=model_state_tables(entries, suites[suite]),
                      compute_rate=compute_rate_tables(entries))
        if report["kind"] == COMMUNICATION:
            report["communication"] = communication_tables(entries)
        reports.append(report)
    return reports


def digest(entries, reference, kind):
    """The best variant per size and rank count and its ratio to ``reference`` (T_ref / T_best).

    Only variants compared with the reference take part (``vs_ref`` known, or the
    reference itself), and only stable points (`bench.report.scaling.unstable`;
    unknown counts as stable): an unstable one is left out and counted. A cell's
    ratio is None when the reference's point there was unstable. In a
    communication suite only rank counts >= 2 count (one rank sends nothing), and
    a suite where no other variant is comparable (``p2p``: latency and bandwidth
    measure different things) has no digest table. Returns one dict per
    combination of `DIGEST_GROUP` values: ``group`` (those values), ``ranks`` (the
    rank counts), ``sizes`` (at most `DIGEST_SIZES`, spread), ``sizes_measured``,
    ``unstable_left_out`` (how many unstable points the cells leave out),
    ``unstable_cells`` (how many cells had no stable point: absent from ``cells``)
    and ``cells`` (``"size ranks"`` -> ``{"variant", "t_med_s", "vs_ref",
    "efficiency"}``; efficiency None in communication suites).
    """
    comparable = [e for e in entries if (e["variant"] == reference or e["vs_ref"] is not None)
                  and (kind != COMMUNICATION or e["ranks"] >= 2)]
    if kind == COMMUNICATION and not any(e["variant"] != reference for e in comparable):
        return []
    groups = defaultdict(list)
    for entry in comparable:
        groups[tuple(entry[c] for c in DIGEST_GROUP)].append(entry)
    tables = []
    for key, members in groups.items():
        best, cells = {}, {(int(e["size"]), e["ranks"]) for e in members}
        for entry in (e for e in members if not unstable(e)):
            cell = (int(entry["size"]), entry["ranks"])
            if cell not in best or entry["t_med_s"] < best[cell]["t_med_s"]:
                best[cell] = entry
        sizes = sorted({size for size, _ in cells})
        tables.append(dict(
            group=dict(zip(DIGEST_GROUP, key)), ranks=sorted({ranks for _, ranks in cells}),
            sizes=spread(sizes, DIGEST_SIZES), sizes_measured=len(sizes),
            unstable_left_out=sum(map(unstable, members)), unstable_cells=len(cells) - len(best),
            cells={f"{size} {ranks}": dict(variant=e["variant"], t_med_s=e["t_med_s"], efficiency=e["efficiency"],
                                           vs_ref=_digest_ratio(e, reference))
                   for (size, ranks), e in best.items()}))
    return tables


def _digest_ratio(entry, reference):
    """A stable point's T_ref / T in the digest: 1 for the reference, None when the reference's point was unstable."""
    if entry["variant"] == reference:
        return 1.0
    return None if entry["ref_stable"] is False else entry["vs_ref"]


def spread(values, most):
    """At most ``most`` of the sorted ``values``: the first, the last and evenly spaced ones between."""
    values = sorted(values)
    if len(values) <= most:
        return values
    picks = {round(i * (len(values) - 1) / (most - 1)) for i in range(most)}
    return [values[i] for i in sorted(picks)]


def superlinear(entries, model):
    """Points of a compute suite more than `SUPERLINEAR_EFFICIENCY` efficient, each with a reason.

    Each carries the point's ``stable``. The reason is the suite's own (its model's ``superlinear_reasons``, by
    variant) when it gives one, else `GENERIC_SUPERLINEAR_REASON`.
    """
    reasons = model.superlinear_reasons if model is not None else {}
    return [dict({c: e[c] for c in GROUP}, ranks=e["ranks"], speedup=e["speedup"], efficiency=e["efficiency"],
                 stable=e["stable"], reason=reasons.get(e["variant"], GENERIC_SUPERLINEAR_REASON))
            for e in entries
            if e["efficiency"] is not None and e["ranks"] > 1 and e["efficiency"] > SUPERLINEAR_EFFICIENCY]
