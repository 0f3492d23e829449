"""What a sweep asks of a node (memory, cores), checked before anything is measured.

Every suite's model estimates the bytes its busiest rank allocates for a point
(`bench.models.base.Model.memory_bytes`, asked through the case's ``model``); a node
needs, for each point, that much for each of the point's ranks it hosts plus
`RANK_BASELINE_BYTES` for every rank it hosts (the interpreter, NumPy, MPI). A point that needs more than the node has
(`node_memory`: MemAvailable, the cgroup limit) is an `InputError` naming the
need and the node's memory, before the job starts where possible (``sweep``) and
else before the first point (``run``, where every rank agrees); ``--force``
measures anyway. ``--threads`` above the node's cores is refused the same way; a
node where threads x ranks exceed the cores (oversubscribed, slower but valid)
gets a one-line warning.
"""
import math
import os
from pathlib import Path

from kernels.errors import InputError

#: Resident bytes of one rank before any point: Python, NumPy, mpi4py and the MPI library (~42 MiB measured).
RANK_BASELINE_BYTES = 64 << 20
_CGROUP = Path("/sys/fs/cgroup")


def format_bytes(count):
    """``25769803776 -> '24.0 GiB'``: bytes in the largest binary unit that keeps the value >= 1."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def _meminfo(field):
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room():
    """Bytes left under this process's cgroup v2 memory limit, or None when there is no limit."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((_CGROUP / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def node_memory():
    """``(bytes, source)``: the memory this node can give a job now, and where the figure comes from.

    The smaller of MemAvailable (else MemTotal, else ``os.sysconf`` physical
    pages) and the room left under a cgroup v2 limit (containers); None when
    nothing can be read.
    """
    found = [(value, source) for value, source in (
        (_meminfo("MemAvailable"), "MemAvailable"), (_meminfo("MemTotal"), "MemTotal")) if value is not None][:1]
    if not found:
        try:
            found = [(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory")]
        except (ValueError, OSError, AttributeError):
            pass
    room = _cgroup_room()
    if room is not None:
        found.append((room, "cgroup memory.max"))
    return min(found) if found else (None, "")


def node_need(case, config, ranks_on_node):
    """The largest memory one node needs over the points of ``config``, as ``(bytes, description)``.

    ``ranks_on_node(r)`` is how many of the first ``r`` ranks of the job this node
    hosts; ``ranks_on_node(None)``, all ranks it hosts. Points the case cannot run
    (`Case.check_ranks`) are left out, as the sweep skips them. Returns ``(0, "")``
    when nothing can be estimated (an unknown dtype: the sweep refuses it later).
    """
    if config.dtype not in case.dtypes:
        return 0, ""
    baseline = ranks_on_node(None) * RANK_BASELINE_BYTES
    worst = (baseline, "")
    for ranks in config.ranks:
        for variant in config.variants:
            try:
                case.check_ranks(ranks, variant)
            except InputError:
                continue
            for size in config.sizes:
                problem = case.model.problem_size(size, ranks, config.scaling)
                per_rank = case.model.memory_bytes(problem, ranks, variant, config.dtype, config.check)
                need = baseline + ranks_on_node(ranks) * per_rank
                if need > worst[0]:
                    worst = (need, f"{case.name} {variant} size {size} on {ranks} rank(s) needs about "
                                   f"{format_bytes(per_rank + RANK_BASELINE_BYTES)} per rank, "
                                   f"{format_bytes(need)} for the {ranks_on_node(None)} rank(s) on this node")
    return worst


def node_verdict(case, config, ranks_on_node, memory, cores, force):
    """``(error, warning)`` of one node: a one-line refusal (None if it fits or ``force``) and a
    one-line oversubscription warning (or None). ``memory`` is `node_memory`'s pair; ``cores`` the node's."""
    error = warning = None
    if config.threads and cores and config.threads > cores and not force:
        error = (f"--threads {config.threads} is more than the {cores} cores of this node "
                 "(--force to run anyway)")
    elif config.threads and cores and config.threads * ranks_on_node(max(config.ranks)) > cores:
        warning = (f"warning: --threads {config.threads} x {ranks_on_node(max(config.ranks))} rank(s) on this "
                   f"node is more than its {cores} cores: the ranks share cores, timings suffer")
    need, what = node_need(case, config, ranks_on_node)
    available, source = memory
    if error is None and not force and available is not None and need > available:
        error = (f"{what}; the node has {format_bytes(available)} ({source}): use smaller --sizes, "
                 "fewer ranks per node, or --force")
    return error, warning


def check_local(case, config, job_size, force):
    """Check the node this command runs on for a job of ``job_size`` ranks (``mlscale sweep``).

    The ranks are spread evenly over the allocation's nodes inside Slurm
    (``SLURM_JOB_NUM_NODES``), else all on this node. Raises `InputError`.
    """
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1) if os.environ.get("SLURM_JOB_ID") else 1
    per_node = math.ceil(job_size / max(nodes, 1))
    error, _ = node_verdict(case, config, lambda ranks: min(per_node if ranks is None else ranks, per_node),
                            node_memory(), os.cpu_count(), force)
    if error:
        raise InputError(error)


def check_job(comm, case, config, force):
    """Check every node of the job ``comm`` (``mlscale run``); collective.

    Each node's first rank reads its memory and cores; every rank then knows
    its node's verdict, and one allgather makes every rank raise the same
    `InputError` (the first refusing node's) or return the same warning (the
    first warning, or None). Costs a node ``Split_type``, an allgather and a
    broadcast of small objects on it, and one allgather on ``comm``.
    """
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        members = node.allgather(comm.rank)
        memory, cores = node.bcast((node_memory(), os.cpu_count()) if node.rank == 0 else None, root=0)
    finally:
        node.Free()

    def ranks_on_node(ranks):
        return len(members) if ranks is None else sum(1 for rank in members if rank < ranks)

    verdicts = comm.allgather(node_verdict(case, config, ranks_on_node, memory, cores, force))
    errors = [error for error, _ in verdicts if error]
    if errors:
        raise InputError(errors[0])
    return next((warning for _, warning in verdicts if warning), None)
