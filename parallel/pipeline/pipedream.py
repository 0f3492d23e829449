"""PipeDream: an asynchronous pipeline that never flushes, with weight stashing.

Schedule
    The 1F1B order without a flush (`parallel.pipeline.schedule.pipedream_actions`):
    stage ``s`` of ``p`` runs ``w = p - s - 1`` warm-up forwards once, then the forward
    of micro-batch ``j`` and the backward of ``j - w`` in turn, step after step. A step
    (`PipeDream.train_step`) feeds ``m`` micro-batches in; their backwards on stage
    ``s`` lag by ``w``, so up to ``w`` micro-batches stay in flight from one step to
    the next, and `PipeDream.drain` runs the backwards left (the cool-down). In the
    steady state every stage alternates forward and backward: no bubble.
Updates
    Each stage applies ``optimizer.step()`` after every backward micro-batch (after
    sending its input gradient, so the previous stage does not wait for it), with the
    micro-batch's mean gradient (loss divisor: the micro-batch's rows). With one stage
    this is serial SGD on the micro-batches, step by step.
Weight stashing
    A micro-batch's backward must use the weights its forward used. On stage ``s``,
    ``w`` updates fall between the forward and the backward of micro-batch ``j``
    (``min(j, w)`` at the start of a stream): its staleness. Before an update overwrites the
    weights, a copy is stashed if an in-flight micro-batch used them; a backward runs
    with its stashed copy bound in the layers (the optimiser keeps the live arrays),
    and a copy goes once no micro-batch in flight uses it. At most ``w`` copies of the
    stage's parameters are stashed (none on the last stage). The update applied is
    the gradient at the stashed weights, applied to the latest weights: the serial
    replay `serial_pipedream` computes the same.
    (PipeDream-2BW's double-buffered weights are not implemented.)

Communication per step, stage ``s``: as `parallel.pipeline.stage.Pipeline` (``2 m``
messages each way on inner stages), no allreduce; one gradient receive stays posted
between steps.
"""
import numpy as np
from mpi4py import MPI

from kernels.errors import InputError
from parallel.nn.layers import Sequential, softmax_cross_entropy
from parallel.nn.models import forward_backward
from parallel.pipeline.schedule import BACKWARD, FORWARD, pipedream_drain, pipedream_step
from parallel.pipeline.stage import Pipeline


class PipeDream(Pipeline):
    """One stage of a PipeDream pipeline: 1F1B without flush, an update per micro-batch, weight stashing.

    Every rank of ``comm`` builds its own stage (rank ``s`` is stage ``s``); all
    stages call `train_step` and `drain` together.

    Parameters
    ----------
    comm, layers, input_shape, micro_batches, dtype, loss
        As `parallel.pipeline.stage.Pipeline` (``micro_batches`` enter per step).

    Attributes
    ----------
    actions : list of (str, int)
        The last step's actions (micro-batches numbered from the stream's start).
    version : int
        Updates applied on this stage so far.
    staleness : list of int
        For each backward of the last step, the updates between its forward and it.
    peak_stash_bytes : int
        Most bytes of stashed weight copies at once in the last step.
    timeline, action_seconds, peak_in_flight, peak_activation_bytes
        As `Pipeline` (updates count as compute, in their backward's action seconds).
    """

    def __init__(self, comm, layers, input_shape, micro_batches=1, dtype=np.float32, loss=softmax_cross_entropy):
        super().__init__(comm, layers, input_shape, micro_batches, "1f1b", dtype, None, loss)
        self.actions, self.version, self.staleness, self.peak_stash_bytes = [], 0, [], 0
        self._owners = [(leaf.params, name) for layer in self.layers for leaf in layer.leaves()
                        for name in leaf.params]
        self._live = [param for param, _ in self._pairs]
        self._saved, self._saved_bytes, self._output_grads, self._sends, self._inputs = {}, {}, {}, [], {}
        self._used, self._stash, self._step, self._batches, self._rows, self._optimizer = {}, {}, 0, {}, None, None

    @property
    def in_flight(self):
        """Micro-batches forwarded on this stage whose backward has not run yet."""
        return len(self._used)

    def compute_gradients(self, x, y, batch_size=None):
        raise TypeError("PipeDream updates the weights after every micro-batch: call train_step(optimizer, x, y)")

    def train_step(self, optimizer, x, y):
        """Feed ``x, y`` in as ``micro_batches`` micro-batches; update after every backward.

        Parameters
        ----------
        optimizer : object with ``step()``
            Built on `parameters` (e.g. `parallel.nn.optim.SGD`).
        x, y : ndarray, shape (n,) + input_shape and (n,)
            As `Pipeline.compute_gradients`; ``n / micro_batches`` rows per micro-batch,
            the same in every step until `drain`.

        Returns
        -------
        float
            On the last stage the mean of the micro-batches' losses (each at the weights
            its forward used), 0.0 on the others.
        """
        m = self.micro_batches
        rows = self._begin(x, y, m, len(x) // m)
        if self._step and rows != self._rows:
            raise InputError(f"pipedream: micro-batches of {rows} rows while {self._rows}-row ones are in "
                             f"flight; drain() first")
        self._optimizer, self._rows, self.staleness, self.peak_stash_bytes = optimizer, rows, [], 0
        self._batches[self._step] = (x, y)
        self._run_segments(lambda stage: pipedream_step(self.stages, stage, self._step, m))
        self._step += 1
        return self._loss / m

    def drain(self):
        """Run the actions left (the last forwards, the backwards in flight, their updates); afterwards
        nothing is in flight and every send is complete. Every stage calls it; micro-batches are
        numbered from 0 again afterwards."""
        self._reset_figures()
        self.staleness, self.peak_stash_bytes = [], 0
        self._run_segments(lambda stage: pipedream_drain(self.stages, stage, self._step, self.micro_batches),
                           wait=True)
        self._step, self._batches = 0, {}

    def _run_segments(self, segment, wait=False):
        """Run this stage's actions ``segment(s)``, expecting one activation per forward in ``segment(s - 1)``
        and one gradient per backward in ``segment(s + 1)``; sends may stay pending until a later step
        (`drain` waits for them)."""
        self.actions = segment(self.stage)
        for inbox, source, kind in ((self._activations_in, self.stage - 1, FORWARD),
                                    (self._gradients_in, self.stage + 1, BACKWARD)):
            if inbox is not None:
                count = sum(1 for action, _ in segment(source) if action == kind)
                (inbox.expect(count) if inbox.rows == self._rows else inbox.open(self._rows, count))
        self._batch = (None, None, self._rows, self._rows, 0)
        start = MPI.Wtime()
        self._run(self.actions, wait)
        self.timeline["step"] = MPI.Wtime() - start

    def _micro_batch(self, index):
        step, part = divmod(index, self.micro_batches)
        x, y = self._batches[step]
        rows = slice(part * self._rows, (part + 1) * self._rows)
        if part == self.micro_batches - 1:
            del self._batches[step]  # micro-batches are forwarded in order: this stage is done with the step
        return (x[rows] if self.first else None), (y[rows] if self.last else None)

    def _forward(self, index):
        self._used[index] = self.version
        super()._forward(index)

    def _backward_layers(self, index, grad):
        """Backward of micro-batch ``index`` with the weights its forward used (stashed or live)."""
        version = self._used.pop(index)
        self.staleness.append(self.version - version)
        stashed = self._stash.get(version)
        if stashed is not None:
            self._bind(stashed)
        try:
            for layer in reversed(self.layers):
                grad = layer.backward(grad)
        finally:
            if stashed is not None:
                self._bind(self._live)
        if version not in self._used.values():
            self._stash.pop(version, None)
        return grad

    def _backward(self, index):
        super()._backward(index)
        start = MPI.Wtime()
        if self.version in self._used.values() and self.version not in self._stash:
            self._stash[self.version] = [param.copy() for param in self._live]
            self.peak_stash_bytes = max(self.peak_stash_bytes, self.stash_bytes)
        self._optimizer.step()
        self.version += 1
        seconds = MPI.Wtime() - start
        self.timeline["compute"] += seconds
        self.action_seconds[-1] += seconds

    @property
    def stash_bytes(self):
        """Bytes of the stashed weight copies now."""
        return sum(array.nbytes for arrays in self._stash.values() for array in arrays)

    def _bind(self, arrays):
        for (params, name), array in zip(self._owners, arrays):
            params[name] = array


def forward_versions(actions):
    """For each micro-batch forwarded in ``actions`` (one stage's order), the backwards that precede its
    forward: the weight version its forward (and, stashed, its backward) uses."""
    versions, backwards = {}, 0
    for kind, index in actions:
        if kind == FORWARD:
            versions[index] = backwards
        elif kind == BACKWARD:
            backwards += 1
    return [versions[index] for index in sorted(versions)]


def serial_pipedream(layers, bounds, x, y, micro_batches, lr, loss=softmax_cross_entropy, record=None):
    """Serial replay of one PipeDream stream (steps of ``x, y`` from an empty pipeline, then `drain`).

    Micro-batch ``k`` runs forward and backward through the whole model, stage ``s``'s
    layers holding the version its schedule gives (`forward_versions` of one
    `pipedream_step` and `pipedream_drain`); then each stage applies plain SGD,
    ``w <- w - lr g``, with that gradient to its latest weights. How the micro-batches
    are grouped into steps does not change the result.

    Parameters
    ----------
    layers : sequence of Layer
        The whole model; left holding the final weights.
    bounds : list of (int, int)
        Each stage's layer range (`parallel.pipeline.schedule.partition`).
    x, y : ndarray
        The stream's samples in order; ``micro_batches`` micro-batches of equal rows.
    micro_batches : int
    lr : float
    record : list, optional
        Receives, update after update in micro-batch order, ``(stage, [weights])``.
    """
    stages, model = len(bounds), Sequential(list(layers))
    pairs = [[pair for layer in layers[start:stop] for pair in layer.parameters()] for start, stop in bounds]
    rows = len(x) // micro_batches
    versions = [forward_versions(pipedream_step(stages, stage, 0, micro_batches)
                                 + pipedream_drain(stages, stage, 1, micro_batches)) for stage in range(stages)]
    history = [{0: [param.copy() for param, _ in stage_pairs]} for stage_pairs in pairs]
    for k in range(micro_batches):
        for stage in range(stages):
            for (param, _), value in zip(pairs[stage], history[stage][versions[stage][k]]):
                param[...] = value
        part = slice(k * rows, (k + 1) * rows)
        forward_backward(model, loss, x[part], y[part])
        for stage in range(stages):
            latest = [value - lr * grad for value, (_, grad) in zip(history[stage][k], pairs[stage])]
            history[stage][k + 1] = latest
            needed = versions[stage][k + 1] if k + 1 < micro_batches else k + 1
            for old in [version for version in history[stage] if version < min(needed, k + 1)]:
                del history[stage][old]
            if record is not None:
                record.append((stage, latest))
    for stage in range(stages):
        for (param, _), value in zip(pairs[stage], history[stage][micro_batches]):
            param[...] = value
