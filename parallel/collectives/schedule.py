"""Precomputed schedules of the hand-written collectives and the calls that run them.

An algorithm describes one rank's part of a collective once per (rank count, rank,
length, place) as a `Schedule`: a list of steps, each posting sends and receives of
contiguous views of three named buffers (``"in"``: the input, ``"out"``: ``recvbuf``,
``"tmp"``: scratch owned by the schedule), then reducing or copying views locally.
`bind` turns a schedule and actual arrays into a flat list of argument-free
calls, either blocking (``Sendrecv`` / ``Send`` / ``Recv``) or on persistent requests
(``Send_init`` / ``Recv_init``, each step started and waited request by request,
which costs mpi4py less than ``Startall`` / ``Waitall`` on a list). Running a plan is
then one loop over prepared calls: no argument checks, slicing or allocation per call.

On device arrays (a CUDA-aware MPI takes them as they are) the reductions and copies are
the array module's (``xp.add(a, b, out=)``, ``xp.copyto``), queued on the current stream,
and a step whose ops are followed by more messages ends by synchronising that stream, so
MPI never reads a block a kernel is still writing: the data never leaves the device. On a
`parallel.collectives.nccl_wire.NcclWire` each step's messages are one NCCL group on that
stream (stream-ordered: no step waits), and the last call synchronises the stream.
"""
from functools import partial

import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from parallel.collectives.nccl_wire import NcclWire

#: Tag of every message sent by the collectives, apart from the user's own traffic on ``comm``.
COLLECTIVE_TAG = 0x6D6C


class Schedule:
    """One rank's steps of a collective on the named buffers "in", "out" and "tmp".

    Attributes
    ----------
    scratch : int
        Items of the "tmp" buffer the steps use (0: none), kept up to date by `step`.
    steps : list of (sends, recvs, ops)
        ``sends`` / ``recvs``: tuples of ``((buffer, slice), peer)``; ``ops``: tuples of
        ``("reduce", a, b, out)`` (``out = a (op) b``), ``("copy", source, target)`` or
        ``("early_copy", source, target)``, each view a ``(buffer, slice)`` pair. A step's ops run
        after its messages complete, but its early copies while they are in flight (after the
        messages are started, before they are waited for): an early copy writes no view the step's
        messages touch and reads none it receives.
    """

    def __init__(self):
        self.scratch, self.steps = 0, []

    def step(self, sends=(), recvs=(), ops=()):
        """Append a step; return the schedule. A step may send to and receive from any number of
        peers (`bind` says how its messages are posted)."""
        self.steps.append((tuple(sends), tuple(recvs), tuple(ops)))
        views = [spec for spec, _ in sends] + [spec for spec, _ in recvs] + [spec for _, *specs in ops for spec in specs]
        self.scratch = max([self.scratch] + [part.stop for name, part in views if name == "tmp"])
        return self

    def exchange(self, outgoing, dest, incoming, source, reduce=None):
        """Send ``outgoing`` to ``dest`` while receiving ``incoming`` from ``source``; then the optional
        ``reduce = (a, b, out)``."""
        return self.step([(outgoing, dest)], [(incoming, source)], [("reduce",) + reduce] if reduce else ())

    def copy(self, source, target):
        """A local copy (no message)."""
        return self.step(ops=[("copy", source, target)])

    def extend(self, other):
        """Append the steps of ``other`` (a schedule on the same buffers, run after these); return the
        schedule."""
        self.steps += other.steps
        self.scratch = max(self.scratch, other.scratch)
        return self

    def relabelled(self, peer_of):
        """The same steps with every peer ``r`` replaced by ``peer_of(r)`` (a schedule written for
        virtual ranks, run on real ones: a collective rooted at 0 run for another root)."""
        schedule = Schedule()
        schedule.scratch = self.scratch
        schedule.steps = [(tuple((spec, peer_of(peer)) for spec, peer in sends),
                           tuple((spec, peer_of(peer)) for spec, peer in recvs), ops)
                          for sends, recvs, ops in self.steps]
        return schedule


def chosen_schedule(choose, schedules, rank, p, n, itemsize, in_place=False, counts=None):
    """The schedule of the algorithm that ``choose(p, n * itemsize)`` names in ``schedules``.

    An ``auto`` collective's schedule builder is ``partial(chosen_schedule, choose, SCHEDULES)``:
    ``(rank, p, n, itemsize, in_place) -> Schedule``, choosing by the whole vector's bytes and the
    rank count (the same on every rank, since all pass the same length and dtype).

    Parameters
    ----------
    choose : callable
        ``choose(p, nbytes) -> name``.
    schedules : dict
        Name -> schedule builder ``(rank, p, n, itemsize, in_place) -> Schedule``.
    rank, p, n, itemsize, in_place
        As the builders take them: this rank, the rank count, the items of the whole vector,
        their size in bytes, in place or not.
    counts : tuple, optional
        The blocks of a v-variant, passed on when given (the builders then take them).
    """
    build = schedules[choose(p, n * itemsize)]
    return build(rank, p, n, itemsize, in_place) if counts is None else build(rank, p, n, itemsize, in_place, counts)


def bind(schedule, comm, arrays, ufunc, persistent):
    """The calls running ``schedule`` on ``arrays`` (a dict: buffer name -> 1-D array).

    Parameters
    ----------
    schedule : Schedule
    comm : MPI.Comm
    arrays : dict
        "in", "out" and "tmp" arrays (only those the schedule names are used).
    ufunc : ufunc or None
        The reduction of "reduce" ops, of the arrays' module (None for collectives that do not reduce).
    persistent : bool
        True: messages on persistent requests (returned too, for `free_requests`; none on an NCCL wire);
        False: blocking ``Sendrecv`` (one message each way), ``Send`` / ``Recv`` (one
        way only, in turn), or ``Irecv`` / ``Isend`` and one ``Waitall`` (several
        messages both ways).

    Returns
    -------
    calls : list of callables
        Each takes no argument (bound methods and `functools.partial` objects).
    requests : list of MPI.Prequest
    """
    def view(spec):
        name, part = spec
        return arrays[name][part]

    xp = array_module(*arrays.values())
    synchronize = None if xp is np else _stream_synchronizer(xp)
    last_message = max((index for index, (sends, recvs, _) in enumerate(schedule.steps) if sends or recvs),
                       default=-1)
    wire = isinstance(comm, NcclWire)
    calls, requests = [], []
    for index, (sends, recvs, ops) in enumerate(schedule.steps):
        sends = [(view(spec), peer) for spec, peer in sends]
        recvs = [(view(spec), peer) for spec, peer in recvs]
        early = [partial(xp.copyto, view(specs[1]), view(specs[0])) for kind, *specs in ops if kind == "early_copy"]
        if wire:
            calls += early
            if sends or recvs:
                calls.append(partial(comm.exchange, sends, recvs))
        elif persistent:  # the early copies while the messages are in flight
            posted = ([comm.Recv_init(buf, peer, COLLECTIVE_TAG) for buf, peer in recvs]
                      + [comm.Send_init(buf, peer, COLLECTIVE_TAG) for buf, peer in sends])
            requests += posted
            calls += [request.Start for request in posted] + early + [request.Wait for request in posted]
        else:  # blocking calls: the early copies first
            calls += early
            if len(sends) == 1 and len(recvs) == 1:
                (outgoing, dest), (incoming, source) = sends[0], recvs[0]
                calls.append(partial(comm.Sendrecv, outgoing, dest, COLLECTIVE_TAG, incoming, source,
                                     COLLECTIVE_TAG))
            elif sends and recvs:
                calls.append(partial(_post_and_wait, comm, sends, recvs))
            else:
                calls += [partial(comm.Recv, buf, peer, COLLECTIVE_TAG) for buf, peer in recvs]
                calls += [partial(comm.Send, buf, peer, COLLECTIVE_TAG) for buf, peer in sends]
        for kind, *specs in ops:
            if kind == "reduce":
                a, b, out = (view(spec) for spec in specs)
                # ``out`` positionally is cheaper to call; NumPy deprecates that for np.maximum only.
                calls.append(partial(ufunc, a, b, out) if ufunc is np.add else partial(ufunc, a, b, out=out))
            elif kind == "copy":
                source, target = specs
                calls.append(partial(xp.copyto, view(target), view(source)))
        if ops and synchronize is not None and index < last_message and not wire:
            calls.append(synchronize)
    if wire:
        calls.append(comm.synchronize)
    return calls, requests


def _stream_synchronizer(xp):
    """A call waiting for the work queued on device module ``xp``'s current stream (the one current when called)."""
    stream = xp.cuda.get_current_stream
    return lambda: stream().synchronize()


def _post_and_wait(comm, sends, recvs):
    """Every receive and send of a step in flight at once, then wait for all."""
    MPI.Request.Waitall([comm.Irecv(buf, peer, COLLECTIVE_TAG) for buf, peer in recvs]
                        + [comm.Isend(buf, peer, COLLECTIVE_TAG) for buf, peer in sends])


def run_calls(calls):
    """Run prepared argument-free calls in order."""
    for call in calls:
        call()


def free_requests(requests):
    """Free persistent requests (inactive ones; an active one is completed first)."""
    for request in requests:
        if request:
            request.Wait()
            request.Free()
