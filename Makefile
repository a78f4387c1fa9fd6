# The two README commands: `make run` and `make test`. Both set themselves up first.
.PHONY: setup run demo test test-fast conformance lint bench clean

setup:
	@scripts/setup.sh

# The embedded default: the runtime dependencies only (the lock, requirements.txt), and no
# Kubernetes components (make test and the lab build them); make test adds its extras.
run:
	@OVSPROXY_EXTRAS= OVSPROXY_KUBE=skip scripts/setup.sh
	.venv/bin/ovsproxy run $(ARGS)

demo: setup
	.venv/bin/ovsproxy demo $(ARGS)

# Two worker processes, a test file each (module-scoped sandboxes and labs stay shared
# within a file): the suite mostly waits on switches, kernels and traffic, not on the CPU.
# ARGS="-n 0" runs it in one process.
PYTEST_WORKERS = -n 2 --dist loadfile

test: setup
	.venv/bin/python -m pytest $(PYTEST_WORKERS) $(ARGS)

test-fast: setup
	.venv/bin/python -m pytest $(PYTEST_WORKERS) -m "not slow" $(ARGS)

# The Kubernetes Service conformance tests on the 3-node lab (root); records the endpoint
# latency figures and every test's outcome (support/suite_record.py) in bench/results.
conformance: setup
	OVSPROXY_RECORD_RESULTS=1 .venv/bin/python -m pytest tests/conformance -rxXf $(ARGS)

lint: setup
	.venv/bin/ruff check src tests bench support
	.venv/bin/ruff format --check src tests bench support
	.venv/bin/mypy

bench: setup
	.venv/bin/python -m bench all $(ARGS)

clean:
	rm -rf .venv build *.egg-info src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
