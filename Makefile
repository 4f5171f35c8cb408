# Quick start: `make serve` (the recommendation service on 127.0.0.1:8000, FICCO_PORT to change it) and
# `make test`. docs/install.md: pip install per use, the image, the time each step takes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: serve test test-all test-gpu image lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24,<27"

# torch for the tests (the [test] extra's pin): where no GPU is present (no nvidia-smi) the CPU build from
# PyTorch's CPU wheel index, installed first, so that nothing pulls the CUDA build (PyPI's Linux torch wheels
# bring some 3 GB of nvidia-* wheels); with a GPU, from the index pip is set up with. TORCH_INDEX= forces the
# latter. Fewer retries than pip's 5: an index that cannot be reached is given up in seconds, not minutes.
TORCH := torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(TORCH_CPU_INDEX))

# One stamp per extra: the service needs no torch; the tests bring torch (above).
$(VENV)/.service-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[service]"
	touch $@

$(VENV)/.torch-installed: | $(BIN)/python
	$(BIN)/pip install -q --retries 2 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	touch $@

$(VENV)/.test-installed: pyproject.toml $(VENV)/.torch-installed | $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"
	touch $@ $(VENV)/.service-installed

serve: $(VENV)/.service-installed
	@echo "make serve: ficco is installed in $(VENV)/bin; \`. $(VENV)/bin/activate\` puts it on PATH in another shell"
	$(BIN)/ficco serve

# CI's suite: everything but the tests marked heavy (end-to-end runs of over about 10 s each), so that it stays
# under 10 minutes on 2 cores; `make test-all` runs those too (about 30 minutes on 2 cores).
test: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n auto --maxprocesses 4 --dist loadfile -m "not heavy"

test-all: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n auto --maxprocesses 4 --dist loadfile

# On a machine with CUDA GPUs (CUDA torch installed): with >= 2, every schedule eager and graph-captured against
# serial and a smoke sweep; with one, the expert GEMMs and the loopback worlds of 2, 4 and 8 ranks.
test-gpu:
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 $(PYTHON) -m pytest -m gpu tests/gpu

# The service image (Dockerfile): build it, start it on a free loopback port, wait for /readyz, stop it.
# Needs docker or podman (buildah builds but cannot start it); IMAGE names the tag.
IMAGE ?= ficco-service
image:
	@engine=; for e in docker podman; do \
		if command -v $$e >/dev/null; then \
			if $$e info >/dev/null 2>&1; then engine=$$e; break; fi; \
			echo "make image: $$e is installed but does not answer ($$e info fails: is its daemon running?)" >&2; \
		fi; \
	done; \
	if [ -z "$$engine" ]; then \
		if command -v buildah >/dev/null; then \
			buildah bud -t $(IMAGE) . && echo "make image: built $(IMAGE) with buildah, which cannot start it;" \
				"run it with docker or podman: <engine> run --rm -p 8000:8000 $(IMAGE)"; exit $$?; \
		fi; \
		echo "make image: no usable container engine here (docker, podman or buildah); install one. Without" \
			"one, tests/ficco/test_packaging.py builds the wheel from the same build context and serves it." >&2; \
		exit 1; \
	fi; \
	set -e; $$engine build -t $(IMAGE) .; \
	port=$$($(PYTHON) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	container=$$($$engine run -d --rm -p 127.0.0.1:$$port:8000 $(IMAGE)); \
	trap "$$engine stop $$container >/dev/null" EXIT; \
	for i in $$(seq 60); do \
		if curl -fsS http://127.0.0.1:$$port/readyz; then echo; echo "make image: $(IMAGE) ready on port $$port"; exit 0; fi; \
		sleep 1; \
	done; \
	$$engine logs $$container >&2; echo "make image: $(IMAGE) not ready after 60 s" >&2; exit 1

lint: $(VENV)/.test-installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
