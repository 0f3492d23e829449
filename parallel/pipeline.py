"""Pipeline parallelism: a model's layers split into stages over ranks, trained on micro-batches.

Stages
    A model is a list of layers (e.g. ``mlp(...).layers``). Rank ``s`` of the
    pipeline communicator runs stage ``s``: a contiguous range of the layers given
    by `partition`, either ``balance="layers"`` (`block_range` of the layer count:
    stages differ by at most one layer, ReLUs included) or ``balance="params"``
    (the contiguous split that minimises the largest per-stage parameter count).
    Every stage needs at least one layer.
Micro-batches
    A batch of ``n`` samples (a multiple of ``m``) is cut into ``m`` micro-batches of
    ``b = n / m`` rows, so every message has a shape known in advance: ``(b,) +
    shape``, ``shape`` being the per-sample shape at a stage boundary, found at
    construction by a one-sample forward, stage after stage (``p - 1`` small messages).
Schedules (`stage_schedule`)
    ``gpipe``: all ``m`` forwards, then all ``m`` backwards; stage ``s`` keeps the
    activations of ``m`` micro-batches. ``1f1b``: ``w = min(p - s - 1, m)`` warm-up
    forwards, then one forward and one backward in turn, then ``w`` cool-down
    backwards; at most ``min(p - s, m)`` micro-batches in flight on stage ``s``.
    Both have the ideal bubble ``(p - 1) / (m + p - 1)`` (`theoretical_bubble`).
Messages
    Forward: the first stage slices its input; stage ``s > 0`` receives each
    micro-batch's activation from ``s - 1`` (``Recv`` into a fresh buffer, since the
    layers keep a reference for backward) and sends its output to ``s + 1`` with
    ``Isend``. Backward mirrors it with the output gradients. Sends are
    non-blocking (blocking ones deadlock 1F1B: neighbours send to each other at once),
    tested after every action so that MPI moves them on, and waited for at the end.
    Both schedules take micro-batches in order, as MPI delivers them between two ranks.
Loss and gradients
    The last stage applies ``loss(logits, labels, batch_size)`` (softmax
    cross-entropy) to each micro-batch with the batch size (or the global batch size
    given) as divisor, so the gradients summed over micro-batches are the serial mean.
    Each stage sums its gradients in one flat vector, allreduced over ``data_comm``
    (replicas of the stage: data parallelism) when given, then copied into ``grads``.
Per-micro-batch state
    Layers keep what backward needs in attributes whose names start with ``_``
    (``Linear._x``, ``ReLU._mask``...). After each forward the stage saves those
    attributes (references, no copies) of its layers and of layers nested in them,
    and restores them before that micro-batch's backward (`save_caches`).
Timeline (`Pipeline.timeline`, last step)
    Seconds in ``compute`` (forward, backward, loss, gradient sums), ``send``
    (``Isend``, progress tests and the final wait), ``wait`` (blocked in ``Recv``),
    ``allreduce`` (data parallelism) and the whole ``step``. `bubble_fraction` turns
    the stages' compute and step times into the measured bubble.

Communication cost per step, stage ``s`` of ``p`` (inner stages; the first and last
stages have half of it), boundary widths ``w_in``, ``w_out`` elements per sample and
``B`` bytes per element: ``2 m`` messages sent and ``2 m`` received, i.e.
``2 m alpha + m b (w_in + w_out) B beta`` each way; plus the allreduce of the stage's
parameters over ``data_comm`` when given.
"""
import numpy as np
from mpi4py import MPI

from kernels.distribution import block_range
from kernels.errors import InputError
from parallel.layers import Layer, softmax_cross_entropy
from parallel.models import flatten_arrays, unflatten_vector
from parallel.optim import GradientStep

SCHEDULES = ("gpipe", "1f1b")
BALANCES = ("layers", "params")
FORWARD, BACKWARD = "forward", "backward"
_FORWARD_TAG, _BACKWARD_TAG, _PROBE_TAG = 11, 12, 13


def layer_parameter_count(layer):
    """Number of parameter elements of ``layer`` (nested layers included)."""
    return sum(param.size for param, _ in layer.parameters())


def partition(layers, stages, balance="layers"):
    """Return the ``(start, stop)`` layer range of every stage, in stage order.

    Parameters
    ----------
    layers : sequence of Layer
    stages : int
        Number of stages, ``1 <= stages <= len(layers)``.
    balance : {"layers", "params"}
        ``layers``: `block_range` of the layer count. ``params``: minimise the
        largest stage's parameter count (dynamic programming over the cut points;
        on ties, earlier stages get fewer layers).
    """
    n = len(layers)
    if balance not in BALANCES:
        raise InputError(f"unknown pipeline balance {balance!r}; choose from {', '.join(BALANCES)}")
    if not 1 <= stages <= n:
        raise InputError(f"a pipeline of {stages} stages needs at least {stages} layers (one per stage); "
                         f"the model has {n}")
    if balance == "layers":
        return [block_range(n, stages, stage) for stage in range(stages)]
    prefix = np.cumsum([0] + [layer_parameter_count(layer) for layer in layers])
    # cost[k][j]: smallest largest-stage count when the first j layers form k stages; cut[k][j]: last start.
    cost = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=int)
    cost[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                candidate = max(cost[k - 1][i], prefix[j] - prefix[i])
                if candidate < cost[k][j]:
                    cost[k][j], cut[k][j] = candidate, i
    bounds, stop = [], n
    for k in range(stages, 0, -1):
        bounds.append((int(cut[k][stop]), stop))
        stop = int(cut[k][stop])
    return bounds[::-1]


def stage_schedule(name, stages, stage, micro_batches):
    """Return stage ``stage``'s actions in order: ``("forward" | "backward", micro-batch index)`` pairs.

    ``gpipe``: all forwards, then all backwards. ``1f1b``: ``min(stages - stage - 1,
    micro_batches)`` warm-up forwards, one forward and one backward in turn, then
    the remaining backwards.
    """
    if name not in SCHEDULES:
        raise InputError(f"unknown pipeline schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    m = micro_batches
    if name == "gpipe":
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warmup = min(stages - stage - 1, m)
    actions = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [(FORWARD, warmup + i), (BACKWARD, i)]
    return actions + [(BACKWARD, i) for i in range(m - warmup, m)]


def theoretical_bubble(stages, micro_batches):
    """The idle fraction ``(p - 1) / (m + p - 1)`` of a pipeline with equal stage times and free messages."""
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_fraction(compute_seconds, step_seconds):
    """Measured bubble: ``1 - sum(compute) / (p * max(step))`` over the ``p`` stages' times."""
    longest = max(step_seconds)
    return 1.0 - sum(compute_seconds) / (len(compute_seconds) * longest) if longest > 0 else 0.0


def _nested_layers(value):
    if isinstance(value, Layer):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, Layer)]
    return []


def save_caches(layers):
    """Return ``(layer, name, value)`` for every ``_``-named attribute of ``layers`` and their nested layers.

    The values are references (no copies); `restore_caches` puts them back.
    """
    saved, todo = [], list(layers)
    while todo:
        layer = todo.pop()
        for name, value in vars(layer).items():
            nested = _nested_layers(value)
            if nested:
                todo += nested
            elif name.startswith("_"):
                saved.append((layer, name, value))
    return saved


def restore_caches(saved):
    """Set back the attributes recorded by `save_caches`."""
    for layer, name, value in saved:
        setattr(layer, name, value)


def _array_bytes(saved):
    return sum(value.nbytes for _, _, value in saved if isinstance(value, np.ndarray))


class Pipeline(GradientStep):
    """One stage of a pipeline-parallel model: run a schedule of micro-batches with its neighbours.

    Every rank of ``comm`` builds its own `Pipeline` (rank ``s`` is stage ``s``).

    Parameters
    ----------
    layers : sequence of Layer
        This stage's layers, e.g. ``model_layers[slice(*partition(model_layers, comm.size)[comm.rank])]``.
    comm : MPI.Comm
        The stages, in order.
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
    input_shape, output_shape : tuple of int
        Per-sample shapes of what this stage receives and sends forward.
    actions : list of (str, int)
        The stage's `stage_schedule`.
    timeline : dict of str to float
        ``compute``, ``send``, ``wait``, ``allreduce`` and ``step`` seconds of the last step.
    peak_in_flight : int
        Most micro-batches with saved activations at once (during the last step).
    peak_activation_bytes : int
        Most bytes held for backward at once in the last step: the arrays of the saved
        layer state, and on the last stage the output gradients waiting for their backward.
    """

    def __init__(self, layers, comm, input_shape, micro_batches=1, schedule="1f1b", dtype=np.float32,
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
        self._grad_sum = flatten_arrays([grad for _, grad in self._pairs])
        self._grad_views = unflatten_vector(self._grad_sum, [grad.shape for _, grad in self._pairs])
        self.input_shape, self.output_shape = self._probe_shapes(tuple(input_shape))
        self.timeline = {}
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
        n, m = len(x), self.micro_batches
        if len(y) != n:
            raise InputError(f"pipeline: {n} samples but {len(y)} labels")
        if n < m or n % m:
            raise InputError(f"pipeline: a batch of {n} samples does not split into {m} equal micro-batches "
                             f"(use a multiple of {m})")
        rows = n // m
        self._batch = (x, y, rows, n if batch_size is None else batch_size)
        self._saved, self._saved_bytes, self._output_grads, self._sends = {}, {}, {}, []
        self._loss = 0.0
        self.timeline = dict.fromkeys(("compute", "send", "wait", "allreduce"), 0.0)
        self.peak_in_flight = self.peak_activation_bytes = 0
        self._grad_sum.fill(0)
        start = MPI.Wtime()
        for kind, index in self.actions:
            (self._forward if kind == FORWARD else self._backward)(index)
            self._timed("send", MPI.Request.Testall, self._sends)
        self._timed("send", MPI.Request.Waitall, self._sends)
        if self.data_comm is not None:
            self._timed("allreduce", self.data_comm.Allreduce, MPI.IN_PLACE, self._grad_sum)
        self._timed("compute", self._copy_gradients)
        self.timeline["step"] = MPI.Wtime() - start
        self._batch = self._saved = self._output_grads = self._sends = None
        return self._loss

    def _copy_gradients(self):
        """Hand the summed micro-batch gradients to the layers' own gradient arrays."""
        for view, (_, grad) in zip(self._grad_views, self._pairs):
            grad[...] = view

    def _probe_shapes(self, input_shape):
        """Per-sample input and output shapes of this stage: a one-sample zero forward, stage after stage."""
        if not self.first:
            input_shape = self.comm.recv(source=self.stage - 1, tag=_PROBE_TAG)
        output_shape = self._forward_layers(np.zeros((1,) + input_shape, self.dtype)).shape[1:]
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

    def _receive(self, shape, source, tag):
        buffer = np.empty((self._batch[2],) + shape, self.dtype)
        self._timed("wait", self.comm.Recv, buffer, source, tag)
        return buffer

    def _send(self, array, dest, tag):
        buffer = np.ascontiguousarray(array, dtype=self.dtype)
        self._sends.append(self._timed("send", self.comm.Isend, buffer, dest, tag))

    def _forward(self, index):
        x, y, rows, divisor = self._batch
        part = slice(index * rows, (index + 1) * rows)
        inputs = x[part] if self.first else self._receive(self.input_shape, self.stage - 1, _FORWARD_TAG)
        start = MPI.Wtime()
        outputs = self._forward_layers(inputs)
        self._saved[index] = save_caches(self.layers)
        self._saved_bytes[index] = _array_bytes(self._saved[index])
        if self.last:
            value, self._output_grads[index] = self.loss(outputs, y[part], divisor)
            self._loss += value
            self._saved_bytes[index] += self._output_grads[index].nbytes
        self.timeline["compute"] += MPI.Wtime() - start
        self.peak_in_flight = max(self.peak_in_flight, len(self._saved))
        self.peak_activation_bytes = max(self.peak_activation_bytes, sum(self._saved_bytes.values()))
        if not self.last:
            self._send(outputs, self.stage + 1, _FORWARD_TAG)

    def _backward(self, index):
        if self.last:
            grad = self._output_grads.pop(index)
        else:
            grad = self._receive(self.output_shape, self.stage + 1, _BACKWARD_TAG)
        start = MPI.Wtime()
        restore_caches(self._saved.pop(index))
        del self._saved_bytes[index]
        for layer in reversed(self.layers):
            grad = layer.backward(grad)
        for view, (_, layer_grad) in zip(self._grad_views, self._pairs):
            view += layer_grad
        self.timeline["compute"] += MPI.Wtime() - start
        if not self.first:
            self._send(grad, self.stage - 1, _BACKWARD_TAG)
