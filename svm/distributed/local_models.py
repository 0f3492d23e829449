"""Local models of partitioned SVMs and the routing of queries to them.

- `nearest_centre`: the partition with the nearest centre (compact partitions:
  k-means, kernel k-means clusters);
- `neighbour_vote`: the partition holding most of the query's nearest training
  points (any partition, balanced ones too);
- `LocalModels`: one small SVM per partition, evaluated on the partition each
  query point is routed to (CP-SVM, CA-SVM, DC-SVM's early prediction).

Nothing here communicates: every rank holds the same models and routes alike.
Queries, points and models may be device (CuPy) arrays; routes and decision
values are then computed on the device.
"""
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module
from kernels.errors import InputError
from svm.solver.gram import kernel_product
from svm.distributed.partition import squared_distances


def nearest_centre(X, centres, usable=None):
    """Index of the nearest centre of each row of ``X`` among the ``usable`` ones (default all)."""
    distances = squared_distances(X, centres)
    if usable is not None:
        distances[:, ~usable] = np.inf
    return distances.argmin(axis=1)


def neighbour_vote(X, points, labels, parts, k=5, block_rows=512):
    """Partition holding most of the ``k`` training points nearest to each row of ``X`` (Euclidean).

    Ties go to the partition of the nearest point among the tied ones (the
    ``r``-th nearest point's vote weighs ``1 + 2^-r``; the extras sum to less than
    one vote). Balanced partitions are not compact, so the nearest partition
    *mean* often lies in the wrong region; the neighbours' partition is the model
    that was trained on the query's surroundings.

    Parameters
    ----------
    X : ndarray of shape (q, d)
    points : ndarray of shape (n, d)
        The training points.
    labels : ndarray of int of shape (n,)
        Partition of each training point, in ``[0, parts)``.
    parts : int
    k : int
        Neighbours that vote (``min(k, n)``).
    block_rows : int
        Queries per distance block (memory ``8 block_rows n`` bytes).

    Returns
    -------
    ndarray of int64 of shape (q,)

    Notes
    -----
    ``O(q n d)`` flops (one matrix product per block), no communication.
    """
    xp = array_module(X)
    k = min(k, len(points))
    weights = (1.0 + 0.5 ** np.arange(1, k + 1)).tolist()
    routes = xp.empty(len(X), dtype=np.int64)
    for start in range(0, len(X), block_rows):
        distances = squared_distances(X[start:start + block_rows], points)
        nearest = xp.argpartition(distances, k - 1, axis=1)[:, :k]
        order = xp.argsort(xp.take_along_axis(distances, nearest, 1), axis=1, kind="stable")
        nearest = xp.take_along_axis(nearest, order, 1)  # the k nearest, nearest first
        votes = xp.zeros((len(nearest), parts))
        queries = xp.arange(len(nearest))
        for rank, weight in enumerate(weights):  # one vote per query and rank: no index repeats in a step
            votes[queries, labels[nearest[:, rank]]] += weight
        routes[start:start + block_rows] = votes.argmax(axis=1)
    return routes


@dataclass
class LocalModels:
    """One binary SVM per partition; a query is answered by the model of the partition it is routed to.

    The decision value of a query routed to partition ``q`` is
    ``sum_{i in q} coef_i K(sv_i, x) + bias[q]``.
    """

    support: np.ndarray  #: (s,) training indices of the support vectors, grouped by partition
    support_vectors: np.ndarray  #: (s, d)
    coef: np.ndarray  #: (s,) ``y_i alpha_i``
    partition: np.ndarray  #: (s,) partition of each support vector
    bias: np.ndarray  #: (parts,)

    def check(self, X):
        """InputError unless ``X`` has the training data's number of features."""
        if X.shape[1] != self.support_vectors.shape[1]:
            raise InputError(f"X has {X.shape[1]} features, the model was fitted with {self.support_vectors.shape[1]}")

    def decision(self, kernel, X, routes):
        """Decision value of each row of ``X`` from the model of partition ``routes[i]``."""
        xp = array_module(X)
        values = self.bias[routes].astype(np.float64)
        for part in xp.unique(routes).tolist():
            rows, own = routes == part, self.partition == part
            values[rows] += kernel_product(kernel, X[rows], self.support_vectors[own], self.coef[own])
        return values
