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

# The default sweep: point-to-point and allreduce on 1..nproc ranks, small sizes.
sweep: $(STAMP)
	$(VENV)/bin/mlscale sweep p2p --np 2 --sizes 8:1M --csv $(RESULTS)/p2p.csv
	$(VENV)/bin/mlscale sweep allreduce --np $(NPROC) --ranks 1:$(NPROC) --sizes 8:4M --csv $(RESULTS)/allreduce.csv
	$(VENV)/bin/mlscale calibrate --out $(RESULTS)/calib.json
	$(VENV)/bin/mlscale report $(RESULTS)/p2p.csv $(RESULTS)/allreduce.csv --out $(REPORT) \
	  --model $(RESULTS)/calib.json --project 64,256,1024

# -rs: say why a test was skipped (the Slurm cluster test needs Slurm: .ci/run installs it).
# PYTHONDONTWRITEBYTECODE is emptied: the hundreds of Python processes the tests start (ranks, CLI runs)
# read compiled modules instead of compiling the package again each. Rounds that oversubscribe the cores
# (more ranks than cores) have MPICH's waiting ranks sleep instead of spin (MPIR_CVAR_ENABLE_HEAVY_YIELD),
# leaving the cores to the ranks with work; no test times anything.
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m "not mpi" -p no:cacheprovider -q -rs
	for n in $(TEST_RANKS); do \
	  echo "== MPI tests on $$n ranks"; \
	  if [ $$n -gt $(NPROC) ]; then yield=1; else yield=0; fi; \
	  PYTHONDONTWRITEBYTECODE= MPIR_CVAR_ENABLE_HEAVY_YIELD=$$yield timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n \
	    $(PY) -m mpi4py -m pytest --with-mpi -m mpi -x -q -p no:cacheprovider || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info
