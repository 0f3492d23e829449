"""The calls of the collective suites' ``mpi`` variants that ``mlscale calibrate`` times on its pair of ranks.

Beside ``MPI_Allreduce`` (the ``allreduce`` table), the library's allgather, reduce-scatter,
all-to-all, broadcast and reduce each get a table of seconds per call on two ranks by size
(``library``): MPICH's algorithms inside one node are not the sum of their messages (a
broadcast of 128 KiB takes 3.6 messages' time here, a reduce-scatter of 8 B two allreduces'), so
the models of the ``mpi`` variants scale these measured calls to more ranks
(`bench.models.collective_terms.library`) rather than add up calibrated messages. Each call is the suite's own
``run`` (float64, its default settings: out of place, sum, root 0, whatever ``MLSCALE_COLL_*`` says), so it
takes the Python path a sweep's point takes.
"""
from bench.registry import case_class
from bench.settings import resolve
from kernels.backend import get_backend

SUITES = ("allgather", "reduce_scatter", "alltoall", "bcast", "reduce")
#: Sizes of the tables (bytes of the whole buffer, as the suites count them): 8 B .. 8 MiB, x4, and 16 MiB, the
#: collective suites' largest default size (from the last two a slope continued 8 MiB's doubling, where MPICH's
#: allgather of 16 MiB took 1.3 times its 8 MiB here: predicted 48 % over).
SIZES = tuple(8 << 2 * k for k in range(11)) + (16 << 20,)


def library_callers(pair, stack, sizes=SIZES):
    """``{(suite, n): run}``: one call of each of `SUITES`' ``mpi`` variant on the communicator ``pair`` at
    ``n`` bytes of float64 with the suite's default settings, set up now and torn down when the ``contextlib.ExitStack`` ``stack`` closes.

    Collective over ``pair`` (each setup draws the suite's data; no messages until a call)."""
    backend = get_backend("numpy", pair)
    callers = {}
    for suite in SUITES:
        kind = case_class(suite)
        case = kind(resolve(kind.declared_settings, (), {}, suite))    # defaults, not the environment's
        for n in sizes:
            state = case.setup(pair, n, "mpi", backend, "float64")
            stack.callback(case.teardown, state)
            callers[suite, n] = _runner(case, state)
    return callers


def _runner(case, state):
    return lambda: case.run(state)
