"""Optimisers updating arrays in place: SGD with momentum and weight decay, and Adam.

Under data parallelism the optimiser runs on every replica over the same
allreduced gradient, so its state (SGD's velocity, Adam's two moments) is
replicated: no communication, and ``k`` state vectors of the full parameter
count on every rank. The sharded trainers (`parallel.data.zero`) give it the
pairs of their shard instead (one ``(param, grad)`` slice of the flat vectors per
segment): the same elementwise update on ``1/N`` of the parameters, the state
sharded with them.

The state lives where the parameters do (device arrays for a model moved with
`parallel.nn.layers.Layer.to`); every update is array arithmetic in place: a chain
of ufuncs writing into one scratch array per pair (no temporaries; not state, so
``state_arrays`` leaves it out), on the host over `parallel.nn.threads.host_threads`
parts of a long vector.
"""
import functools
import math

from kernels.backend import array_module
from kernels.errors import InputError
from parallel.nn.threads import host_threads, split_over_threads


def _in_parts(update, passes, param, *others):
    """Run ``update(param, *others)`` on parts of their rows (the same rows of each; None stays None), split
    over `host_threads` by the work of ``passes`` elementwise passes over ``param``."""
    rows = [None if array is None else array.reshape(1) if array.ndim == 0 else array for array in (param,) + others]
    split_over_threads(len(rows[0]), lambda part, start, stop: update(
        *(None if array is None else array[start:stop] for array in rows)), host_threads(param), passes * param.size)


class SGD:
    """SGD with heavy-ball momentum and L2 weight decay (the PyTorch convention).

    Per step, for every pair ``(p, g)`` with velocity ``v`` (zero at start)::

        d = g + weight_decay * p
        v = momentum * v + d          (v = d when momentum == 0)
        p = p - lr * v

    Parameters
    ----------
    pairs : list of (ndarray, ndarray)
        ``(param, grad)`` arrays updated in place, e.g. ``model.parameters()``, or
        ``[(flat_params, flat_grads)]`` from `parallel.nn.models.flat_storage` for one
        fused update. Build the optimiser after any re-binding of the arrays.
    lr : float
        Learning rate; may be changed between steps through the ``lr`` attribute.
    momentum : float
        In ``[0, 1)``.
    weight_decay : float
        ``>= 0``.
    """

    def __init__(self, pairs, lr, momentum=0.0, weight_decay=0.0):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise InputError(f"SGD: need lr > 0, 0 <= momentum < 1, weight_decay >= 0; got "
                             f"{lr}, {momentum}, {weight_decay}")
        self.pairs = list(pairs)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.velocities = [array_module(param).zeros_like(param) for param, _ in self.pairs] if momentum else None
        self._scratch = [array_module(param).empty_like(param) for param, _ in self.pairs]

    def step(self):
        """Apply one update to every parameter from its current gradient."""
        for (param, grad), velocity, scratch in zip(self.pairs, self.velocities or [None] * len(self.pairs),
                                                    self._scratch):
            _in_parts(self._update, 4, param, grad, velocity, scratch)

    def _update(self, param, grad, velocity, out):
        """The update of one part: ``out`` its scratch."""
        xp, direction = array_module(param), grad
        if self.weight_decay:
            xp.multiply(param, self.weight_decay, out=out)
            direction = xp.add(grad, out, out=out)
        if velocity is not None:
            velocity *= self.momentum
            velocity += direction
            direction = velocity
        param -= xp.multiply(direction, self.lr, out=out)

    def state_arrays(self):
        """The state vectors (velocities; none without momentum)."""
        return list(self.velocities or [])


class Adam:
    """Adam with bias correction (Kingma and Ba, 2015, Algorithm 1) and optional L2 weight decay.

    Per step ``t = 1, 2, ...``, for every pair ``(p, g)`` with moments ``m``, ``v``
    (zero at start)::

        g = g + weight_decay * p                  (L2, coupled: the PyTorch ``Adam`` convention)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        p = p - lr * (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)

    The moments have the parameters' dtype (float32 master weights under mixed
    precision) and are replicated under data parallelism (see the module note).

    Parameters
    ----------
    pairs : list of (ndarray, ndarray)
        ``(param, grad)`` arrays updated in place (as for `SGD`).
    lr : float
        Step size (> 0; the ``lr`` attribute may change between steps).
    beta1, beta2 : float
        Decay rates of the moment estimates, in ``[0, 1)``.
    eps : float
        ``> 0``, added to the root of the second moment.
    weight_decay : float
        ``>= 0``.

    Attributes
    ----------
    steps : int
        Updates applied so far (``t`` of the last one).
    """

    def __init__(self, pairs, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        if lr <= 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1) or eps <= 0 or weight_decay < 0:
            raise InputError(f"Adam: need lr > 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got "
                             f"{lr}, {beta1}, {beta2}, {eps}, {weight_decay}")
        self.pairs = list(pairs)
        self.lr, self.beta1, self.beta2, self.eps, self.weight_decay = lr, beta1, beta2, eps, weight_decay
        self.first = [array_module(param).zeros_like(param) for param, _ in self.pairs]
        self.second = [array_module(param).zeros_like(param) for param, _ in self.pairs]
        self._scratch = [array_module(param).empty_like(param) for param, _ in self.pairs]
        self.steps = 0

    def step(self):
        """Apply one update to every parameter from its current gradient."""
        self.steps += 1
        # lr m_hat / (sqrt(v_hat) + eps) = (lr / c1) m / (sqrt(v) / sqrt(c2) + eps)
        update = functools.partial(self._update, self.lr / (1 - self.beta1 ** self.steps),
                                   math.sqrt(1 - self.beta2 ** self.steps))
        for (param, grad), first, second, scratch in zip(self.pairs, self.first, self.second, self._scratch):
            _in_parts(update, 12, param, grad, first, second, scratch)

    def _update(self, step_size, root_second_correction, param, grad, first, second, out):
        """The update of one part: ``out`` its scratch; ``step_size`` is ``lr / c1``."""
        xp = array_module(param)
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        first *= self.beta1
        first += xp.multiply(grad, 1 - self.beta1, out=out)
        second *= self.beta2
        xp.multiply(grad, grad, out=out)
        out *= 1 - self.beta2
        second += out
        xp.sqrt(second, out=out)
        out /= root_second_correction
        out += self.eps
        xp.divide(first, out, out=out)
        param -= xp.multiply(out, step_size, out=out)

    def state_arrays(self):
        """The state vectors (both moments of every pair)."""
        return self.first + self.second


class GradientStep:
    """Mixin for the parallel trainers: one training step is `compute_gradients`, then the optimiser.

    A trainer that finds the step's gradients unusable (an overflow under loss
    scaling) sets ``step_skipped`` in `compute_gradients`; the optimiser then does
    not run and the weights stay as they were.
    """

    step_skipped = False

    def train_step(self, optimizer, x, y, **options):
        """``compute_gradients(x, y, **options)``, then ``optimizer.step()`` unless `step_skipped`;
        return this rank's loss share."""
        value = self.compute_gradients(x, y, **options)
        if not self.step_skipped:
            optimizer.step()
        return value
