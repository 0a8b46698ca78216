# Two targets for a fresh machine (see README): `make run` and `make test`.
# Both install what they need first, into a project virtual environment (.venv): `make run` bench (editable) with
# its runtime only (the report's plotly, the fast hot path) and the llama.cpp server + SmolLM2 model; `make test`
# adds the test and lint tools and the optional extras the tests cover (ray, gguf, history). A system Python marked
# externally managed (Debian, Ubuntu, Homebrew) is never written to.
# Override: `make PY=python3.12`, `make VENV=/path/to/venv`, `make JOBS=4`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# compilers run at once when llama.cpp is built: the cores, bounded by memory (about 1.5 GB per compiler)
JOBS ?= $(shell .ci/build-jobs)
RUNTIME := fast,report
TESTING := test,fast,report,ray,gpu,history

.PHONY: install install-test run test lint
$(VPY):
	PY=$(PY) VENV=$(VENV) .ci/make-venv

install: $(VPY)
	$(VPY) -m pip install -q -e '.[$(RUNTIME)]'
	PYTHON=$(VPY) BENCH_BUILD_JOBS=$(JOBS) .ci/install-engine

install-test: install
	$(VPY) -m pip install -q -e '.[$(TESTING)]'

run: install
	$(VPY) -m bench run --profile quick --report

lint: install-test
	$(VPY) -m ruff check .
	$(VPY) -m mypy
	$(VPY) -m mypy --strict bench

test: install-test
	$(VPY) -m pytest -q
