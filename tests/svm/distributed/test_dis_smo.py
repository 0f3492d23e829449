"""Distributed SMO (svm/distributed/dis_smo.py): the serial SMO's iterates on any rank count."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.errors import InputError
from svm.distributed.dis_smo import DisSMO, dis_smo_solve
from svm.solver.gram import make_kernel
from svm.solver.smo import ConvergenceWarning, smo_solve
from svm.solver.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")


def problem(n=143, d=6, seed=3):
    X, y = datasets.make_classification(n_samples=n, n_features=d, n_informative=4, flip_y=0.05,
                                        random_state=seed)
    return (X - X.mean(axis=0)) / X.std(axis=0), np.where(y == 1, 1.0, -1.0)


def same_on_every_rank(comm, array):
    gathered = comm.allgather(np.asarray(array))
    return all(np.array_equal(other, gathered[0]) for other in gathered)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [
    {"kernel": "rbf", "C": 1.0}, {"kernel": "linear", "C": 0.5}, {"kernel": "poly", "C": 2.0, "coef0": 1.0,
                                                                  "degree": 2}])
def test_iterates_are_those_of_serial_smo_without_shrinking(comm, options):
    X, y = problem()
    kernel = make_kernel(options["kernel"], X, coef0=options.get("coef0", 0.0), degree=options.get("degree", 3))
    expected = smo_solve(X, y, kernel, options["C"], shrinking=False)
    result = dis_smo_solve(comm, X, y, kernel, options["C"])
    assert result.n_iter == expected.n_iter and result.converged
    np.testing.assert_allclose(result.alpha, expected.alpha, rtol=0, atol=1e-12)
    assert result.bias == pytest.approx(expected.bias, rel=1e-12, abs=1e-12)
    assert result.objective == pytest.approx(expected.objective, rel=1e-12)
    assert result.gap == pytest.approx(expected.gap, rel=1e-12)
    assert same_on_every_rank(comm, result.alpha)


@pytest.mark.mpi(min_size=1)
def test_iteration_cap_stops_at_the_same_point_and_warns(comm):
    X, y = problem(n=61)
    kernel = make_kernel("rbf", X)
    with pytest.warns(ConvergenceWarning):
        expected = smo_solve(X, y, kernel, shrinking=False, max_iter=7)
    with pytest.warns(ConvergenceWarning):
        result = dis_smo_solve(comm, X, y, kernel, max_iter=7)
    assert result.n_iter == 7 and not result.converged
    np.testing.assert_allclose(result.alpha, expected.alpha, rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_fewer_samples_than_ranks(comm):
    X = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]])
    y = np.array([1.0, -1.0, 1.0])
    kernel = make_kernel("linear", X)
    expected = smo_solve(X, y, kernel, shrinking=False)
    result = dis_smo_solve(comm, X, y, kernel)
    np.testing.assert_allclose(result.alpha, expected.alpha, rtol=0, atol=1e-12)
    assert result.bias == pytest.approx(expected.bias)


@pytest.mark.mpi(min_size=1)
def test_estimator_is_the_serial_smo_model_on_every_rank(comm):
    X, y = problem(n=157, seed=5)
    labels = np.where(y > 0, "spam", "ham")
    X_train, X_test, y_train = X[:117], X[117:], labels[:117]
    model = DisSMO(C=2.0, gamma=0.2, comm=comm).fit(X_train, y_train)
    kernel = make_kernel("rbf", X_train, gamma=0.2)
    expected = smo_solve(X_train, y[:117], kernel, C=2.0, shrinking=False)  # +1 is "spam" = classes_[1]
    support = np.flatnonzero(expected.alpha)
    np.testing.assert_array_equal(model.classes_, ["ham", "spam"])
    np.testing.assert_array_equal(model.support_, support)
    np.testing.assert_allclose(model.dual_coef_[0], (expected.alpha * y[:117])[support], rtol=0, atol=1e-12)
    decision = model.decision_function(X_test)
    expected_decision = kernel.block(X_test, X_train[support]) @ model.dual_coef_[0] + expected.bias
    np.testing.assert_allclose(decision, expected_decision, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(model.predict(X_test), np.where(expected_decision > 0, "spam", "ham"))
    assert model.dual_objective_ == pytest.approx(expected.objective, rel=1e-12)
    assert model.n_iter_ == expected.n_iter
    serial = SVC(C=2.0, gamma=0.2).fit(X_train, y_train)  # the same optimum, reached by another path
    assert model.dual_objective_ == pytest.approx(serial.dual_objective_[0], rel=1e-3)
    assert np.mean(model.predict(X_test) == serial.predict(X_test)) >= 0.95
    assert same_on_every_rank(comm, decision)
    assert (model.bytes_sent_ > 0) == (comm.size > 1)
    assert 1 <= model.kernel_rows_ <= min(117, 2 * model.n_iter_)  # each row computed once: the cache holds all
    assert comm.allgather(model.kernel_rows_) == [model.kernel_rows_] * comm.size
    uncached = DisSMO(C=2.0, gamma=0.2, comm=comm, cache_bytes=0).fit(X_train, y_train)
    assert uncached.n_iter_ == model.n_iter_ and uncached.kernel_rows_ == 2 * model.n_iter_  # rows of i and j


def test_estimator_input_errors():
    X, y = problem(n=30)
    with pytest.raises(InputError, match="exactly 2 classes"):
        DisSMO(comm=MPI.COMM_SELF).fit(X, np.arange(30) % 3)
    with pytest.raises(InputError, match="C must be"):
        DisSMO(C=-1.0, comm=MPI.COMM_SELF).fit(X, y)
    with pytest.raises(InputError, match="not fitted"):
        DisSMO().predict(X)
    with pytest.raises(InputError, match="labels in"):
        dis_smo_solve(MPI.COMM_SELF, X, y * 2, make_kernel("linear", X))
    with pytest.raises(InputError, match="no parameter"):
        DisSMO().set_params(shrinking=True)
    assert DisSMO(max_iter=5).get_params()["max_iter"] == 5
