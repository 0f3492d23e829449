"""Partitions for the partitioned SVMs: k-means, balanced partitions, routed local models.

- `distributed_kmeans`: Lloyd's k-means (k-means++ start from a seed); each rank
  assigns its block of points and the centres follow from one Allreduce of
  per-cluster sums and counts (CP-SVM).
- `balanced_partition`: ``parts`` partitions whose sizes differ by at most one,
  by first-come-first-served (FCFS) assignment to k-means++ centres or by
  balanced k-means, optionally keeping the global class ratio in every
  partition (CA-SVM; computed redundantly on every rank, without communication).

Routing of queries to the partitions' models lives in `svm.distributed.local_models`.

``comm`` arguments are communicators, usually `kernels.comm.counting.CountingComm`
wrappers (they count ``bytes_sent`` by that module's convention). Every rank passes the same data.
Points may be device (CuPy) arrays: distances, labels and centres then stay on
the device; the random draws (k-means++, FCFS order) come from a host NumPy
generator, as do the capacitated assignment's sequential choices, and read
what they need from the device explicitly (`svm.solver.arrays.to_host`).
"""
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module
from kernels.distribution import block_counts, block_range
from kernels.errors import InputError
from svm.distributed.common import allgather_blocks
from svm.solver.arrays import to_host
from svm.solver.gram import squared_norms


def check_positive_int(name, value):
    """InputError unless ``value`` is an integer >= 1 (booleans excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")


def squared_distances(X, centres):
    """Squared Euclidean distances, shape ``(len(X), len(centres))``, from one matrix product."""
    distances = X @ centres.T
    distances *= -2.0
    distances += squared_norms(X)[:, None]
    distances += squared_norms(centres)[None, :]
    return array_module(X).maximum(distances, 0.0, out=distances)


def kmeans_plus_plus(X, k, rng):
    """Return ``k`` rows of ``X`` chosen by k-means++ seeding (D^2 sampling), shape ``(k, d)``.

    The host generator ``rng`` draws from the ``n`` distances, read from a device once per centre."""
    xp = array_module(X)
    chosen = [int(rng.integers(len(X)))]
    nearest = squared_distances(X, X[chosen])[:, 0]
    for _ in range(1, k):
        host = to_host(nearest)
        total = host.sum()
        weights = host / total if total > 0 else np.full(len(X), 1.0 / len(X))
        chosen.append(int(rng.choice(len(X), p=weights)))
        xp.minimum(nearest, squared_distances(X, X[chosen[-1:]])[:, 0], out=nearest)
    return X[chosen].copy()


def partition_means(X, labels, parts, previous=None):
    """Mean of each partition, shape ``(parts, d)``; an empty one keeps its ``previous`` centre (or zeros)."""
    xp = array_module(X)
    onehot = xp.zeros((len(X), parts))
    onehot[xp.arange(len(X)), labels] = 1.0
    counts = onehot.sum(axis=0)
    means = xp.zeros((parts, X.shape[1])) if previous is None else previous.copy()
    filled = counts > 0
    means[filled] = (onehot.T @ X)[filled] / counts[filled, None]
    return means


def gather_labels(comm, local, n):
    """Allgatherv the int64 labels of every rank's block of ``n`` items (in the array module of ``local``)."""
    xp = array_module(local)
    labels = xp.empty(n, dtype=np.int64)
    allgather_blocks(comm, xp.ascontiguousarray(local, dtype=np.int64), labels, block_counts(n, comm.size))
    return labels


@dataclass
class KMeansResult:
    """Outcome of `distributed_kmeans` (the same on every rank)."""

    centres: np.ndarray  #: (k, d)
    labels: np.ndarray  #: (n,) index of each point's centre
    inertia: float  #: sum of squared distances of the points to their centres
    n_iter: int  #: centre updates made
    converged: bool  #: the last assignment changed no label


def distributed_kmeans(comm, X, k, seed=0, max_iter=100, init=None):
    """Lloyd's k-means with each rank assigning its block of points.

    Parameters
    ----------
    comm : MPI.Comm or kernels.comm.counting.CountingComm
    X : ndarray of shape (n, d)
        The full data, the same on every rank; rank ``r`` assigns rows
        ``block_range(n, p, r)`` (``n / p`` rows).
    k : int
        Number of clusters, ``1 <= k <= n``.
    seed : int
        Seed of the k-means++ start (drawn identically on every rank, no messages).
    max_iter : int
        Cap on centre updates; iterations stop earlier when no label changes.
    init : ndarray of shape (k, d), optional
        Starting centres instead of k-means++.

    Returns
    -------
    KMeansResult

    Notes
    -----
    Per iteration: one Allreduce of ``k (d + 1) + 2`` doubles (sums, counts,
    inertia, labels changed), ``2 log p`` messages and ``16 (k (d + 1) + 2)``
    bytes per rank; at the end one Allgatherv of the ``n`` int64 labels.
    Computation ``O(n k d / p)`` per iteration. An empty cluster keeps its centre.
    """
    n, d = X.shape
    if not 1 <= k <= n:
        raise InputError(f"k-means needs 1 <= k <= n samples, got k={k}, n={n}")
    xp = array_module(X)
    centres = kmeans_plus_plus(X, k, np.random.default_rng(seed)) if init is None else xp.asarray(init, dtype=float).copy()
    if centres.shape != (k, d):
        raise InputError(f"init must have shape {(k, d)}, got {centres.shape}")
    start, stop = block_range(n, comm.size, comm.rank)
    block = X[start:stop]
    local = xp.full(stop - start, -1)
    totals = xp.empty(k * (d + 1) + 2)
    rows = xp.arange(len(block))
    for n_iter in range(max_iter + 1):
        distances = squared_distances(block, centres)
        labels = distances.argmin(axis=1)
        onehot = xp.zeros((len(block), k))
        onehot[rows, labels] = 1.0
        tail = xp.stack([distances[rows, labels].sum(), xp.count_nonzero(labels != local) * 1.0])
        partial = xp.concatenate([(onehot.T @ block).ravel(), onehot.sum(axis=0), tail])
        comm.Allreduce(partial, totals)
        local = labels
        converged = bool(totals[-1] == 0)
        if converged or n_iter == max_iter:
            break
        counts = totals[k * d:k * (d + 1)]
        filled = counts > 0
        centres[filled] = totals[:k * d].reshape(k, d)[filled] / counts[filled, None]
    return KMeansResult(centres, gather_labels(comm, local, n), float(totals[-2]), n_iter, bool(converged))


def class_capacities(codes, parts):
    """Room for each class in each partition, shape ``(n_classes, parts)``.

    The points sorted by class are dealt to the partitions in turn, so partition
    sizes differ by at most one and so do the counts of each class: every
    partition keeps the global class ratio as nearly as integers allow.
    """
    n_classes = int(codes.max()) + 1
    dealt_class = np.repeat(np.arange(n_classes), np.bincount(codes, minlength=n_classes))
    dealt_part = np.arange(len(codes)) % parts
    return np.bincount(dealt_class * parts + dealt_part, minlength=n_classes * parts).reshape(n_classes, parts)


def capacitated_assign(distances, order, codes, capacity):
    """Points in ``order`` each take their nearest partition with room left for their class.

    Parameters
    ----------
    distances : ndarray of shape (n, parts)
    order : ndarray of shape (n,)
        Arrival order (a permutation of the points).
    codes : ndarray of shape (n,)
        Class index of each point (all zeros to ignore classes).
    capacity : ndarray of shape (n_classes, parts)
        Room per class and partition; each row sums to its class size.

    Returns
    -------
    ndarray of shape (n,)
        Partition of each point (host: the loop over the points is sequential).
    """
    room = capacity.tolist()
    ranking = array_module(distances).argsort(distances, axis=1, kind="stable").tolist()
    labels = np.empty(len(distances), dtype=np.int64)
    for point in order.tolist():
        class_room = room[codes[point]]
        part = next(part for part in ranking[point] if class_room[part] > 0)
        class_room[part] -= 1
        labels[point] = part
    return labels


BALANCED_METHODS = ("fcfs", "kmeans")


def balanced_partition(X, parts, method="fcfs", codes=None, seed=0, max_iter=100):
    """Split the points into ``parts`` partitions of sizes ``n // parts`` or ``n // parts + 1``.

    ``fcfs``: k-means++ centres, then the points in a random order each take the
    nearest centre that still has room (first come, first served); one pass.
    ``kmeans``: balanced k-means: Lloyd's iterations whose assignment step is the
    same capacitated assignment, points with the largest regret (second-nearest
    minus nearest distance) first, until no label changes or ``max_iter``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    parts : int
        ``1 <= parts <= n``.
    method : {"fcfs", "kmeans"}
    codes : ndarray of int of shape (n,), optional
        Class index of each point: each partition then also gets its share of every
        class (`class_capacities`). Default: classes ignored.
    seed : int
    max_iter : int

    Returns
    -------
    labels : ndarray of shape (n,)
        In the array module of ``X``.
    centres : ndarray of shape (parts, d)
        Mean of each partition (for routing queries to the nearest one).
    n_iter : int
        Assignment passes made.

    Notes
    -----
    Serial (every rank computes the same partition from the same seed): no
    messages. ``O(n parts d)`` per pass plus a Python loop over the points.
    """
    n = len(X)
    if method not in BALANCED_METHODS:
        raise InputError(f"unknown partition method {method!r}; choose one of {', '.join(BALANCED_METHODS)}")
    if not 1 <= parts <= n:
        raise InputError(f"need 1 <= parts <= n samples, got parts={parts}, n={n}")
    xp = array_module(X)
    codes = np.zeros(n, dtype=np.int64) if codes is None else np.unique(to_host(codes), return_inverse=True)[1].ravel()
    capacity = class_capacities(codes, parts)
    rng = np.random.default_rng(seed)
    centres = kmeans_plus_plus(X, parts, rng)
    labels = None
    for n_iter in range(1, (1 if method == "fcfs" else max_iter) + 1):
        distances = squared_distances(X, centres)
        if method == "fcfs":
            order = rng.permutation(n)
        else:
            nearest_two = xp.sort(distances, axis=1)[:, :2]
            order = xp.argsort(nearest_two[:, 0] - nearest_two[:, -1], kind="stable")
        previous, labels = labels, xp.asarray(capacitated_assign(distances, order, codes, capacity))
        centres = partition_means(X, labels, parts, centres)
        if previous is not None and bool(xp.array_equal(previous, labels)):
            break
    return labels, centres, n_iter
