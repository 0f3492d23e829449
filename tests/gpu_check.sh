#!/usr/bin/env bash
# GPU check of the CuPy backend, run on a machine with an NVIDIA GPU, CuPy and mpi4py
# (no install needed: the repository is put on PYTHONPATH). Writes its CSVs under $OUT
# (or /tmp/gpu_check). Usage: bash tests/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY -c "import cupy, mpi4py, numpy; from mpi4py import MPI; print('cupy', cupy.__version__, 'mpi4py', mpi4py.__version__, 'numpy', numpy.__version__); print(MPI.Get_library_version().splitlines()[0])"
$PY -m pytest -q -p no:cacheprovider tests/kernels/test_backend.py
for aware in 0 1; do  # 1 must be refused by an MPI that says it is not CUDA-aware
  echo "== allreduce on one rank, cupy, MLSCALE_CUDA_AWARE=$aware"
  MLSCALE_CUDA_AWARE=$aware $PY -m bench.cli run allreduce --backend cupy --sizes 8,64K,16M --iters 5 \
    --csv "$OUT/allreduce_cupy_aware$aware.csv"
  echo "exit status $?"
done
echo "== numpy on the same machine, for comparison"
$PY -m bench.cli run allreduce --sizes 8,64K,16M --iters 5 --csv "$OUT/allreduce_numpy.csv"
if command -v mpiexec >/dev/null; then
  # Open MPI refuses root without these; harmless for other MPIs.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "== 2 ranks on one GPU (host-staged)"
  mpiexec -n 2 $PY -m bench.cli run allreduce --backend cupy --sizes 8,64K,16M --iters 5 --csv "$OUT/allreduce_cupy_2.csv"
  echo "exit status $?"
  mpiexec -n 2 $PY -m bench.cli run p2p --backend cupy --sizes 8,64K,16M --iters 5 --csv "$OUT/p2p_cupy_2.csv"
  echo "exit status $?"
  mpiexec -n 2 $PY -m bench.cli run allreduce --sizes 8,64K,16M --iters 5 --csv "$OUT/allreduce_numpy_2.csv"
  echo "exit status $?"
else
  echo "no mpiexec on this machine: multi-rank GPU runs skipped"
fi
