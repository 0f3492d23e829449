"""Pipeline parallelism: a model's layers split into stages over ranks, trained on micro-batches.

Micro-batches
    A batch of ``n`` samples (a multiple of ``m``) is cut into ``m`` micro-batches of
    ``b = n / m`` rows, so every message has a shape known in advance: ``(b,) +
    shape``, ``shape`` being the per-sample shape at a stage boundary, found at
    construction by a one-sample forward, stage after stage (``p - 1`` small messages).
Messages
    Forward: the first stage slices its input; stage ``s > 0`` receives each
    micro-batch's activation from ``s - 1`` and sends its output to ``s + 1`` with
    ``Isend``. Backward mirrors it with the output gradients. Receives are posted one
    micro-batch ahead into pooled buffers (`parallel.pipeline.micro_batches.Inbox`); an
    activation's buffer goes back to the pool after its backward (the layers keep a
    reference to their input until then). Sends are non-blocking (blocking ones
    deadlock 1F1B: neighbours send to each other at once), tested after every action
    so that MPI moves them on, and waited for at the end.
    Both schedules take micro-batches in order, as MPI delivers them between two ranks.
Loss and gradients
    The last stage applies ``loss(logits, labels, batch_size)`` (softmax
    cross-entropy) to each micro-batch with the batch size (or the global batch size
    given) as divisor, so the gradients summed over micro-batches are the serial mean.
    Each stage sums its gradients in one flat vector, allreduced over ``data_comm``
    (replicas of the stage: data parallelism) when given, then copied into ``grads``.
Per-micro-batch state
    Saved after each forward and restored before its backward (`parallel.pipeline.micro_batches`).
Timeline (`Pipeline.timeline`, last step)
    Seconds in ``compute`` (forward, backward, loss, gradient sums), ``send``
    (``Isend``, progress tests and the final wait), ``wait`` (blocked waiting for a
    message), ``allreduce`` (data parallelism) and the whole ``step``. The stages'
    compute and step seconds give the measured bubble (the idle share of the busiest
    stage: fill and drain) and the idle share of all stages (the bubble plus what
    unequal stages cost): `parallel.pipeline.schedule.bubble_fraction`, ``idle_fraction``.

Device arrays (CuPy)
    A stage on a device communicator (``backend.comm(comm)``, a
    `kernels.comm.device.DeviceComm`) runs on the device, as does one whose
    parameters are device arrays (`kernels.backend.array_module`): received activations and gradients,
    the gradient sum and the saved micro-batch state stay in device memory; pass
    ``backend.comm(comm)`` (and ``data_comm``) so that every send synchronises the
    stream first and is staged through host memory without a CUDA-aware MPI. Sends
    are completed with `kernels.comm.device.poll_all` / ``wait_all``.

Communication cost per step, stage ``s`` of ``p`` (inner stages; the first and last
stages have half of it), boundary widths ``w_in``, ``w_out`` elements per sample and
``B`` bytes per element: ``2 m`` messages sent and ``2 m`` received, i.e.
``2 m alpha + m b (w_in + w_out) B beta`` each way; plus the allreduce of the stage's
parameters over ``data_comm`` when given.
"""
import numpy as np
from mpi4py import MPI

from kernels.backend import array_module
from kernels.comm import backend_of
from kernels.comm.device import poll_all, wait_all
from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.pipeline.micro_batches import Inbox, restore_caches, reusable, save_caches, saved_bytes
from parallel.nn.models import flatten_arrays, unflatten_vector
from parallel.nn.optim import GradientStep
from parallel.pipeline.schedule import FORWARD, stage_schedule

_FORWARD_TAG, _BACKWARD_TAG, _PROBE_TAG = 11, 12, 13


class Pipeline(GradientStep):
    """One stage of a pipeline-parallel model: run a schedule of micro-batches with its neighbours.

    Every rank of ``comm`` builds its own `Pipeline` (rank ``s`` is stage ``s``).

    Parameters
    ----------
    comm : MPI.Comm
        The stages, in order.
    layers : sequence of Layer
        This stage's layers, e.g. ``model_layers[slice(*partition(model_layers, comm.size)[comm.rank])]``.
    input_shape : tuple of int
        Shape of one input sample (read on the first stage).
    micro_batches : int
        Micro-batches per step (>= 1); every batch must be a multiple of it.
    schedule : {"gpipe", "1f1b"}
    dtype : numpy dtype
        Activations and gradients travel in this dtype.
    data_comm : MPI.Comm, optional
        Replicas of this stage (data parallelism): their summed gradients are allreduced.
    loss : callable
        ``loss(logits, labels, batch_size) -> (value, dlogits)``, like `softmax_cross_entropy`.

    Attributes
    ----------
    xp : module
        NumPy, or the device module (CuPy) on a device communicator or with device parameters.
    input_shape, output_shape : tuple of int
        Per-sample shapes of what this stage receives and sends forward.
    actions : list of (str, int)
        The stage's `stage_schedule`.
    timeline : dict of str to float
        ``compute``, ``send``, ``wait``, ``allreduce`` and ``step`` seconds of the last step.
    action_seconds : list of float
        Compute seconds of each action of `actions` in the last step (for
        `parallel.pipeline.schedule.replay`).
    peak_in_flight : int
        Most micro-batches with saved activations at once (during the last step).
    peak_activation_bytes : int
        Most bytes held for backward at once in the last step: the arrays of the saved
        layer state, and on the last stage the output gradients waiting for their backward.
    """

    def __init__(self, comm, layers, input_shape, micro_batches=1, schedule="1f1b", dtype=np.float32,
                 data_comm=None, loss=softmax_cross_entropy):
        if int(micro_batches) != micro_batches or micro_batches < 1:
            raise InputError(f"pipeline: micro_batches must be an integer >= 1, got {micro_batches}")
        counts = comm.allgather(len(layers))
        if min(counts) == 0:
            raise InputError(f"pipeline: stage {counts.index(0)} of {comm.size} has no layer; every stage "
                             f"needs at least one (fewer stages, or more layers)")
        self.layers, self.comm, self.data_comm, self.loss = list(layers), comm, data_comm, loss
        self.stage, self.stages = comm.rank, comm.size
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.micro_batches, self.dtype = int(micro_batches), np.dtype(dtype)
        self.actions = stage_schedule(schedule, self.stages, self.stage, self.micro_batches)
        self._pairs = [pair for layer in self.layers for pair in layer.parameters()]
        # A device communicator puts the stage on the device even when it holds no parameter (a lone ReLU).
        backend = backend_of(comm)
        self.xp = backend.xp if backend is not None else array_module(*(p for p, _ in self._pairs))
        self._grad_sum = flatten_arrays([grad for _, grad in self._pairs]) if self._pairs else \
            self.xp.zeros(0, self.dtype)
        self._grad_views = unflatten_vector(self._grad_sum, [grad.shape for _, grad in self._pairs])
        self.input_shape, self.output_shape = self._probe_shapes(tuple(input_shape))
        self._activations_in = None if self.first else Inbox(comm, self.stage - 1, _FORWARD_TAG,
                                                             self.input_shape, self.dtype, self.xp)
        self._gradients_in = None if self.last else Inbox(comm, self.stage + 1, _BACKWARD_TAG,
                                                          self.output_shape, self.dtype, self.xp)
        self.timeline, self.action_seconds = {}, []
        self.peak_in_flight = self.peak_activation_bytes = 0

    def parameters(self):
        """Return this stage's ``(param, grad)`` pairs (for the optimiser)."""
        return list(self._pairs)

    def compute_gradients(self, x, y, batch_size=None):
        """Run the schedule on one batch; leave the batch's gradient in the stage's layers.

        Parameters
        ----------
        x, y : ndarray, shape (n,) + input_shape and (n,)
            The batch, passed on every stage: the first stage reads ``x``, the last
            ``y``, the others only ``n``. ``n`` must be a multiple of ``micro_batches``.
        batch_size : int, optional
            Loss divisor (default ``n``; data parallelism passes the global batch size).

        Returns
        -------
        float
            The mean loss of the batch on the last stage (its share of the global
            mean with ``batch_size``), 0.0 on the other stages.
        """
        rows = self._begin(x, y, self.micro_batches, batch_size)
        self._saved, self._saved_bytes, self._output_grads, self._sends, self._inputs = {}, {}, {}, [], {}
        for inbox in (self._activations_in, self._gradients_in):
            if inbox is not None:
                inbox.open(rows, self.micro_batches)
        self._grad_sum.fill(0)
        start = MPI.Wtime()
        self._run(self.actions)
        if self.data_comm is not None:
            self._timed("allreduce", self.data_comm.Allreduce, MPI.IN_PLACE, self._grad_sum)
        self._timed("compute", self._copy_gradients)
        self.timeline["step"] = MPI.Wtime() - start
        self._batch = self._saved = self._output_grads = self._sends = self._inputs = None
        return self._loss

    def _begin(self, x, y, micro_batches, batch_size=None, first=0):
        """Check that the batch splits into ``micro_batches``, keep it (micro-batch ``first`` is its first)
        and reset the step's figures; return the rows per micro-batch."""
        n, m = len(x), micro_batches
        if len(y) != n:
            raise InputError(f"pipeline: {n} samples but {len(y)} labels")
        if n < m or n % m:
            raise InputError(f"pipeline: a batch of {n} samples does not split into {m} equal micro-batches "
                             f"(use a multiple of {m})")
        rows = n // m
        self._batch = (x, y, rows, n if batch_size is None else batch_size, first)
        self._reset_figures()
        return rows

    def _reset_figures(self):
        self._loss = 0.0
        self.timeline = dict.fromkeys(("compute", "send", "wait", "allreduce"), 0.0)
        self.action_seconds = []
        self.peak_in_flight = self.peak_activation_bytes = 0

    def _run(self, actions, wait=True):
        """Run ``actions`` in order, moving sends on after each; with ``wait``, wait for every send at the end."""
        for kind, index in actions:
            (self._forward if kind == FORWARD else self._backward)(index)
            self._timed("send", poll_all, self._sends)
        if wait:
            self._timed("send", wait_all, self._sends)
            self._sends.clear()

    def _copy_gradients(self):
        """Hand the summed micro-batch gradients to the layers' own gradient arrays."""
        for view, (_, grad) in zip(self._grad_views, self._pairs):
            grad[...] = view

    def _probe_shapes(self, input_shape):
        """Per-sample input and output shapes of this stage: a one-sample zero forward, stage after stage."""
        if not self.first:
            input_shape = self.comm.recv(source=self.stage - 1, tag=_PROBE_TAG)
        output_shape = self._forward_layers(self.xp.zeros((1,) + input_shape, self.dtype)).shape[1:]
        if not self.last:
            self.comm.send(output_shape, dest=self.stage + 1, tag=_PROBE_TAG)
        return input_shape, output_shape

    def _forward_layers(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def _timed(self, kind, call, *args):
        start = MPI.Wtime()
        result = call(*args)
        self.timeline[kind] += MPI.Wtime() - start
        return result

    def _computed(self, start):
        """Count the seconds since ``start`` as the compute of one action."""
        seconds = MPI.Wtime() - start
        self.timeline["compute"] += seconds
        self.action_seconds.append(seconds)

    def _send(self, array, dest, tag):
        buffer = self.xp.ascontiguousarray(array.astype(self.dtype, copy=False))
        self._sends.append(self._timed("send", self.comm.Isend, buffer, dest, tag))

    def _forward(self, index):
        samples, labels = self._micro_batch(index)
        inputs = samples if self.first else self._timed("wait", self._activations_in.take)
        start = MPI.Wtime()
        outputs = self._forward_layers(inputs)
        if not self.first:
            self._inputs[index] = reusable(inputs, outputs)
        self._saved[index] = save_caches(self.layers)
        self._saved_bytes[index] = saved_bytes(self._saved[index])
        if self.last:
            value, self._output_grads[index] = self.loss(outputs, labels, self._batch[3])
            self._loss += value
            self._saved_bytes[index] += self._output_grads[index].nbytes
        self._computed(start)
        self.peak_in_flight = max(self.peak_in_flight, len(self._saved))
        self.peak_activation_bytes = max(self.peak_activation_bytes, sum(self._saved_bytes.values()))
        if not self.last:
            self._send(outputs, self.stage + 1, _FORWARD_TAG)

    def _micro_batch(self, index):
        """Inputs and labels of micro-batch ``index`` of the batch being run."""
        x, y, rows, _, first = self._batch
        part = slice((index - first) * rows, (index - first + 1) * rows)
        return x[part], y[part]

    def _backward(self, index):
        if self.last:
            grad = received = self._output_grads.pop(index)
        else:
            grad = received = self._timed("wait", self._gradients_in.take)
        start = MPI.Wtime()
        restore_caches(self._saved.pop(index))
        del self._saved_bytes[index]
        grad = self._backward_layers(index, grad)
        self._computed(start)
        if not self.last:
            self._gradients_in.give_back(reusable(received, grad))
        if not self.first:
            self._activations_in.give_back(self._inputs.pop(index))
            self._send(grad, self.stage - 1, _BACKWARD_TAG)

    def _backward_layers(self, index, grad):
        """Backward of micro-batch ``index`` through the stage's layers; add its gradient to the sum."""
        for layer in reversed(self.layers):
            grad = layer.backward(grad)
        for view, (_, layer_grad) in zip(self._grad_views, self._pairs):
            view += layer_grad
        return grad
