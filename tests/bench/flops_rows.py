"""The check every compute and training suite's row passes: its rates recomputed from its own numbers."""
import json

import pytest


def dense_flops(rows, widths):
    """Forward and backward flops of dense layers ``widths`` on ``rows`` rows: three GEMMs of ``2 rows i o`` each."""
    return 6 * rows * sum(inputs * outputs for inputs, outputs in zip(widths, widths[1:]))


def assert_rates(row, flops, computing_ranks):
    """``gflops`` > 0 is ``flops`` (one run, every rank) over the row's median time, and ``params``'
    ``gflops_per_rank`` is it over ``computing_ranks`` (to the CSV's 6 digits)."""
    params = row["params"] if isinstance(row["params"], dict) else json.loads(row["params"])
    gflops = float(row["gflops"])
    assert gflops > 0
    assert gflops == pytest.approx(flops / float(row["t_med_s"]) / 1e9, rel=1e-4)
    assert params["gflops_per_rank"] == pytest.approx(gflops / computing_ranks, rel=1e-4)
