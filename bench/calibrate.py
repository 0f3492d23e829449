"""``mlscale calibrate``: measure the constants of the cost models (`bench.report.model`).

Between rank 0 and a partner rank (`bench.message_tables`; a rank on another shared-memory node when
there is one, so that a calibration inside a two-node allocation measures the
network: ``scope`` ``inter-node``; else rank 1, ``intra-node``):

Each entry of the message tables is a median over rounds that visit every entry in
turn (a burst of load on a shared machine spreads over many entries), each sample
the mean of back-to-back calls after a barrier:

- ``pingpong``: one-way seconds of a blocking ping-pong at 8 B .. 16 MiB (the table
  messages are interpolated in); ``alpha_s`` and ``beta_s_per_byte`` are its fit
  ``t = overhead + alpha + n beta`` (beta: the slope over 1-16 MiB, alpha: the rest at 8 B);
- ``oneway``: seconds of a message of n bytes one way and its empty acknowledgement, 8 B .. 16 MiB: the models
  price a program's one-way message at it, less the acknowledgement (`bench.models.terms.message`); the
  ping-pong's round trip holds twice the buffers, and here took 3x as long per message at 4-8 MiB;
- ``exchange``: seconds of one ``Sendrecv`` of n bytes each way with both ranks sending at
  once (a step of a ring, recursive doubling or halo exchange), back to back, 8 B .. 16 MiB;
- ``exchange_fresh``: the same exchange, each rank sending what it received in the call before: a send buffer
  just written (in this core's cache, dirty), as a hand-written collective's forwarded or packed blocks are; on
  2 ranks 1.3-2.6x a clean exchange from 4 KiB to 8 MiB in one calibration here;
- ``stream``: seconds per message of a window of `bench.models.p2p.WINDOW` non-blocking
  messages and its acknowledgement (LogGP's gap; OSU's osu_bw pattern), 8 B .. 4 MiB;
- ``allreduce``: seconds of one ``MPI_Allreduce`` (float64 sum) of n bytes, 8 B .. 16 MiB:
  the library's own algorithm, which the model of ``MPI_Allreduce`` scales to more ranks;
- ``library``: seconds of one call of each collective suite's ``mpi`` variant (allgather,
  reduce_scatter, alltoall, bcast, reduce; `bench.library_tables`), 8 B .. 16 MiB: MPI's own
  algorithms, which the models of those variants scale to more ranks;
- ``handoff_s``: the handoff probe (an exchange of 1 MiB each rank has just written) in the state most of the
  samples saw; the tables above keep the samples taken in that state (``handoff_other_samples``: how many
  were not; `bench.message_tables`), and a sweep's points record the same probe (`bench.load.MemoryProbe`);
- ``overhead_s``: the Python path of one message, a ``Sendrecv`` to ``MPI.PROC_NULL``
  (argument handling, no transfer); ``call_s``: a hand-written allreduce of 8 B on
  ``MPI.COMM_SELF`` (the Python path of one call of `parallel.collectives`: checks, plan, copy).

The local rates of `bench.local_rates` (GEMM, the suites' kernels, ``dp``
steps, memory tables, kernel rows, Dis-SMO iterations) are measured twice:

- on rank 0 alone (the other ranks sleep), with one BLAS thread and with one per core:
  recorded as ``[one thread, all cores]`` pairs (``cores`` says how many; the memory
  tables with one thread only). ``gamma_s_per_byte`` is the
  large-size slope of ``reduce``, ``memcpy_bytes_per_s`` the rate of its largest copy;
- under ``busy``, on every rank of rank 0's node at once, each with ``threads`` =
  cores // ``ranks`` BLAS threads (as a sweep's ranks share the node's cores and memory
  bandwidth); absent when rank 0's node holds one rank. Its first two ranks time the handoff probe before each
  sample, as the message tables do: ``busy`` keeps the samples of its reference state (``handoff_s``) and
  ``busy.other_state`` holds the rates of the other (the node's memory moved with it here: the busy ``copy``
  table's rounds disagreed by 0.32-0.34 in three calibrations of pass l, and in pass k the conv sweep, wholly in
  the other state, ran its forward variants 1.2-1.55x faster than the calibration before it priced them).

``quick`` (``mlscale calibrate --quick``) measures the same tables at fewer sizes, in one
round of fewer calls (`QUICK_MESSAGES`, `bench.local_rates.QUICK`): a file of the same
schema, marked ``"quick": true``, in about a tenth of the time; its figures are rough (for
tests and a first look, not for judging model errors).
"""
import json
import os
import tempfile

from mpi4py import MPI

from bench.faults import AGREED, agree, agreed_error, failure_of, sleeping_barrier
from bench.local_rates import FULL, QUICK, STEPS, check_suites, local_rates
from bench.message_tables import FULL_MESSAGES, MIN_SLOPE, QUICK_MESSAGES, measure_pair, node_handoff_prober
from kernels.errors import InputError


def calibrate(comm, quick=False):
    """Measure the model constants (see the module); return them as a dict on every rank.

    ``quick``: the same tables at fewer sizes and rounds (`QUICK_MESSAGES`, `bench.local_rates.QUICK`).

    A failure on some rank (a suite's settings in the environment, say) is raised on
    every rank: an `AgreedInputError` or a `RankError` (`bench.faults`).

    Communication: one ``Split_type``; one agreement (`bench.faults.agree`) on the suites' settings; ping-pongs, exchanges, windows and ``Allreduce`` calls per
    size between rank 0 and its partner (their buffers, 2 x 32 MiB per table, all held at once); on rank 0's node,
    a ``Split`` and, before each sample of its ranks (after a barrier), a handoff probe on its first two ranks and a
    broadcast of its figure; the other ranks wait in a sleeping barrier.
    """
    if comm.size < 2:
        raise InputError("calibrate needs 2 ranks (it measures a ping-pong); use --np 2")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    home = node.allreduce(comm.rank, op=MPI.MIN)  # a node is named by its lowest world rank
    homes = comm.allgather(home)
    away = [rank for rank, where in enumerate(homes) if where != homes[0]]
    partner = away[0] if away else 1
    messages, rates = (QUICK_MESSAGES, QUICK) if quick else (FULL_MESSAGES, FULL)
    agree(comm, check_suites, rates)  # a bad suite setting ends every rank now, not after the message tables
    pair = comm.Split(0 if comm.rank in (0, partner) else MPI.UNDEFINED, comm.rank)
    result = None
    if pair != MPI.COMM_NULL:
        result = measure_pair(pair, messages)
        pair.Free()
    cores = os.cpu_count() or 1
    busy, failure = None, None
    if home == homes[0] and node.size > 1:  # rank 0's node: every rank at once
        threads = max(1, cores // node.size)
        node_pair = node.Split(0 if node.rank < 2 else MPI.UNDEFINED, node.rank)
        try:
            busy = dict(ranks=node.size, threads=threads, **agree(node, local_rates, threads, node, rates,
                                                                  node_handoff_prober(node, node_pair)))
        except AGREED as error:
            failure = failure_of(error, comm.rank)
        finally:
            if node_pair != MPI.COMM_NULL:
                node_pair.Free()
    node.Free()
    if comm.rank == 0 and failure is None:
        try:  # the other ranks sleep: a failure here reaches them through the broadcast below
            alone = _alone_rates(cores, rates)
            result.update(alone, spread={**result["spread"], **alone["spread"]},
                          scope="inter-node" if away else "intra-node", quick=quick)
        except Exception as error:  # noqa: BLE001 - raised on every rank below
            failure = failure_of(error, comm.rank)
        if busy is not None:
            result["busy"] = busy
    result, failure = _sleeping_bcast(comm, (result, failure))
    if failure is not None:
        raise agreed_error(failure)
    return result


def check_output_path(path):
    """Refuse, before anything is measured, an ``--out`` that cannot be written: a folder, a file in a missing
    folder, or a folder this process may not write (`InputError`, one line)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"calibrate --out {path} is a folder; give a file name, e.g. {os.path.join(path, 'calib.json')}")
    if not os.path.isdir(folder):
        raise InputError(f"calibrate --out {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"calibrate --out {path}: cannot write in {folder}")


def summary_line(constants, path):
    """The line `calibrate` ends with: the scope, the message, memory and GEMM constants, the handoff probe and
    where they went."""
    return (f"calibrate ({constants['scope']}{', quick' if constants.get('quick') else ''}): overhead "
            f"{constants['overhead_s'] * 1e6:.2f} us + alpha {constants['alpha_s'] * 1e6:.2f} us per message, "
            f"1/beta {1 / constants['beta_s_per_byte'] / 1e9:.2f} GB/s, 1/gamma "
            f"{1 / constants['gamma_s_per_byte'] / 1e9:.2f} GB/s, memcpy {constants['memcpy_bytes_per_s'] / 1e9:.2f}"
            f" GB/s, GEMM {constants['gemm_flops_per_s'] / 1e9:.1f} GFLOP/s per thread, handoff "
            f"{constants['handoff_s'] * 1e6:.0f} us ({constants['handoff_other_samples']} samples in its other state "
            f"left out) -> {path}")


def write_calibration(path, constants):
    """Write ``constants`` as JSON to ``path`` whole or not at all: a temporary file in the same folder, renamed
    over ``path`` once complete (a full disk leaves an earlier calibration at ``path`` as it was)."""
    folder = os.path.dirname(os.path.abspath(path))
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=".calib-", suffix=".json", dir=folder)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(handle, "w") as stream:
            json.dump(constants, stream, indent=2)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
        raise InputError(f"cannot write {path}: {error.strerror}") from None


def _sleeping_bcast(comm, value):
    """``comm.bcast(value, root=0)`` after a barrier that sleeps, so idle ranks leave their cores alone."""
    sleeping_barrier(comm)
    return comm.bcast(value, root=0)


def _alone_rates(cores, plan):
    """`local_rates` (at ``plan``'s sizes) on this rank alone with one thread and with ``cores``, paired
    ``[one thread, all cores]``."""
    one = local_rates(1, plan=plan)
    every = local_rates(cores, plan=plan) if cores > 1 else one
    suites = {suite: {dtype: {variant: [rate, every[suite][dtype][variant]] for variant, rate in variants.items()}
                      for dtype, variants in one[suite].items()} for suite in ("conv", "attention")}
    (n0, t0), (n1, t1) = one["reduce"][-2:]
    largest, seconds = one["copy"][-1]
    return dict(cores=cores, gemm={dtype: [rates, every["gemm"][dtype]] for dtype, rates in one["gemm"].items()},
                gemm_thin={dtype: [rates, every["gemm_thin"][dtype]] for dtype, rates in one["gemm_thin"].items()},
                thin_rows=list(plan.thin_rows), thin_side=plan.thin_side,
                **suites, **{key: {dtype: [[size, [t, every[key][dtype][i][1]]] for i, (size, t) in enumerate(table)]
                                   for dtype, table in one[key].items()} for key in (*STEPS, "smo_iteration")},
                reduce=one["reduce"], copy=one["copy"], kernel_rows=[one["kernel_rows"], every["kernel_rows"]],
                gemv={dtype: [[nbytes, [t, every["gemv"][dtype][i][1]]] for i, (nbytes, t) in enumerate(table)]
                      for dtype, table in one["gemv"].items()},
                gamma_s_per_byte=max((t1 - t0) / (n1 - n0), MIN_SLOPE), memcpy_bytes_per_s=largest / seconds,
                gemm_sizes=list(plan.gemm_sizes), gemm_flops_per_s=one["gemm"]["float64"][-1],
                dp_rows=list(plan.dp_rows),
                spread=dict(one_thread=one["spread"], **(dict(all_cores=every["spread"]) if cores > 1 else {})))
