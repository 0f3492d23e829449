"""The table `mlscale run` prints on rank 0: one line per finished point, as in nccl-tests."""

COLUMNS = (
    ("variant", 20, "variant"), ("ranks", 5, "ranks"), ("thr", 3, "threads"), ("size", 8, "size_label"),
    ("t_min_us", 11, "t_min_s"), ("t_med_us", 11, "t_med_s"), ("t_max_us", 11, "t_max_s"),
    ("algbw_GB/s", 10, "algbw_gbs"), ("busbw_GB/s", 10, "busbw_gbs"), ("GFLOP/s", 9, "gflops"), ("items/s", 10, "items_per_s"),
    ("metric", 22, "metric"), ("wrong", 5, "wrong"),
)


def format_header():
    """The column titles."""
    return " ".join(f"{title:>{width}}" for title, width, _ in COLUMNS)


def format_row(row):
    """One point: times in microseconds, rates with 3 decimals, blanks where they do not apply."""
    cells = []
    for _, width, key in COLUMNS:
        value = row.get(key)
        if key.startswith("t_"):
            text = f"{value * 1e6:.2f}"
        elif key == "metric":
            text = f"{value}={row['metric_value']:.4g}" if value else ""
        elif key == "items_per_s" and value is not None:
            text = f"{value:.4g}"
        elif isinstance(value, float):
            text = f"{value:.3f}"
        else:
            text = "" if value is None else str(value)
        cells.append(f"{text:>{width}}")
    return " ".join(cells)
