# Quick start: `make serve` (the recommendation service on 127.0.0.1:8000) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: serve test test-gpu lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24,<27"

# One stamp per extra: the service needs no torch; the tests bring the CPU torch wheel.
$(VENV)/.service-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[service]"
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"
	touch $@ $(VENV)/.service-installed

serve: $(VENV)/.service-installed
	$(BIN)/ficco serve

test: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest

# On a machine with CUDA GPUs (CUDA torch installed): with >= 2, every schedule eager and graph-captured against
# serial and a smoke sweep; with one, the expert GEMMs and the loopback worlds of 2, 4 and 8 ranks.
test-gpu:
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 $(PYTHON) -m pytest -m gpu tests/gpu

lint: $(VENV)/.test-installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
