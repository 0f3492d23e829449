"""DC-SVM (Hsieh, Si & Dhillon, ICML 2014): divide by kernel k-means, conquer with warm-started SMO.

Divide: two-step kernel k-means (`kernel_kmeans` on a random
sample, then every point goes to the nearest cluster by kernel distance) splits
the data into ``k`` clusters; with ``n_levels = L`` each cluster is split again,
giving nested clusters, ``k^l`` slots at level ``l``.

Conquer, from the finest level up: each cluster's SVM is solved by `smo_solve`
on the rank that owns it (clusters are dealt to ranks largest first, to the
least loaded rank), warm-started from the finer level's alphas (feasible since
every cluster is a union of finer clusters); the ranks then Allgatherv the
alphas. Finally rank 0 solves the whole problem warm-started from the level-1
alphas and broadcasts the solution (the other ranks wait: the global solve is
DC-SVM's serial part), so every rank holds the exact SVM of the full data.

Early prediction (``early=True``) skips the global model: a query is answered by
the level-1 model of its nearest cluster in kernel distance.

On a device (CuPy samples, a `kernels.backend.Backend.comm`) the kernel
k-means, the solves, alphas and models stay in device memory; the cluster
labels of the levels are host index arrays (they steer the Python loops over
clusters), and the sample is drawn by a host generator.
"""
from dataclasses import dataclass

import numpy as np

from kernels.backend import array_module
from kernels.distribution import block_range
from kernels.errors import InputError
from svm.solver.arrays import to_host
from svm.solver.gram import kernel_product
from svm.distributed.common import ParallelSVC, allgather_blocks
from svm.distributed.local_models import LocalModels
from svm.distributed.partition import check_positive_int, gather_labels
from svm.solver.checks import check_samples
from svm.solver.smo import DEFAULT_CACHE_BYTES, smo_solve


@dataclass
class KernelClusters:
    """Clusters of a sample in the kernel's feature space (two-step kernel k-means).

    The kernel distance from ``x`` to cluster ``c`` (sample members ``S_c``) is
    ``K(x, x) - 2 mean_{s in S_c} K(x, s) + self_terms[c]``; ``K(x, x)`` is
    dropped where only the nearest cluster matters. Empty clusters are never nearest.
    """

    sample: np.ndarray  #: (m, d) the clustered sample
    labels: np.ndarray  #: (m,) cluster of each sample point
    self_terms: np.ndarray  #: (k,) mean of K over the pairs of each cluster (inf when empty)

    def weights(self):
        """Matrix ``(m, k)`` with ``1 / |S_c|`` where sample point ``i`` is in ``c``, else 0."""
        k, xp = len(self.self_terms), array_module(self.sample)
        onehot = xp.zeros((len(self.sample), k))
        onehot[xp.arange(len(self.sample)), self.labels] = 1.0
        return onehot / xp.maximum(onehot.sum(axis=0), 1.0)

    def nearest(self, kernel, X):
        """Cluster of each row of ``X`` by kernel distance (one blocked kernel product)."""
        return (self.self_terms - 2.0 * kernel_product(kernel, X, self.sample, self.weights())).argmin(axis=1)


def kernel_kmeans(comm, S, kernel, k, rng, max_iter=30):
    """Kernel k-means of the sample ``S``, distributed over blocks of its rows.

    Parameters
    ----------
    comm : MPI.Comm or kernels.comm.counting.CountingComm
    S : ndarray of shape (m, d)
        The sample, the same on every rank; rank ``r`` holds the kernel rows
        ``K(S[block_range(m, p, r)], S)`` (``m^2 / p`` values).
    kernel : svm.solver.gram.Kernel
    k : int
        Clusters wanted (``min(k, m)`` are used).
    rng : numpy.random.Generator
        The same state on every rank: it draws the ``k`` starting points.
    max_iter : int

    Returns
    -------
    KernelClusters

    Notes
    -----
    Per iteration: an Allreduce of ``k`` doubles (within-cluster kernel sums) and
    an Allgatherv of the ``m`` int64 labels: about ``4 log p`` messages and
    ``16 k + 8 m`` bytes per rank. Computation ``O(m^2 k / p)`` per iteration.
    """
    xp = array_module(S)
    m, k = len(S), min(k, len(S))
    start, stop = block_range(m, comm.size, comm.rank)
    rows = kernel.block(S[start:stop], S)
    seeds = S[rng.choice(m, k, replace=False)]
    labels = (kernel.diagonal(seeds)[None, :] - 2.0 * kernel.block(S, seeds)).argmin(axis=1)
    within = xp.empty(k)
    for n_iter in range(max_iter + 1):
        clusters = KernelClusters(S, labels, xp.zeros(k))
        mean_rows = rows @ clusters.weights()  # (block, k): mean of K(x_i, S_c)
        own = labels[start:stop]
        sizes = xp.bincount(labels, minlength=k)
        contribution = mean_rows[xp.arange(len(own)), own] / xp.maximum(sizes[own], 1)
        local = xp.bincount(own, weights=contribution, minlength=k).astype(np.float64)  # (float64 when empty)
        comm.Allreduce(local, within)
        clusters.self_terms = xp.where(sizes > 0, within, np.inf)
        new = gather_labels(comm, (clusters.self_terms - 2.0 * mean_rows).argmin(axis=1), m)
        if bool(xp.array_equal(new, labels)) or n_iter == max_iter:
            return clusters
        labels = new


def assign_points(comm, X, clusters, kernel):
    """Nearest kernel cluster of every row of ``X``, each rank assigning its block of rows.

    Communication: one Allgatherv of the ``n`` int64 labels. Computation
    ``O(n m d / p)`` (one blocked kernel product with the sample).
    """
    start, stop = block_range(len(X), comm.size, comm.rank)
    return gather_labels(comm, clusters.nearest(kernel, X[start:stop]), len(X))


def deal_largest_first(sizes, parts):
    """Owner rank of each cluster: largest first, each to the least loaded rank (ties: lowest rank)."""
    owner = np.zeros(len(sizes), dtype=np.int64)
    load = np.zeros(parts)
    for cluster in np.argsort(-to_host(sizes), kind="stable"):
        owner[cluster] = int(np.argmin(load))
        load[owner[cluster]] += sizes[cluster]
    return owner


class DCSVM(ParallelSVC):
    """Divide-and-conquer kernel SVM with multilevel warm starts and early prediction.

    Parameters
    ----------
    C, kernel, gamma, degree, coef0, tol, comm : as `svm.distributed.common.ParallelSVC`
    n_clusters : int, optional
        Clusters per split ``k``; default ``max(2, p)``.
    n_levels : int
        Levels of nested clusters (``k^L`` at the finest level).
    sample_size : int
        Points sampled for kernel k-means (all when ``n`` is smaller).
    kmeans_iter : int
        Cap on kernel k-means iterations per split.
    seed : int
        Seed of the sample and the k-means starts (the same on every rank).
    cache_bytes : int
        Kernel row cache of each SMO solve.

    Attributes (after fit, the same on every rank)
    ----------------------------------------------
    classes_, kernel_, support_, support_vectors_, dual_coef_, intercept_, dual_objective_ :
        The global model (as `svm.distributed.common.ParallelSVC`).
    n_iter_ : int
        SMO iterations of the warm-started global solve.
    level_n_iter_ : ndarray of shape (n_levels,)
        SMO iterations summed over the clusters of each level (index 0: level 1).
    cluster_labels_ : ndarray of shape (n_levels, n)
        Cluster of each training sample at each level (index 0: level 1; host array).
    clusters_ : svm.distributed.partition.KernelClusters
        The level-1 clusters (routing for early prediction).
    early_models_ : svm.distributed.local_models.LocalModels
        The level-1 models of each cluster.
    bytes_sent_ : float

    Notes
    -----
    Communication (``m`` sample size, ``G_l`` clusters at level ``l``): per split
    and kernel k-means iteration an Allreduce of ``k`` doubles and an Allgatherv
    of the sample's ``m`` labels; per level an Allgatherv of the ``n`` int64
    labels and one of ``n + 2 G_l`` doubles (alphas, biases, iterations); a Bcast
    of ``n + 3`` doubles from rank 0 (global solution).
    """

    _PARAMS = ParallelSVC._PARAMS + ("n_clusters", "n_levels", "sample_size", "kmeans_iter", "seed", "cache_bytes")

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0, tol=1e-3, comm=None,
                 n_clusters=None, n_levels=1, sample_size=1000, kmeans_iter=30, seed=0,
                 cache_bytes=DEFAULT_CACHE_BYTES):
        super().__init__(C, kernel, gamma, degree, coef0, tol, comm)
        self.n_clusters, self.n_levels, self.sample_size = n_clusters, n_levels, sample_size
        self.kmeans_iter, self.seed, self.cache_bytes = kmeans_iter, seed, cache_bytes

    def fit(self, X, y):
        """Divide, solve the levels bottom-up, then the warm-started global problem; return self."""
        comm, X, signs = self._begin_fit(X, y)
        k = max(2, comm.size) if self.n_clusters is None else self.n_clusters
        for name, value in (("n_clusters", k), ("n_levels", self.n_levels), ("sample_size", self.sample_size),
                            ("kmeans_iter", self.kmeans_iter)):
            check_positive_int(name, value)
        xp = array_module(X)
        self.cluster_labels_ = self._divide(comm, X, k)
        alpha = xp.zeros(len(X))
        self.level_n_iter_ = np.zeros(self.n_levels, dtype=np.int64)
        for level in reversed(range(self.n_levels)):
            alpha, bias, n_iter = self._conquer(comm, X, signs, self.cluster_labels_[level], k ** (level + 1), alpha)
            self.level_n_iter_[level] = n_iter.sum()
        support = xp.flatnonzero(alpha)
        self.early_models_ = LocalModels(support, X[support], (alpha * signs)[support],
                                         xp.asarray(self.cluster_labels_[0])[support], xp.asarray(bias))
        solution = xp.empty(len(X) + 3)
        if comm.rank == 0:
            result = smo_solve(X, signs, self.kernel_, self.C, self.tol, alpha0=alpha, cache_bytes=self.cache_bytes)
            solution[:len(X)] = result.alpha
            solution[len(X):] = xp.asarray(np.array([result.bias, result.n_iter, result.objective]))
        comm.Bcast(solution, root=0)
        alpha, (bias, n_iter, objective) = solution[:len(X)], to_host(solution[len(X):]).tolist()
        support = xp.flatnonzero(alpha)
        return self._end_fit(comm, support, X[support], (alpha * signs)[support], bias, objective, n_iter)

    def _divide(self, comm, X, k):
        """Nested kernel k-means clusters: return the labels of every level, shape ``(n_levels, n)``.

        Sets ``clusters_`` (the level-1 split). A cluster without sample points is
        not split further (its points go to its first child).
        """
        rng = np.random.default_rng(self.seed)
        sample = np.sort(rng.choice(len(X), min(len(X), self.sample_size), replace=False))
        labels = np.zeros(len(X), dtype=np.int64)
        levels = []
        for _ in range(self.n_levels):
            children = labels * k
            for cluster in np.unique(labels):
                picked = sample[labels[sample] == cluster]
                if len(picked) == 0:
                    continue
                points = np.flatnonzero(labels == cluster)
                split = kernel_kmeans(comm, X[picked], self.kernel_, k, rng, self.kmeans_iter)
                children[points] += to_host(assign_points(comm, X[points], split, self.kernel_))
                if not levels:
                    self.clusters_ = split
            labels = children
            levels.append(labels)
        return np.array(levels)

    def _conquer(self, comm, X, signs, labels, n_clusters, alpha):
        """Solve every cluster of one level on its owner, warm-started from ``alpha``; share the results.

        Returns the new alphas (n,), and each cluster's bias and SMO iterations (``n_clusters``,; host arrays).
        """
        xp = array_module(X)
        sizes = np.bincount(labels, minlength=n_clusters)
        members = np.split(np.argsort(labels, kind="stable"), np.cumsum(sizes)[:-1])
        owner = deal_largest_first(sizes, comm.size)
        owned = [np.flatnonzero((owner == rank) & (sizes > 0)) for rank in range(comm.size)]
        results = [smo_solve(X[members[c]], signs[members[c]], self.kernel_, self.C, self.tol,
                             alpha0=alpha[members[c]], cache_bytes=self.cache_bytes) for c in owned[comm.rank]]
        figures = xp.asarray(np.array([r.bias for r in results] + [r.n_iter for r in results], dtype=np.float64))
        payload = xp.concatenate([r.alpha for r in results] + [figures])
        counts = [int(sizes[clusters].sum()) + 2 * len(clusters) for clusters in owned]
        gathered = xp.empty(sum(counts))
        allgather_blocks(comm, payload, gathered, counts)
        new_alpha, bias, n_iter = xp.zeros(len(X)), np.zeros(n_clusters), np.zeros(n_clusters, dtype=np.int64)
        offset = 0
        for clusters in owned:
            points = np.concatenate([members[c] for c in clusters] + [np.zeros(0, dtype=np.int64)])
            new_alpha[points] = gathered[offset:offset + len(points)]
            offset += len(points)
            figures = to_host(gathered[offset:offset + 2 * len(clusters)])
            bias[clusters], n_iter[clusters] = figures[:len(clusters)], figures[len(clusters):]
            offset += 2 * len(clusters)
        return new_alpha, bias, n_iter

    def decision_function(self, X, early=False):
        """Decision values (shape (n,)) of the global model, or with ``early=True`` of each query's
        nearest level-1 cluster model."""
        if not early:
            return super().decision_function(X)
        if not hasattr(self, "early_models_"):
            raise InputError(f"this {type(self).__name__} is not fitted yet; call fit first")
        X = check_samples(X)
        self.early_models_.check(X)
        return self.early_models_.decision(self.kernel_, X, self.clusters_.nearest(self.kernel_, X))

    def predict(self, X, early=False):
        """Class of each row of ``X`` (``classes_[1]`` where the decision value is positive)."""
        positive = self.decision_function(X, early) > 0
        return self.classes_[positive.astype(np.int64)]

    def score(self, X, y, early=False):
        """Mean accuracy of `predict` on ``X`` against ``y``."""
        predictions = self.predict(X, early)
        return float((predictions == array_module(predictions).asarray(y)).mean())
