"""Adam against the paper's formulas, and the skipped step of the trainers' `GradientStep`."""
import math

import numpy as np
import pytest

from kernels.errors import InputError
from parallel.nn.layers import softmax_cross_entropy
from parallel.nn.models import forward_backward, mlp, train_step
from parallel.nn.optim import SGD, Adam, GradientStep


def paper_adam(theta, gradients, alpha, beta1, beta2, eps):
    """Kingma and Ba (2015), Algorithm 1, element by element in Python floats: the iterates theta_t."""
    m, v, iterates = [0.0] * len(theta), [0.0] * len(theta), []
    theta = list(theta)
    for t, g in enumerate(gradients, start=1):
        for i, g_i in enumerate(g):
            m[i] = beta1 * m[i] + (1 - beta1) * g_i
            v[i] = beta2 * v[i] + (1 - beta2) * g_i ** 2
            m_hat = m[i] / (1 - beta1 ** t)
            v_hat = v[i] / (1 - beta2 ** t)
            theta[i] = theta[i] - alpha * m_hat / (math.sqrt(v_hat) + eps)
        iterates.append(list(theta))
    return iterates


@pytest.mark.parametrize("beta1, beta2, eps", [(0.9, 0.999, 1e-8), (0.5, 0.9, 1e-3), (0.0, 0.0, 1e-8)])
def test_adam_follows_the_papers_algorithm_with_bias_correction(beta1, beta2, eps):
    rng = np.random.default_rng(1)
    start = rng.standard_normal(5)
    gradients = [rng.standard_normal(5) * scale for scale in (1.0, 1e-3, 10.0, 0.0, 1.0, 1e-6)]
    param, grad = start.copy(), np.zeros(5)
    optimizer = Adam([(param, grad)], lr=0.01, beta1=beta1, beta2=beta2, eps=eps)
    expected = paper_adam(start, gradients, 0.01, beta1, beta2, eps)
    for t, (g, theta) in enumerate(zip(gradients, expected), start=1):
        grad[:] = g
        optimizer.step()
        assert optimizer.steps == t
        np.testing.assert_allclose(param, theta, rtol=1e-13, atol=1e-15)


def test_adams_first_step_is_lr_times_the_sign_thanks_to_bias_correction():
    # Without the correction the first step would be lr (1 - beta1) / sqrt(1 - beta2) = 3.16 lr.
    param, grad = np.zeros(3, np.float32), np.array([2.0, -1e-3, 0.0], np.float32)
    Adam([(param, grad)], lr=0.1).step()
    np.testing.assert_allclose(param, [-0.1, 0.1, 0.0], rtol=1e-4)
    assert param.dtype == np.float32


def test_adam_weight_decay_is_added_to_the_gradient():
    param, grad = np.array([2.0]), np.array([0.5])
    decayed = Adam([(param, grad)], lr=0.1, beta1=0.0, beta2=0.0, eps=1e-12, weight_decay=0.25)
    decayed.step()
    # g = 0.5 + 0.25 * 2 = 1; m_hat = 1, v_hat = 1: p = 2 - 0.1
    np.testing.assert_allclose(param, [1.9], rtol=1e-12)
    np.testing.assert_array_equal(grad, [0.5])


@pytest.mark.parametrize("options", [dict(lr=0), dict(beta1=1.0), dict(beta2=-0.1), dict(eps=0),
                                     dict(weight_decay=-1)])
def test_adam_bad_settings(options):
    with pytest.raises(InputError, match="Adam: need"):
        Adam([(np.zeros(1), np.zeros(1))], **options)


def test_adam_trains_a_model_in_place_per_array():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6)), rng.integers(0, 4, 16)
    model = mlp([6, 8, 4], seed=0, dtype=np.float64)
    optimizer = Adam(model.parameters(), lr=0.01)
    first = forward_backward(model, softmax_cross_entropy, x, y)
    for _ in range(30):
        train_step(model, softmax_cross_entropy, optimizer, x, y)
    assert forward_backward(model, softmax_cross_entropy, x, y) < 0.5 * first
    assert len(optimizer.first) == len(model.parameters()) == 4


class _Trainer(GradientStep):
    def __init__(self, skip):
        self.skip, self.param, self.grad = skip, np.array([1.0]), np.array([1.0])

    def compute_gradients(self, x, y):
        self.step_skipped = self.skip
        return 0.5


@pytest.mark.parametrize("skip", [False, True])
def test_a_skipped_step_leaves_the_weights_alone(skip):
    trainer = _Trainer(skip)
    assert trainer.train_step(SGD([(trainer.param, trainer.grad)], lr=0.5), None, None) == 0.5
    assert trainer.param[0] == (1.0 if skip else 0.5)
