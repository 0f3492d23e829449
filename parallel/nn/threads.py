"""A layer's threads on the host: how many it has, and its batch split over them.

A layer may split its batch over the threads this rank has, `host_threads`: threadpoolctl's
current BLAS limit, which the harness sets per rank (``mlscale sweep --threads``) and a
caller sets with ``threadpool_limits``; at one
thread (and on a device) nothing is split and no pool is started. `split_over_threads`
runs the parts, one on the calling thread, the others on a pool of worker threads
(NumPy's copies, ufuncs and BLAS release the GIL), with BLAS limited to one thread
meanwhile, so that ``threads`` cores are busy, never more; a convolution's GEMMs run on
one BLAS thread whenever it has more than one thread, split or not (OpenBLAS's threads
spin for about 0.1 s after a call and would halve the pool's next parts). A Linear layer
does so only with ``host_split`` (a CNN's dense layers); an MLP's keep BLAS's own threads.
"""
from concurrent.futures import ThreadPoolExecutor, wait
from functools import lru_cache

import numpy as np
from threadpoolctl import ThreadpoolController

from kernels.backend import array_module
from kernels.distribution import block_range

#: Elementwise operations (or GEMM multiply-adds / `GEMM_SPEEDUP`) a thread's part must have to be worth
#: its hand-off (a part on a pool worker costs about 0.1 ms of wake-ups here); less: fewer parts.
WORK_PER_THREAD = 1 << 19

#: How many GEMM multiply-adds cost about one elementwise operation (the `WORK_PER_THREAD` unit).
GEMM_SPEEDUP = 16


@lru_cache(maxsize=1)
def _blas():
    """The BLAS libraries loaded in this process (threadpoolctl's controller, found once)."""
    return ThreadpoolController().select(user_api="blas")


@lru_cache(maxsize=None)
def _workers(count):
    """A pool of ``count`` worker threads, started at first use and kept for the process."""
    return ThreadPoolExecutor(count, thread_name_prefix="mlscale-layers")


def host_threads(array):
    """The threads a layer may use on ``array``: 1 for a device array; on the host, threadpoolctl's current
    BLAS thread limit (1 without a BLAS library)."""
    if array_module(array) is not np:
        return 1
    return max([lib.num_threads or 1 for lib in _blas().lib_controllers], default=1)


def split_over_threads(count, task, threads, work=None, blas=False):
    """Run ``task(part, start, stop)`` for the `block_range` parts of ``count`` items on ``threads`` threads.

    ``min(threads, count)`` parts, fewer when given ``work`` (in `WORK_PER_THREAD` units) is
    too little for that many, at least one; part 0 on the calling thread and the others on as
    many pool workers. With more than one part, or with ``blas`` (the task calls BLAS) and
    ``threads > 1``, BLAS is limited to one thread meanwhile (restored after): BLAS's own
    threads spin for a while after a call, which would take the cores from the pool's next
    parts. The tasks must write disjoint outputs. Returns the tasks' results in part order; a
    task's error is raised once every part has ended.
    """
    parts = max(1, min(threads, count, threads if work is None else work // WORK_PER_THREAD))
    if parts == 1 and (threads <= 1 or not blas):
        return [task(0, 0, count)]
    with _blas().limit(limits=1):
        futures = [_workers(parts - 1).submit(task, part, *block_range(count, parts, part))
                   for part in range(1, parts)]
        try:
            first = task(0, *block_range(count, parts, 0))
        finally:
            wait(futures)
        return [first] + [future.result() for future in futures]
