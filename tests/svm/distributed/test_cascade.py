"""Cascade SVM (svm/distributed/cascade.py): the serial optimum from a tree of partial solves, any rank count."""
import warnings

import numpy as np
import pytest
from mpi4py import MPI

from kernels.errors import InputError
from svm.distributed.cascade import ALPHA, INDEX, CascadeSVM, pack, union
from svm.solver.smo import ConvergenceWarning
from svm.solver.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")
sklearn_svm = pytest.importorskip("sklearn.svm")


def split_problem(n_train=241, n_test=120, seed=1):
    X, y = datasets.make_classification(n_samples=n_train + n_test, n_features=8, n_informative=5,
                                        flip_y=0.05, random_state=seed)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X[:n_train], X[n_train:], y[:n_train], y[n_train:]


def same_on_every_rank(comm, array):
    gathered = comm.allgather(np.asarray(array))
    return all(np.array_equal(other, gathered[0]) for other in gathered)


def assert_close_to_serial(comm, model, X_train, X_test, y_train, y_test):
    serial = SVC(kernel=model.kernel).fit(X_train, y_train)
    assert model.converged_
    assert model.dual_objective_ == pytest.approx(serial.dual_objective_[0], rel=1e-3)
    assert model.score(X_test, y_test) >= serial.score(X_test, y_test) - 0.01
    assert np.mean(model.predict(X_test) == serial.predict(X_test)) >= 0.97
    assert len(set(model.support_) ^ set(serial.support_)) <= max(3, 0.03 * len(serial.support_))
    assert same_on_every_rank(comm, model.decision_function(X_test))
    assert same_on_every_rank(comm, model.support_)


@pytest.mark.mpi(min_size=1)
def test_cascade_reaches_the_serial_optimum(comm):
    X_train, X_test, y_train, y_test = split_problem()
    model = CascadeSVM(comm=comm).fit(X_train, y_train)
    assert_close_to_serial(comm, model, X_train, X_test, y_train, y_test)
    assert model.n_iter_ >= 2  # the pass that confirms the support vectors
    np.testing.assert_array_equal(model.support_vectors_, X_train[model.support_])
    assert (model.bytes_sent_ > 0) == (comm.size > 1)


@pytest.mark.mpi(min_size=1)
def test_blocks_of_one_class_pass_their_samples_up(comm):
    X_train, X_test, y_train, y_test = split_problem(n_train=151, seed=2)
    order = np.argsort(y_train, kind="stable")  # sorted labels: the first and last blocks hold one class
    model = CascadeSVM(kernel="linear", max_passes=50, comm=comm).fit(X_train[order], y_train[order])
    assert_close_to_serial(comm, model, X_train[order], X_test, y_train[order], y_test)


@pytest.mark.mpi(min_size=1)
def test_single_pass_warns_unless_optimal_and_still_predicts_alike_everywhere(comm):
    X_train, X_test, y_train, _ = split_problem(n_train=101)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = CascadeSVM(max_passes=1, comm=comm).fit(X_train, y_train)
    warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert model.n_iter_ == 1 and warned == (not model.converged_)
    if model.converged_:
        assert model.gap_ < model.tol
    if comm.size == 1:  # the one leaf solved the whole problem: the check over all samples passes
        assert model.converged_
    assert same_on_every_rank(comm, np.array([model.converged_, model.gap_]))
    assert same_on_every_rank(comm, model.predict(X_test))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n, noise, seed", [(100, 0.1, 0), (200, 0.2, 1), (301, 0.3, 2)])
def test_without_free_support_vectors_the_bias_and_the_model_are_the_serial_ones(comm, n, noise, seed):
    # RBF gamma 2, C = 0.01 on two moons: every alpha (almost) at C, so the bias is the midpoint of
    # [M, m] over all samples; (301, 0.3, 2) also has a KKT-violating pair of non-support vectors
    # that sit in different leaves on 4 ranks.
    X, y = datasets.make_moons(n, noise=noise, random_state=seed)
    X_test, y_test = datasets.make_moons(400, noise=noise, random_state=seed + 100)
    model = CascadeSVM(C=0.01, gamma=2.0, comm=comm).fit(X, y)
    reference = sklearn_svm.SVC(C=0.01, gamma=2.0).fit(X, y)
    assert model.converged_ and model.gap_ < model.tol
    assert model.dual_objective_ == pytest.approx(SVC(C=0.01, gamma=2.0).fit(X, y).dual_objective_[0], rel=1e-4)
    assert model.intercept_[0] == pytest.approx(reference.intercept_[0], abs=2e-3)
    assert model.score(X_test, y_test) == reference.score(X_test, y_test)
    alpha = np.abs(model.dual_coef_[0])
    assert not np.any((alpha > 0.01 - 1e-9) & (alpha < 0.01))  # none a few ulps below C (a "free" one)
    assert same_on_every_rank(comm, model.decision_function(X_test))


@pytest.mark.mpi(min_size=1)
def test_fewer_samples_than_ranks_leave_empty_blocks(comm):
    X, y = np.array([[0.0, 0.0], [1.0, 1.0], [0.2, 0.1]]), np.array([0, 1, 0])
    model = CascadeSVM(comm=comm, tol=1e-9).fit(X, y)
    serial = SVC().fit(X, y)
    assert model.converged_
    assert model.intercept_[0] == pytest.approx(serial.intercept_[0], abs=1e-8)
    grid = np.random.default_rng(0).normal(size=(50, 2))
    np.testing.assert_allclose(model.decision_function(grid), serial.decision_function(grid), atol=1e-8)
    assert same_on_every_rank(comm, model.decision_function(X))


def test_union_keeps_distinct_samples_and_sums_their_alphas():
    X = np.arange(12.0).reshape(6, 2)
    first = pack([4, 1, 2], [1, -1, 1], [0.5, 0.2, 0.0], X[:3])
    second = pack([2, 7], [1, -1], [0.3, 0.6], X[[2, 3]])
    rows, alpha = union(first, second)
    np.testing.assert_array_equal(rows[:, INDEX], [1, 2, 4, 7])
    np.testing.assert_array_equal(alpha, [0.2, 0.3, 0.5, 0.6])
    np.testing.assert_array_equal(rows[2, 3:], X[0])
    assert rows.shape == (4, 5) and rows[:, ALPHA].tolist() == [0.2, 0.0, 0.5, 0.6]


def test_bad_options_are_input_errors():
    X_train, _, y_train, _ = split_problem(n_train=40)
    with pytest.raises(InputError, match="max_passes"):
        CascadeSVM(max_passes=0, comm=MPI.COMM_SELF).fit(X_train, y_train)
    with pytest.raises(InputError, match="objective_rtol"):
        CascadeSVM(objective_rtol=-1.0, comm=MPI.COMM_SELF).fit(X_train, y_train)
    with pytest.raises(InputError, match="exactly 2 classes"):
        CascadeSVM(comm=MPI.COMM_SELF).fit(X_train, np.zeros(40))
