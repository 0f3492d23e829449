# The two commands: `make sweep` and `make test`. Each makes .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
STAMP := $(VENV)/.installed
NPROC := $(shell nproc 2>/dev/null || echo 2)
# Rank counts every MPI test runs on (3 catches power-of-two assumptions).
TEST_RANKS ?= 1 2 3 4
# Seconds allowed for each MPI test launch before it is killed.
TEST_TIMEOUT ?= 900
RESULTS ?= results
REPORT ?= report

.PHONY: sweep test venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[mpich,test,plot,ml]'
	touch $(STAMP)

# The default sweep: point-to-point and allreduce on 1..nproc ranks, small sizes. The calibration is written
# even when a table is unstable (--force: each is named, and the report warns), so a busy node still gets a report.
sweep: $(STAMP)
	$(VENV)/bin/mlscale sweep p2p --np 2 --sizes 8:1M --csv $(RESULTS)/p2p.csv
	$(VENV)/bin/mlscale sweep allreduce --np $(NPROC) --ranks 1:$(NPROC) --sizes 8:4M --csv $(RESULTS)/allreduce.csv
	$(VENV)/bin/mlscale calibrate --force --out $(RESULTS)/calib.json
	$(VENV)/bin/mlscale report $(RESULTS)/p2p.csv $(RESULTS)/allreduce.csv --out $(REPORT) \
	  --model $(RESULTS)/calib.json --project 64,256,1024

# -rs: say why a test was skipped (the Slurm cluster test needs Slurm: .ci/run installs it). The serial
# tests run on one pytest-xdist worker per core (the Slurm cluster's tests on one worker: --dist loadgroup), each
# process they start with one BLAS thread (a worker per core, as a rank per core: idle BLAS threads spin).
# PYTHONDONTWRITEBYTECODE is emptied: the hundreds of Python processes the tests start (ranks, CLI runs)
# read compiled modules instead of compiling the package again each. In the MPI rounds each rank's BLAS
# gets cores / ranks threads (at least 1), as a sweep's ranks do: BLAS threads that outnumber the cores
# spin against each other (a PipeDream test: 7.2 s on 2 ranks, 1.5 s so). The round on 1 rank (one core,
# one BLAS thread) runs beside the serial tests, whose workers wait on launches often enough to leave it a
# core; its output follows theirs. No test times anything, and the tests' sweeps sample an unstable point
# no more (MLSCALE_MAX_POINT_SECONDS=0: the tests check results, not stability; the tests of the
# resampling give --max-point-seconds themselves) and take no memory probe (MLSCALE_MEMORY_PROBE=0: a GEMV
# loop a second; the probe's tests turn it on).
MPI_ROUND = PYTHONDONTWRITEBYTECODE= MLSCALE_MEMORY_PROBE=0 timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n \
	$(PY) -m mpi4py -m pytest --with-mpi -m mpi -x -q -p no:cacheprovider -p no:xdist

test: $(STAMP)
	@one=$$(mktemp); status=0; \
	if [ -n "$(filter 1,$(TEST_RANKS))" ]; then \
	  n=1; OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(MPI_ROUND) > $$one 2>&1 & beside=$$!; \
	fi; \
	PYTHONDONTWRITEBYTECODE= MLSCALE_MAX_POINT_SECONDS=0 MLSCALE_MEMORY_PROBE=0 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
	  $(PY) -m pytest -m "not mpi" -p no:cacheprovider -q -rs -n $(NPROC) --dist loadgroup || status=1; \
	if [ -n "$${beside:-}" ]; then \
	  wait $$beside || status=1; echo "== MPI tests on 1 ranks (beside the serial tests)"; cat $$one; \
	fi; \
	rm -f $$one; [ $$status = 0 ] || exit 1; \
	for n in $(filter-out 1,$(TEST_RANKS)); do \
	  echo "== MPI tests on $$n ranks"; \
	  threads=$$(( $(NPROC) / $$n > 0 ? $(NPROC) / $$n : 1 )); \
	  OPENBLAS_NUM_THREADS=$$threads OMP_NUM_THREADS=$$threads $(MPI_ROUND) || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info
