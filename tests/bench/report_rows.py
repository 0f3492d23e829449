"""Results rows for the report tests, written as the harness writes them."""
from bench.csvio import COLUMNS, ResultsFile

CALIB = {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_byte": 5e-11,
         "memcpy_bytes_per_s": 8e9, "gemm_flops_per_s": 3e10}


def point(variant, ranks, seconds, size=1024, scaling="strong", suite="gemv", **extra):
    """A results row; a ``gemv`` (compute) point by default, an ``allreduce`` one with bandwidths."""
    bandwidth = dict(size_unit="bytes", algbw_gbs=size / seconds / 1e9,
                     busbw_gbs=size / seconds / 1e9 * (2 * (ranks - 1) / ranks)) if suite == "allreduce" else {}
    return dict(dict(suite=suite, benchmark=suite, variant=variant, backend="numpy", dtype="float64", ranks=ranks,
                     nodes=1, threads=1, scaling=scaling, size=size, size_unit="n", iters=3, warmup=1,
                     t_min_s=seconds, t_med_s=seconds, t_max_s=seconds, wrong=0, settings="{}"),
                **bandwidth, **extra)


def write_points(path, points):
    results = ResultsFile(str(path))
    for row in points:
        results.append(row)
    results.close()
    return str(path)


def amdahl_points(variant, serial_fraction, scaling="strong", **extra):
    """Times of a program with the given serial fraction on 1, 2, 4 ranks (strong) or weak-scaled."""
    if scaling == "strong":
        return [point(variant, p, serial_fraction + (1 - serial_fraction) / p, **extra) for p in (1, 2, 4)]
    return [point(variant, p, p / (p - serial_fraction * (p - 1)), scaling="weak", **extra) for p in (1, 2, 4)]


def as_read(points):
    """Rows as `bench.csvio.read_rows` gives them: every column, as text."""
    return [{c: "" if r.get(c) is None else str(r.get(c)) for c in COLUMNS} for r in points]
