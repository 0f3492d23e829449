"""Results rows for the report tests, written as the harness writes them."""
from bench.csvio import COLUMNS, ResultsFile

BIG = 1 << 24


def calibration(alpha=2e-6, beta=1e-10, gamma=5e-11, overhead=1e-7, copy=1.25e-10, rate=3e10, cores=2):
    """A calibration whose tables are straight lines: message (one way, exchange, in a window) and
    MPI_Allreduce on two ranks ``overhead + alpha + n beta``, a hand-written allreduce call ``overhead``, reduction
    ``n gamma``, copy ``n copy``, every compute rate ``rate`` (all cores: twice that)."""
    def line(start, slope):
        return [[1, start + slope], [BIG, start + BIG * slope]]

    rates = [[rate] * 6, [2 * rate] * 6]
    return {"alpha_s": alpha, "beta_s_per_byte": beta or 1e-30, "overhead_s": overhead,
            "gamma_s_per_byte": gamma or 1e-30, "memcpy_bytes_per_s": 1 / (copy or 1e-30), "gemm_flops_per_s": rate,
            "kernel_rows": [1e7, 2e7], "cores": cores, "pingpong": line(overhead + alpha, beta),
            "exchange": line(overhead + alpha, beta), "stream": line(overhead + alpha, beta),
            "allreduce": line(overhead + alpha, beta), "call_s": overhead,
            "dp_step": {"float64": [[32, [1e-3, 1e-3]], [256, [4e-3, 4e-3]]]},
            "reduce": line(0.0, gamma), "copy": line(0.0, copy), "gemm": {"float64": rates, "float32": rates},
            "gemm_sizes": [32, 64, 128, 256, 512, 1024],
            "conv": {"float64": {"forward": [rate, 2 * rate], "forward_backward": [rate, 2 * rate]}},
            "attention": {"float64": {"full": [rate, 2 * rate]}}, "scope": "intra-node"}


CALIB = calibration()


def point(variant, ranks, seconds, size=1024, scaling="strong", suite="gemv", **extra):
    """A results row; a ``gemv`` (compute) point by default, an ``allreduce`` one with bandwidths."""
    bandwidth = dict(size_unit="bytes", algbw_gbs=size / seconds / 1e9,
                     busbw_gbs=size / seconds / 1e9 * (2 * (ranks - 1) / ranks)) if suite == "allreduce" else {}
    return dict(dict(suite=suite, benchmark=suite, variant=variant, backend="numpy", dtype="float64", ranks=ranks,
                     nodes=1, threads=1, scaling=scaling, size=size, size_unit="n", iters=3, warmup=1,
                     t_min_s=seconds, t_med_s=seconds, t_max_s=seconds, wrong=0, settings="{}"),
                **bandwidth, **extra)


def p2p_points(sizes):
    """p2p's latency (one way 3 us + n x 0.1 ns) and bandwidth (a window of 64) tests at ``sizes``."""
    rows = []
    for s in sizes:
        one_way = 3e-6 + s * 1e-10
        rows.append(point("latency", 2, 2 * one_way, size=s, suite="p2p", size_unit="bytes",
                          algbw_gbs=s / one_way / 1e9, busbw_gbs=s / one_way / 1e9, metric="latency_us",
                          metric_value=one_way * 1e6))
        window = 64 * (1e-6 + s * 1e-10)
        rows.append(point("bandwidth", 2, window, size=s, suite="p2p", size_unit="bytes",
                          algbw_gbs=64 * s / window / 1e9, busbw_gbs=64 * s / window / 1e9))
    return rows


def judged(points, unstable=(), unknown=()):
    """``points`` with the columns a sweep's stability check writes: the (variant, size, ranks) in ``unstable``
    with spread 0.6 and stable 0, those in ``unknown`` with both empty (a file written before the columns),
    the others spread 0.05 and stable 1; every point's samples between 0.9 and 1.5 times its median."""
    rows = []
    for row in points:
        key, seconds = (row["variant"], row["size"], row["ranks"]), row["t_med_s"]
        spread, stable = ("", "") if key in unknown else (0.6, 0) if key in unstable else (0.05, 1)
        rows.append(dict(row, spread=spread, stable=stable, t_min_s=0.9 * seconds, t_max_s=1.5 * seconds))
    return rows


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
