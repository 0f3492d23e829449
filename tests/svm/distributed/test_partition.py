"""k-means, balanced partitions and kernel k-means (svm/distributed/partition.py) against sklearn and serial references."""
import numpy as np
import pytest
from mpi4py import MPI

from kernels.comm.counting import CountingComm
from kernels.errors import InputError
from svm.distributed.partition import (balanced_partition, capacitated_assign, class_capacities, distributed_kmeans,
                           squared_distances)

cluster = pytest.importorskip("sklearn.cluster")


def blobs(sizes, d=3, spread=20.0, seed=0):
    """Well-separated Gaussian blobs: points (sum(sizes), d) and the blob of each point."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, spread, (len(sizes), d))
    which = np.repeat(np.arange(len(sizes)), sizes)
    return centres[which] + rng.normal(size=(len(which), d)), which


def same_grouping(labels, truth):
    """Whether two labelings split the points into the same groups (up to renaming)."""
    pairs = np.unique(np.stack([labels, truth]), axis=1)
    return len(pairs.T) == len(np.unique(labels)) == len(np.unique(truth))


def gathered_equal(comm, array):
    """Whether ``array`` is bitwise the same on every rank (the same verdict everywhere)."""
    return all(np.array_equal(array, other) for other in comm.allgather(array))


@pytest.mark.parametrize("class_sizes, parts", [([50], 3), ([31, 70], 4), ([2, 99, 9], 5), ([7, 7], 7)])
def test_class_capacities_balance_partitions_and_classes(class_sizes, parts):
    codes = np.repeat(np.arange(len(class_sizes)), class_sizes)[::-1].copy()
    capacity = class_capacities(codes, parts)
    assert capacity.shape == (len(class_sizes), parts)
    np.testing.assert_array_equal(capacity.sum(axis=1), class_sizes)
    totals = capacity.sum(axis=0)
    assert totals.max() - totals.min() <= 1
    assert (capacity.max(axis=1) - capacity.min(axis=1) <= 1).all()


def test_capacitated_assign_serves_points_in_arrival_order():
    # Points at 0, 1, 2 on a line, centres at 0 and 10, room for two points at the first centre.
    X = np.array([[0.0], [1.0], [2.0]])
    distances = squared_distances(X, np.array([[0.0], [10.0]]))
    codes = np.zeros(3, dtype=np.int64)
    capacity = np.array([[2, 1]])
    np.testing.assert_array_equal(capacitated_assign(distances, np.array([2, 0, 1]), codes, capacity), [0, 1, 0])
    np.testing.assert_array_equal(capacitated_assign(distances, np.array([0, 1, 2]), codes, capacity), [0, 0, 1])
    np.testing.assert_array_equal(capacitated_assign(distances, np.array([1, 2, 0]), codes, capacity), [1, 0, 0])


@pytest.mark.parametrize("method", ["fcfs", "kmeans"])
@pytest.mark.parametrize("with_classes", [False, True])
def test_balanced_partitions_are_balanced_and_cover_every_point_once(method, with_classes):
    X, _ = blobs([60, 17, 40], seed=1)
    codes = (np.arange(len(X)) % 3 == 0).astype(np.int64) if with_classes else None
    labels, centres, n_iter = balanced_partition(X, 4, method, codes, seed=2)
    assert labels.shape == (len(X),) and set(labels.tolist()) == {0, 1, 2, 3}
    sizes = np.bincount(labels, minlength=4)
    assert sizes.sum() == len(X) and sizes.max() - sizes.min() <= 1
    if with_classes:
        per_class = np.stack([np.bincount(labels[codes == c], minlength=4) for c in (0, 1)])
        assert (per_class.max(axis=1) - per_class.min(axis=1) <= 1).all()
    for part in range(4):
        np.testing.assert_allclose(centres[part], X[labels == part].mean(axis=0))
    assert n_iter >= 1 if method == "kmeans" else n_iter == 1


def test_balanced_kmeans_recovers_equal_blobs():
    X, truth = blobs([100, 100, 100], seed=3)
    labels, _, _ = balanced_partition(X, 3, "kmeans", seed=0)
    assert same_grouping(labels, truth)


def test_balanced_partition_rejects_bad_input():
    X = np.zeros((5, 2))
    with pytest.raises(InputError, match="unknown partition method"):
        balanced_partition(X, 2, "random")
    with pytest.raises(InputError, match="parts"):
        balanced_partition(X, 6)


@pytest.mark.mpi(min_size=1)
def test_distributed_lloyd_matches_sklearn_from_the_same_start(comm):
    X, _ = blobs([90, 80, 71, 60], d=5, spread=2.0, seed=4)  # overlapping: several iterations
    init = X[[0, 100, 200, 300]]
    counting = CountingComm(comm)
    ours = distributed_kmeans(counting, X, 4, init=init)
    reference = cluster.KMeans(4, init=init, n_init=1, algorithm="lloyd", tol=0.0, max_iter=300).fit(X)
    assert ours.converged and ours.n_iter >= 2
    np.testing.assert_array_equal(ours.labels, reference.labels_)
    np.testing.assert_allclose(ours.centres, reference.cluster_centers_, rtol=1e-10, atol=1e-12)
    assert ours.inertia == pytest.approx(reference.inertia_, rel=1e-9)
    p = comm.size
    expected = (ours.n_iter + 1) * 2 * (p - 1) / p * 8 * (4 * 6 + 2) + (p - 1) / p * 8 * len(X)
    assert counting.bytes_sent == pytest.approx(expected)


@pytest.mark.mpi(min_size=1)
def test_kmeans_plus_plus_start_reaches_sklearn_inertia(comm):
    X, _ = blobs([70, 50, 41, 30, 10], d=4, spread=6.0, seed=5)
    ours = distributed_kmeans(CountingComm(comm), X, 5, seed=1)
    best = cluster.KMeans(5, n_init=10, random_state=0).fit(X).inertia_
    assert ours.inertia <= 1.001 * best
    assert gathered_equal(comm, ours.labels) and gathered_equal(comm, ours.centres)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n, k", [(1, 1), (3, 2), (5, 3)])
def test_distributed_lloyd_with_empty_blocks_matches_one_rank(comm, n, k):
    X = np.random.default_rng(n).normal(size=(n, 2))  # fewer points than ranks: some blocks are empty
    ours = distributed_kmeans(CountingComm(comm), X, k, seed=2)
    alone = distributed_kmeans(CountingComm(MPI.COMM_SELF), X, k, seed=2)
    np.testing.assert_array_equal(ours.labels, alone.labels)
    np.testing.assert_allclose(ours.centres, alone.centres, rtol=1e-12)
    assert ours.inertia == pytest.approx(alone.inertia, rel=1e-12, abs=1e-15)
    assert gathered_equal(comm, ours.labels) and gathered_equal(comm, ours.centres)
