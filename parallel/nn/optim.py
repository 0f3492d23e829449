"""Stochastic gradient descent with momentum and weight decay, updating arrays in place."""
import numpy as np

from kernels.errors import InputError


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
        self.velocities = [np.zeros_like(param) for param, _ in self.pairs] if momentum else None

    def step(self):
        """Apply one update to every parameter from its current gradient."""
        for index, (param, grad) in enumerate(self.pairs):
            direction = grad + self.weight_decay * param if self.weight_decay else grad
            if self.momentum:
                velocity = self.velocities[index]
                velocity *= self.momentum
                velocity += direction
                direction = velocity
            param -= self.lr * direction


class GradientStep:
    """Mixin for the parallel trainers: one training step is `compute_gradients`, then the optimiser."""

    def train_step(self, optimizer, x, y, **options):
        """``compute_gradients(x, y, **options)``, then ``optimizer.step()``; return this rank's loss share."""
        value = self.compute_gradients(x, y, **options)
        optimizer.step()
        return value
