"""The load on a point's nodes (bench.load): what other processes took, recorded with every row."""
import builtins
import json
import os

import pytest

from bench.load import (BUSY_SHARE, PROBE_EVERY_S, MemoryProbe, PointLoad, busy, busy_summary,
                        memory_probe_enabled, node_cpu_seconds, runnable_tasks)
from tests.clitools import mlscale, rows_of
from tests.mpitools import all_ranks


def test_the_node_figures_come_from_proc_and_are_none_where_it_cannot_be_read(monkeypatch):
    seconds, tasks = node_cpu_seconds(), runnable_tasks()
    assert seconds > 0 and tasks >= 1  # this process is running
    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert (node_cpu_seconds(), runnable_tasks()) == (None, None)


def test_busy_means_others_above_the_share_or_more_threads_than_cores():
    assert not busy(None) and not busy({}) and not busy({"others": None, "oversubscribed": False})
    assert not busy({"others": BUSY_SHARE, "oversubscribed": False})
    assert busy({"others": BUSY_SHARE + 0.01, "oversubscribed": False}) and busy({"others": 0, "oversubscribed": True})
    assert busy_summary(0, 5) is None
    assert busy_summary(2, 5).startswith("# 2 of 5 points ran on a busy node (other processes took over 10% of its")


@pytest.mark.mpi(min_size=1)
def test_every_rank_gets_the_same_load_and_more_threads_than_cores_oversubscribe(comm):
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        probe = MemoryProbe(node)
        paired = comm.allreduce(node.size > 1, op=MPI.LOR)  # some node holds two ranks: its pair probes the handoff
        for threads, probed in ((1, probe), ((os.cpu_count() or 1) + 1, None)):
            figures = PointLoad(comm, node, threads, probed).finish()
            assert all_ranks(comm, comm.allgather(figures) == [figures] * comm.size)
            assert set(figures) == {"others", "runnable", "cores", "oversubscribed", "memory_probe_s",
                                    "handoff_probe_s"}
            assert (figures["memory_probe_s"] > 0) if probed else figures["memory_probe_s"] is None
            assert (figures["handoff_probe_s"] > 0) if probed and paired else figures["handoff_probe_s"] is None
            assert figures["others"] is None or 0 <= figures["others"] <= 1
            expected = any(size * threads > (os.cpu_count() or 1) for size in comm.allgather(node.size))
            assert figures["oversubscribed"] == expected
    finally:
        probe.close()
        node.Free()


def test_a_sweep_records_the_load_of_each_point_and_counts_the_busy_ones(tmp_path):
    path = str(tmp_path / "load.csv")
    threads = str((os.cpu_count() or 1) + 1)  # more BLAS threads than cores: oversubscribed, whatever else runs
    status, out, err = mlscale("run", "tests.fake_cases:TinyCase", "--sizes", "1,2", "--threads",
                               threads, "--force", "--csv", path, MLSCALE_MEMORY_PROBE="1")
    assert status == 0, err
    loads = [json.loads(row["params"])["load"] for row in rows_of(path)]
    assert [figures["oversubscribed"] for figures in loads] == [True, True]
    assert all(figures["cores"] == os.cpu_count() and figures["memory_probe_s"] > 0 for figures in loads)
    assert "# 2 of 2 points ran on a busy node" in out


def test_the_memory_probe_is_on_unless_its_variable_says_0_and_another_value_is_refused_in_one_line(tmp_path):
    assert memory_probe_enabled({}) and memory_probe_enabled({"MLSCALE_MEMORY_PROBE": "1"})
    assert not memory_probe_enabled({"MLSCALE_MEMORY_PROBE": " 0"})
    path = str(tmp_path / "off.csv")
    status, out, err = mlscale("run", "tests.fake_cases:TinyCase", "--sizes", "1", "--csv", path,
                               MLSCALE_MEMORY_PROBE="0")
    assert status == 0, err
    assert [json.loads(row["params"])["load"]["memory_probe_s"] for row in rows_of(path)] == [None]
    status, out, err = mlscale("run", "tests.fake_cases:TinyCase", "--sizes", "1", "--csv", path,
                               MLSCALE_MEMORY_PROBE="yes")
    assert status != 0 and err.strip().splitlines() == [
        "mlscale: error: MLSCALE_MEMORY_PROBE must be 0 (no memory probe) or 1, got 'yes'"]


@pytest.mark.mpi(min_size=1)
def test_the_memory_probe_measures_again_only_a_second_after_its_last_measurement(comm):
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        now = [0.0]
        probe = MemoryProbe(node, clock=lambda: now[0] if node.rank == 0 else -1e9)  # the first rank decides
        measured = iter(range(1, 100))
        probe._measure = lambda: (float(next(measured)), None)
        seen = [probe()]
        now[0] = PROBE_EVERY_S * 0.99
        seen.append(probe())
        now[0] = PROBE_EVERY_S * 1.01
        seen += [probe(), probe()]
        assert [gemv for gemv, _ in seen] == [1.0, 1.0, 2.0, 2.0]
        probe.close()
        probe = MemoryProbe(node)
        (gemv, handoff), again = probe(), probe()
        assert gemv > 0 and again == probe.last == (gemv, handoff)  # a real GEMV, then the same within the second
        assert (handoff > 0) if node.rank < 2 and node.size > 1 else handoff is None  # the node's first two ranks
        probe.close()
    finally:
        node.Free()
