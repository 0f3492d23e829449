"""`bench.models.base.balanced_dims`: MPI's grid shapes, also where MPI is not initialised (report, sweep)."""
import json
import subprocess
import sys

from mpi4py import MPI

from bench.models.base import balanced_dims

COUNTS = list(range(1, 400)) + [720, 1000, 4096, 5040, 65536, 720720, 1 << 20]
WITHOUT_MPI = """
import json, sys
import mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False
from mpi4py import MPI
from bench.models.base import balanced_dims
assert not MPI.Is_initialized()
print(json.dumps([balanced_dims(n, axes) for axes in (1, 2, 3) for n in json.loads(sys.argv[1])]))
"""


def test_without_mpi_the_grids_are_those_mpi_makes():
    done = subprocess.run([sys.executable, "-c", WITHOUT_MPI, json.dumps(COUNTS)], capture_output=True, text=True,
                          timeout=120, check=True)
    expected = [list(MPI.Compute_dims(n, axes)) for axes in (1, 2, 3) for n in COUNTS]
    assert json.loads(done.stdout) == expected
    assert balanced_dims(12, 2) == (4, 3) and balanced_dims(360, 3) == (10, 6, 6)
