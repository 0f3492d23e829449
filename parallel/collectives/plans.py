"""Cached plans of the hand-written collectives: arguments checked and steps laid out once.

A `Collective` (one per algorithm) keeps two kinds of entries in one bounded cache:

layout
    keyed by (collective, communicator, length, dtype, in place, counts, array module): the
    algorithm's `Schedule` for this rank and the scratch vector it uses (in the buffers'
    memory), reused by any buffers of that shape (no schedule or scratch allocation per call);
plan
    keyed by (collective, communicator, sendbuf object, recvbuf object), arrays only
    (NumPy or device arrays; not other buffer-protocol objects): the views of one pair of
    buffers, bound to persistent requests
    (``Send_init`` / ``Recv_init``) the second time the same pair is passed (a point
    repeating the same call), so later calls only start and wait requests and reduce.

A plan is served only to the very objects it was built for (it holds them, so their
ids cannot be reused), and only while the communicator is not freed, the buffers are
still 1-D with the same dtype object, ``recvbuf`` is writeable and ``op`` is the same
(`_Plan.fits`: a few attribute reads per call); any other call is checked in full and
gets a plan of its own. The cache
holds `CACHE_SIZE` entries at most, evicted oldest first but for a second chance to
those used since they were last looked at (CLOCK, close to least recently used; a
hit costs no reordering), and each collective tries its previous call's plan before
the cache; an evicted plan
frees its requests and lets go of its buffers (until then it keeps them alive).
Entries also go on `release_plans` (call it before freeing a communicator used with
repeated buffers: MPI keeps a communicator with persistent requests alive until
they are freed), when MPI deletes a communicator's attributes (an MPI attribute's
delete callback, run once no request holds it), and all at exit.
Not thread-safe: one thread calls the collectives, as the algorithms assume anyway.
"""
import atexit
from collections import OrderedDict

from mpi4py import MPI

from parallel.collectives.attributes import CommAttribute
from kernels.backend import array_module
from parallel.collectives.base import buffer_array, operands, reduce_ufunc, writeable
from parallel.collectives.schedule import bind, free_requests, run_calls

#: Entries (layouts and plans together) the cache holds at most.
CACHE_SIZE = 16

_CACHE = OrderedDict()


class _CommEntries:
    """The cache keys of one communicator, stored as an MPI attribute on it."""

    def __init__(self, comm):
        self.comm, self.keys = comm, set()

    def evict(self):
        """Evict every entry of the communicator (its attribute is being deleted)."""
        for key in list(self.keys):
            _evict(key)


_COMM_ENTRIES = CommAttribute(_CommEntries, _CommEntries.evict)


def _store(key, entry, comm):
    entries = _COMM_ENTRIES.get(comm)
    _evict(key)
    _CACHE[key] = entry
    entry.comm_entries = entries
    entries.keys.add(key)
    while len(_CACHE) > CACHE_SIZE:
        oldest, entry = next(iter(_CACHE.items()))
        if entry.used:                      # second chance (CLOCK): a hit costs one store, not a move
            entry.used = False
            _CACHE.move_to_end(oldest)
        else:
            _evict(oldest)


def _evict(key):
    entry = _CACHE.pop(key, None)
    if entry is not None:
        entry.comm_entries.keys.discard(key)
        entry.release()


def release_plans(comm=None):
    """Drop the cached layouts and plans of ``comm`` (all when None), freeing their persistent requests."""
    for key, entry in list(_CACHE.items()):
        if comm is None or entry.comm_entries.comm == comm:
            _evict(key)


@atexit.register
def _release_before_finalize():
    """Free every request and detach the attribute while Python and MPI are both still up."""
    release_plans()
    _COMM_ENTRIES.delete_all()


class _Layout:
    def __init__(self, schedule, dtype, comm, xp):
        self.schedule, self.comm, self.used = schedule, comm, False
        self.scratch = xp.empty(schedule.scratch, dtype)

    def release(self):
        """Nothing to free: the scratch vector goes with the last plan using it."""


class _Plan:
    """A layout bound to one pair of NumPy buffers; persistent requests from its first `run`."""

    def __init__(self, collective, layout, comm, arrays, ufunc, op, sendbuf, recvbuf, counts):
        self.collective, self.layout, self.comm, self.arrays, self.ufunc, self.op = (
            collective, layout, comm, arrays, ufunc, op)
        self.counts = counts
        self.used = False
        self.sendbuf, self.recvbuf = sendbuf, recvbuf
        self.send_dtype = None if sendbuf is MPI.IN_PLACE else sendbuf.dtype
        self.recv_dtype = recvbuf.dtype
        self.calls, self.requests = None, []

    def fits(self, comm, sendbuf, recvbuf, op, counts):
        """Whether the plan serves this call of its own ``comm``, ``sendbuf`` and ``recvbuf`` objects.

        Only in-place changes of those objects matter, checked cheaply (this runs on every
        call): ``comm`` not freed, the same ``op`` and ``counts``, each buffer still 1-D with the very dtype
        object of the plan, ``recvbuf`` writeable. A shape assignment keeps an array's size,
        so a 1-D shape is then the same one; a dtype assignment gives another dtype object.
        Not detected: an assignment to ``strides`` (deprecated since NumPy 2.4).
        """
        return (comm and (op is self.op or op == self.op) and (counts is self.counts or counts == self.counts)
                and recvbuf.ndim == 1 and recvbuf.dtype is self.recv_dtype and writeable(recvbuf)
                and (sendbuf is MPI.IN_PLACE or (sendbuf.ndim == 1 and sendbuf.dtype is self.send_dtype)))

    def run(self):
        if self.calls is None:
            self.calls, self.requests = bind(self.layout.schedule, self.comm, self.arrays, self.ufunc, True)
        for call in self.calls:
            call()

    def release(self):
        if self.collective.last is self:
            self.collective.last = None
        free_requests(self.requests)
        self.calls, self.requests, self.arrays, self.sendbuf, self.recvbuf = None, [], None, None, None


class Collective:
    """A hand-written collective, run from cached layouts and plans.

    Parameters
    ----------
    name : str
    schedule : callable
        ``schedule(rank, size, n, itemsize, in_place) -> Schedule`` for a full vector of ``n`` items.
    length : callable
        ``length(comm, source, recvbuf) -> n``: checks the buffers' lengths (``ValueError``)
        and returns the full vector's length.
    reduces : bool
        Whether ``op`` applies (else it is ignored and the schedule has no reductions).

    A call with ``counts`` (the v-variants: the blocks given, a hashable value the collective
    defines) passes them on as the last argument of ``length`` and ``schedule``; its layouts
    are kept apart by them.
    """

    def __init__(self, name, schedule, length, reduces=True):
        self.name, self.schedule, self.length, self.reduces = name, schedule, length, reduces
        self.last = None  # the plan of the previous call, tried before the cache

    def __repr__(self):
        return f"Collective({self.name!r})"

    def __call__(self, comm, sendbuf, recvbuf, op="sum", counts=None):
        """Run on ``comm``; return ``recvbuf`` (conventions of `parallel.collectives.base`)."""
        plan = self.last
        if plan is None or plan.recvbuf is not recvbuf or plan.sendbuf is not sendbuf or plan.comm is not comm:
            plan = _CACHE.get((self, id(comm), id(sendbuf), id(recvbuf)))
        if plan is not None and plan.fits(comm, sendbuf, recvbuf, op, counts):
            plan.used, self.last = True, plan
            plan.run()
        else:
            self._first_call((self, id(comm), id(sendbuf), id(recvbuf)), comm, sendbuf, recvbuf, op, counts)
        return recvbuf

    def _first_call(self, key, comm, sendbuf, recvbuf, op, counts):
        """Check everything, run on blocking messages, and keep a plan when the buffers are arrays (NumPy or device)."""
        send = sendbuf if sendbuf is MPI.IN_PLACE else buffer_array("sendbuf", sendbuf)
        recv = buffer_array("recvbuf", recvbuf)
        source = operands(send, recv)
        xp = array_module(recv)
        ufunc = reduce_ufunc(op, source.dtype, xp) if self.reduces else None
        given = () if counts is None else (counts,)
        n = self.length(comm, source, recv, *given)
        layout = self._layout(comm, n, recv.dtype, source is recv, given, xp)
        arrays = {"in": source, "out": recv, "tmp": layout.scratch}
        run_calls(bind(layout.schedule, comm, arrays, ufunc, False)[0])
        if send is sendbuf and recv is recvbuf:
            _store(key, _Plan(self, layout, comm, arrays, ufunc, op, sendbuf, recvbuf, counts), comm)

    def _layout(self, comm, n, dtype, in_place, given, xp):
        key = (self, id(comm), n, dtype, in_place, given, xp)
        layout = _CACHE.get(key)
        if layout is None:
            schedule = self.schedule(comm.rank, comm.size, n, dtype.itemsize, in_place, *given)
            layout = _Layout(schedule, dtype, comm, xp)
            _store(key, layout, comm)
        else:
            layout.used = True
        return layout
