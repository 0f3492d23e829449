"""The parallel SVMs on the simulated device: the NumPy path's models, kept in device arrays, on 1-4 ranks."""
import numpy as np
import pytest

from fake_device import fake_device_backend
from kernels.comm.counting import CountingComm
from svm.distributed.cascade import CascadeSVM
from svm.distributed.casvm import CASVM, CPSVM
from svm.distributed.dcsvm import DCSVM
from svm.distributed.dis_smo import DisSMO, dis_smo_solve
from svm.distributed.partition import balanced_partition, distributed_kmeans
from svm.solver.gram import make_kernel

datasets = pytest.importorskip("sklearn.datasets")


def problem(n=143, d=6, seed=3):
    X, y = datasets.make_classification(n_samples=n, n_features=d, n_informative=4, flip_y=0.05, random_state=seed)
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def agreed(comm, verdict):
    """Every rank's verdict, so that all ranks assert the same."""
    return comm.allgather(verdict) == [True] * comm.size


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("estimator", [DisSMO, CascadeSVM, DCSVM, CPSVM, CASVM, lambda **kw: DCSVM(n_levels=2, **kw),
                                       lambda **kw: CPSVM(routing="centre", **kw)])
def test_parallel_svms_on_the_device_match_the_numpy_path(comm, estimator):
    device = fake_device_backend()
    X, y = problem()
    host = estimator(comm=comm).fit(X, y)
    fitted = estimator(comm=device.comm(comm)).fit(device.from_host(X), device.from_host(y))
    predictions = fitted.predict(device.from_host(X[::3]))
    on_device = all(device.is_device_array(array) for array in (
        fitted.support_vectors_, fitted.dual_coef_, fitted.intercept_, predictions))
    same = (np.array_equal(device.to_host(predictions), host.predict(X[::3]))
            and np.array_equal(device.to_host(fitted.support_), host.support_)
            and np.allclose(device.to_host(fitted.dual_coef_), host.dual_coef_, rtol=1e-12, atol=1e-15)
            and fitted.n_iter_ == host.n_iter_ and fitted.bytes_sent_ == host.bytes_sent_)
    assert agreed(comm, on_device and same)


@pytest.mark.mpi(min_size=1)
def test_dis_smo_with_empty_blocks_on_the_device(comm):
    device = fake_device_backend()
    n = 3 if comm.size > 3 else 2  # fewer samples than ranks on 3 and 4 ranks
    X = np.random.default_rng(1).normal(size=(n, 2))
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    kernel = make_kernel("rbf", X)
    host = dis_smo_solve(comm, X, signs, kernel)
    result = dis_smo_solve(device.comm(comm), device.from_host(X), device.from_host(signs), kernel)
    assert agreed(comm, device.is_device_array(result.alpha)
                  and np.array_equal(device.to_host(result.alpha), host.alpha) and result.bias == host.bias)


@pytest.mark.mpi(min_size=1)
def test_partitions_on_the_device_match_the_numpy_path(comm):
    device = fake_device_backend()
    X, y = problem(n=101)
    host = distributed_kmeans(CountingComm(comm), X, 3, seed=2)
    result = distributed_kmeans(CountingComm(device.comm(comm)), device.from_host(X), 3, seed=2)
    same = (np.array_equal(device.to_host(result.labels), host.labels) and result.n_iter == host.n_iter
            and np.allclose(device.to_host(result.centres), host.centres, rtol=1e-12))
    for method in ("fcfs", "kmeans"):
        labels, centres, _ = balanced_partition(device.from_host(X), 3, method, device.from_host(y), seed=1)
        host_labels, host_centres, _ = balanced_partition(X, 3, method, y, seed=1)
        same = same and device.is_device_array(labels) and np.array_equal(device.to_host(labels), host_labels)
    assert agreed(comm, same and device.is_device_array(result.centres))
