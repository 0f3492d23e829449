"""CP-SVM and CA-SVM (svm/distributed/casvm.py): partitions, accuracy against the serial SVC, traffic, agreement."""
import numpy as np
import pytest

from kernels.datasets import load_digits
from kernels.errors import InputError
from svm.distributed.casvm import CASVM, CPSVM
from svm.distributed.local_models import neighbour_vote
from svm.solver.svc import SVC

datasets = pytest.importorskip("sklearn.datasets")

ESTIMATORS = [
    pytest.param(CPSVM, {}, id="cp"),
    pytest.param(CASVM, {"method": "fcfs"}, id="ca-fcfs"),
    pytest.param(CASVM, {"method": "kmeans"}, id="ca-kmeans"),
    pytest.param(CASVM, {"method": "fcfs", "balance_classes": False}, id="ca-fcfs-any-class"),
]
CA_ESTIMATORS = ESTIMATORS[1:]


def even_odd_digits(n_train=701, n_test=500):
    """Digits labelled even / odd, shuffled: (X_train, y_train, X_test, y_test)."""
    X, y = load_digits(flat=True, dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(X))[:n_train + n_test]
    X, y = X[order], np.where(y[order] % 2 == 0, "even", "odd")
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def same_everywhere(comm, array):
    return all(np.array_equal(array, other) for other in comm.allgather(array))


def exchange_bytes(p, n_support):
    """Model exchange by the parallel_common convention: Allgatherv of p lengths, then of the payloads."""
    return (p - 1) / p * 8 * (p + 3 * p + 2 * n_support)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("estimator, options", ESTIMATORS)
def test_accuracy_is_close_to_the_serial_svc_and_every_rank_agrees(comm, estimator, options):
    X, y, X_test, y_test = even_odd_digits()
    model = estimator(comm=comm, **options).fit(X, y)
    serial = SVC().fit(X, y).score(X_test, y_test)
    assert model.score(X_test, y_test) >= serial - 0.03
    assert same_everywhere(comm, model.decision_function(X_test))
    assert same_everywhere(comm, model.predict(X_test))
    if comm.size == 1:
        assert model.score(X_test, y_test) == serial


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("estimator, options", ESTIMATORS)
def test_on_two_moons_the_routed_models_are_within_two_points_of_the_serial_svc(comm, estimator, options):
    # Balanced partitions are not compact: routing by the nearest partition mean lost up to 25 points here.
    X, y = datasets.make_moons(1100, noise=0.2, random_state=0)
    X, X_test, y, y_test = X[:700], X[700:], y[:700], y[700:]
    serial = SVC().fit(X, y).score(X_test, y_test)
    model = estimator(comm=comm, **options).fit(X, y)
    assert model.score(X_test, y_test) >= serial - 0.02
    assert same_everywhere(comm, model.predict(X_test))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("estimator, options", CA_ESTIMATORS)
def test_ca_partitions_are_balanced_and_training_sends_nothing(comm, estimator, options):
    X, y, _, _ = even_odd_digits()
    model = estimator(comm=comm, **options).fit(X, y)
    labels, p = model.partition_labels_, comm.size
    assert labels.shape == (len(X),) and labels.min() >= 0 and labels.max() < p
    assert model.partition_sizes_.sum() == len(X) and np.ptp(model.partition_sizes_) <= 1
    if model.balance_classes:
        for label in model.classes_:
            per_partition = np.bincount(labels[y == label], minlength=p)
            assert np.ptp(per_partition) <= 1
    assert model.bytes_sent_ == model.exchange_bytes_ == pytest.approx(exchange_bytes(p, len(model.support_)))
    assert model.bytes_sent_ < 0.1 * X.nbytes


@pytest.mark.mpi(min_size=1)
def test_cp_traffic_is_kmeans_plus_model_exchange(comm):
    X, y, _, _ = even_odd_digits()
    model = CPSVM(comm=comm, seed=3).fit(X, y)
    p, d = comm.size, X.shape[1]
    kmeans = (model.kmeans_n_iter_ + 1) * 2 * (p - 1) / p * 8 * (p * (d + 1) + 2) + (p - 1) / p * 8 * len(X)
    assert model.exchange_bytes_ == pytest.approx(exchange_bytes(p, len(model.support_)))
    assert model.bytes_sent_ == pytest.approx(kmeans + model.exchange_bytes_)
    assert model.partition_sizes_.sum() == len(X)
    np.testing.assert_array_equal(model.partition_sizes_, np.bincount(model.partition_labels_, minlength=p))


def routes_by_definition(model, X_train, X_test):
    """Partition of the nearest centre, or the most common among the 5 nearest training points
    (ties: the nearest point's partition among the tied ones), by plain loops."""
    labels, p = model.partition_labels_, len(model.partition_sizes_)
    routes = []
    for x in X_test:
        if model.routing == "centre":
            routes.append(int(np.argmin(((model.centres_ - x) ** 2).sum(axis=1))))
            continue
        order = np.argsort(((X_train - x) ** 2).sum(axis=1), kind="stable")[:5]
        votes = np.bincount(labels[order], minlength=p)
        tied = np.flatnonzero(votes == votes.max())
        routes.append(next(int(labels[i]) for i in order if labels[i] in tied))
    return np.array(routes)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("routing", ["centre", "neighbours"])
def test_each_query_gets_the_model_of_its_routed_partition(comm, routing):
    X, y, X_test, _ = even_odd_digits()
    model = CASVM(comm=comm, method="kmeans", tol=1e-5, routing=routing).fit(X, y)
    mine = model.partition_labels_ == comm.rank
    local = SVC(gamma=model.kernel_.gamma, tol=1e-5).fit(X[mine], y[mine])
    routes = routes_by_definition(model, X, X_test)
    np.testing.assert_array_equal(model.route(X_test), routes)
    routed_here = routes == comm.rank
    assert routed_here.any()
    np.testing.assert_allclose(model.decision_function(X_test[routed_here]),
                               local.decision_function(X_test[routed_here]), atol=1e-3)
    assert model.partition_n_iter_[comm.rank] > 0


def test_fewer_than_two_or_more_than_two_classes_are_rejected():
    X, y, _, _ = even_odd_digits()
    with pytest.raises(InputError, match="exactly 2 classes"):
        CASVM().fit(X, np.arange(len(X)) % 3)
    with pytest.raises(InputError, match="unknown partition method"):
        CASVM(method="random").fit(X, y)
    with pytest.raises(InputError, match="kmeans_iter"):
        CPSVM(kmeans_iter=0).fit(X, y)


def test_prediction_checks_its_input():
    X, y, _, _ = even_odd_digits(n_train=200)
    with pytest.raises(InputError, match="not fitted"):
        CASVM().predict(X)
    model = CPSVM().fit(X, y)
    with pytest.raises(InputError, match="features"):
        model.predict(X[:, :10])


@pytest.mark.mpi(min_size=3)
def test_more_ranks_than_samples_is_an_input_error(comm):
    X, y, _, _ = even_odd_digits()
    one_of_each = [np.flatnonzero(y == "even")[0], np.flatnonzero(y == "odd")[0]]
    with pytest.raises(InputError, match="one sample per rank"):
        CASVM(comm=comm).fit(X[one_of_each], y[one_of_each])


def test_neighbour_vote_counts_the_nearest_points_and_breaks_ties_by_the_nearest():
    points = np.array([[0.0], [1.0], [2.0], [3.0], [10.0], [11.0]])
    labels = np.array([2, 0, 0, 1, 1, 1])
    queries = np.array([[0.4], [2.6], [9.0], [-5.0]])
    # 0.4: neighbours 0 (p2), 1 (p0), 2 (p0) -> p0 wins 2 to 1 although the nearest point is in p2.
    # 2.6: neighbours 3 (p1), 2 (p0), 1 (p0) -> p0.  9.0: 4, 5, 3, all p1.
    np.testing.assert_array_equal(neighbour_vote(queries[:3], points, labels, 3, k=3), [0, 0, 1])
    # Ties (k=2): 2.6 -> points 3 (p1) and 2 (p0): the nearest, p1; -5.0 -> points 0 (p2) and 1 (p0): p2.
    np.testing.assert_array_equal(neighbour_vote(queries[1:], points, labels, 3, k=2, block_rows=1), [1, 1, 2])
    assert neighbour_vote(queries, points, labels, 3, k=99).dtype == np.int64  # k above n: all points vote
    assert neighbour_vote(queries[:0], points, labels, 3).shape == (0,)
