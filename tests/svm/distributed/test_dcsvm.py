"""DC-SVM (svm/distributed/dcsvm.py): the final model is the serial SVC's, warm starts save iterations, early prediction."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.comm.counting import CountingComm
from kernels.datasets import load_digits
from kernels.errors import InputError
from svm.distributed.dcsvm import DCSVM, assign_points, deal_largest_first, kernel_kmeans
from svm.solver.gram import make_kernel
from svm.distributed.partition import squared_distances
from svm.solver.smo import smo_solve
from svm.solver.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")


def breast_cancer(n_train=301):
    """Standardised breast cancer data, shuffled: (X_train, y_train, X_test, y_test)."""
    X, y = datasets.load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    order = np.random.default_rng(0).permutation(len(X))
    X, y = X[order], y[order]
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def even_odd_digits(n_train=701, n_test=500):
    """Digits labelled by parity, shuffled: (X_train, y_train, X_test, y_test)."""
    X, y = load_digits(flat=True, dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(X))[:n_train + n_test]
    X, y = X[order], y[order] % 2
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def clustered(n=403, n_blobs=4, seed=1):
    """Far-apart blobs, each with its own linear class boundary: the data DC-SVM is designed for.

    Returns the points, their classes and their blobs.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 10.0, (n_blobs, 2))
    blob = rng.integers(0, n_blobs, n)
    offsets = rng.normal(size=(n, 2))
    normals = rng.normal(size=(n_blobs, 2))
    labels = np.einsum("ij,ij->i", offsets, normals[blob]) + 0.3 * rng.normal(size=n) > 0
    return centres[blob] + offsets, labels.astype(np.int64), blob


def same_everywhere(comm, array):
    return all(np.array_equal(array, other) for other in comm.allgather(array))


@pytest.mark.mpi(min_size=1)
def test_distributed_kernel_kmeans_matches_serial_and_assigns_by_kernel_distance(comm):
    X, _, _ = clustered(n=130, seed=6)
    sample = X[:97]
    kernel = make_kernel("rbf", X, gamma=0.02)
    ours = kernel_kmeans(CountingComm(comm), sample, kernel, 3, np.random.default_rng(7))
    serial = kernel_kmeans(CountingComm(MPI.COMM_SELF), sample, kernel, 3, np.random.default_rng(7))
    np.testing.assert_array_equal(ours.labels, serial.labels)
    np.testing.assert_allclose(ours.self_terms, serial.self_terms, rtol=1e-12)
    np.testing.assert_array_equal(ours.nearest(kernel, sample), ours.labels)  # converged: a fixed point
    # Kernel distance by its definition: K(x, x) - 2 mean_s K(x, s) + mean_{s, t} K(s, t) over the cluster.
    K, KS = kernel.block(X, sample), kernel.block(sample, sample)
    distances = np.stack([1.0 - 2.0 * K[:, ours.labels == c].mean(axis=1)
                          + KS[np.ix_(ours.labels == c, ours.labels == c)].mean() for c in range(3)], axis=1)
    assigned = assign_points(CountingComm(comm), X, ours, kernel)
    np.testing.assert_array_equal(assigned, np.argmin(distances, axis=1))
    assert same_everywhere(comm, assigned)


@pytest.mark.mpi(min_size=1)
def test_linear_kernel_kmeans_is_kmeans(comm):
    X, _, blob = clustered(n=101, n_blobs=3, seed=8)
    kernel = make_kernel("linear", X)
    clusters = kernel_kmeans(CountingComm(comm), X, kernel, 3, np.random.default_rng(0))
    assert len(np.unique(np.stack([clusters.labels, blob]), axis=1).T) == 3  # the blobs, renamed
    means = np.stack([X[clusters.labels == c].mean(axis=0) for c in range(3)])
    queries = np.random.default_rng(1).normal(0.0, 10.0, (57, 2))
    np.testing.assert_array_equal(clusters.nearest(kernel, queries),
                                  np.argmin(squared_distances(queries, means), axis=1))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("levels", [{"n_levels": 1}, {"n_levels": 2, "n_clusters": 2}])
def test_final_model_is_the_serial_svc_solution(comm, levels):
    X, y, X_test, y_test = breast_cancer()
    model = DCSVM(comm=comm, tol=1e-5, **levels).fit(X, y)
    serial = SVC(tol=1e-5).fit(X, y)
    assert model.dual_objective_ == pytest.approx(serial.dual_objective_[0], rel=1e-6)
    np.testing.assert_allclose(model.decision_function(X_test), serial.decision_function(X_test), atol=1e-3)
    assert np.mean(model.predict(X_test) == serial.predict(X_test)) >= 0.99
    assert same_everywhere(comm, model.decision_function(X_test))
    assert same_everywhere(comm, model.predict(X_test, early=True))
    assert (model.bytes_sent_ == 0) == (comm.size == 1)
    assert same_everywhere(comm, np.array([model.bytes_sent_]))


@pytest.mark.mpi(min_size=1)
def test_levels_are_nested_and_the_early_models_solve_their_clusters(comm):
    X, y, _, _ = breast_cancer()
    model = DCSVM(comm=comm, n_levels=2, n_clusters=3, tol=1e-5).fit(X, y)
    fine, coarse = model.cluster_labels_[1], model.cluster_labels_[0]
    np.testing.assert_array_equal(fine // 3, coarse)
    assert len(np.unique(coarse)) == 3 and len(np.unique(fine)) > 3
    signs = np.where(y == model.classes_[1], 1.0, -1.0)
    for cluster in np.unique(coarse):
        members = np.flatnonzero(coarse == cluster)
        cold = smo_solve(X[members], signs[members], model.kernel_, tol=1e-5)
        in_cluster = model.early_models_.partition == cluster
        coef = np.zeros(len(X))
        coef[model.early_models_.support[in_cluster]] = model.early_models_.coef[in_cluster]
        assert 0.5 * coef[members] @ model.kernel_.block(X[members], X[members]) @ coef[members] \
            - np.abs(coef).sum() == pytest.approx(cold.objective, rel=1e-6)
    assert (model.level_n_iter_ > 0).all()


@pytest.mark.mpi(min_size=1)
def test_early_prediction_is_nearly_as_accurate(comm):
    X, y, X_test, y_test = even_odd_digits()
    model = DCSVM(comm=comm, n_clusters=4).fit(X, y)
    assert model.score(X_test, y_test, early=True) >= model.score(X_test, y_test) - 0.03
    assert model.score(X_test, y_test) >= 0.95


@pytest.mark.mpi(min_size=1)
def test_the_warm_start_needs_fewer_iterations_than_a_cold_solve(comm):
    X, y, _ = clustered()
    model = DCSVM(comm=comm, gamma=0.5, C=10.0, n_clusters=4).fit(X, y)
    signs = np.where(y == model.classes_[1], 1.0, -1.0)
    cold = smo_solve(X, signs, model.kernel_, C=10.0)
    assert model.dual_objective_ == pytest.approx(cold.objective, rel=1e-4)
    assert model.n_iter_ < 0.5 * cold.n_iter


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_kernel_kmeans_of_fewer_points_than_ranks_gives_the_serial_clusters(comm, m):
    # Blocks of the sample are empty on some ranks: their partial sums must still be float64.
    S = datasets.make_moons(m + 10, noise=0.2, random_state=5)[0][:m]
    kernel = make_kernel("rbf", S, gamma=1.0)
    ours = kernel_kmeans(CountingComm(comm), S, kernel, 2, np.random.default_rng(3))
    serial = kernel_kmeans(CountingComm(MPI.COMM_SELF), S, kernel, 2, np.random.default_rng(3))
    np.testing.assert_array_equal(ours.labels, serial.labels)
    np.testing.assert_allclose(ours.self_terms, serial.self_terms, rtol=1e-12)
    assert ours.self_terms.dtype == np.float64 and same_everywhere(comm, ours.self_terms)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("options", [{"sample_size": 3}, {"sample_size": 1}, {"n_levels": 3, "sample_size": 100},
                                     {"n_levels": 2, "n_clusters": 3, "sample_size": 5}])
def test_tiny_samples_and_deep_levels_still_give_the_serial_model(comm, options):
    X, y = datasets.make_moons(250, noise=0.2, random_state=0)
    model = DCSVM(comm=comm, tol=1e-5, **options).fit(X, y)
    serial = SVC(tol=1e-5).fit(X, y)
    assert model.dual_objective_ == pytest.approx(serial.dual_objective_[0], rel=1e-6)
    np.testing.assert_allclose(model.decision_function(X), serial.decision_function(X), atol=1e-3)
    assert same_everywhere(comm, model.decision_function(X))
    assert same_everywhere(comm, model.predict(X, early=True))


@pytest.mark.mpi(min_size=1)
def test_fewer_samples_than_ranks_and_one_class_clusters(comm):
    X, y = np.array([[0.0, 0.0], [1.0, 1.0], [0.2, 0.1]]), np.array([0, 1, 0])
    model = DCSVM(comm=comm, n_clusters=3, tol=1e-9).fit(X, y)  # clusters of one sample: one class each
    serial = SVC(tol=1e-9).fit(X, y)
    assert model.intercept_[0] == pytest.approx(serial.intercept_[0], abs=1e-8)
    grid = np.random.default_rng(0).normal(size=(50, 2))
    np.testing.assert_allclose(model.decision_function(grid), serial.decision_function(grid), atol=1e-8)
    assert same_everywhere(comm, model.predict(X, early=True))


def test_clusters_go_to_the_least_loaded_rank_largest_first():
    np.testing.assert_array_equal(deal_largest_first(np.array([5, 9, 4, 4, 1]), 2), [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(deal_largest_first(np.array([3, 0]), 4), [0, 1])


@pytest.mark.parametrize("option", [{"n_levels": 0}, {"n_clusters": 0}, {"sample_size": 2.5}, {"kmeans_iter": True}])
def test_bad_options_are_input_errors(option):
    X, y, _, _ = breast_cancer(n_train=60)
    with pytest.raises(InputError, match=next(iter(option))):
        DCSVM(**option).fit(X, y)


def test_prediction_checks_its_input():
    X, y, _, _ = breast_cancer(n_train=60)
    with pytest.raises(InputError, match="not fitted"):
        DCSVM().predict(X, early=True)
    model = DCSVM().fit(X, y)
    for early in (False, True):
        with pytest.raises(InputError, match="features"):
            model.predict(X[:, :5], early=early)
