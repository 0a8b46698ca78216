# Two targets for a fresh machine (see README): `make run` and `make test`.
# Both install what they need first, into a project virtual environment (.venv): bench (editable) with its test
# tools, and the llama.cpp server + SmolLM2 model. A system Python marked externally managed (Debian, Ubuntu,
# Homebrew) is never written to. Override: `make PY=python3.12`, `make VENV=/path/to/venv`, `make JOBS=4`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# compilers run at once when llama.cpp is built: the cores, bounded by memory (about 1.5 GB per compiler)
JOBS ?= $(shell .ci/build-jobs)

.PHONY: install run test lint
$(VPY):
	PY=$(PY) VENV=$(VENV) .ci/make-venv

install: $(VPY)
	$(VPY) -m pip install -q -e '.[test,fast,ray,gpu,history]'
	PYTHON=$(VPY) BENCH_BUILD_JOBS=$(JOBS) .ci/install-engine

run: install
	$(VPY) -m bench run --profile quick --report

lint: install
	$(VPY) -m ruff check .
	$(VPY) -m mypy
	$(VPY) -m mypy --strict bench

test: install
	$(VPY) -m pytest -q
