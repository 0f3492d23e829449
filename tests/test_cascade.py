"""Cascade SVM (svm/cascade.py): the serial optimum from a tree of partial solves, any rank count."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.errors import InputError
from svm.cascade import ALPHA, INDEX, CascadeSVM, pack, union
from svm.smo import ConvergenceWarning
from svm.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")


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
def test_single_pass_warns_and_still_predicts_alike_everywhere(comm):
    X_train, X_test, y_train, _ = split_problem(n_train=101)
    with pytest.warns(ConvergenceWarning):
        model = CascadeSVM(max_passes=1, comm=comm).fit(X_train, y_train)
    assert not model.converged_ and model.n_iter_ == 1
    assert same_on_every_rank(comm, model.predict(X_test))


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
