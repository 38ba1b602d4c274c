# The two commands of the quick start: `make up` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: up test test-fast lint venv redis

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

up: venv
	$(BIN)/pip install -q -e '.[mlx]'
	$(BIN)/kvroute up

redis:
	@command -v redis-server >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server; \
	  elif command -v brew >/dev/null; then brew install redis; \
	  else echo "please install redis-server" >&2; exit 1; fi; }

test: venv redis
	$(BIN)/pip install -q -e '.[mlx,dev]'
	$(BIN)/ruff check .
	$(BIN)/pytest

test-fast: venv
	$(BIN)/pytest -m "not slow"

lint:
	$(BIN)/ruff check .
