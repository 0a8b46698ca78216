# Two targets for a fresh machine (see README): `make run` and `make test`.
# Both install what they need first: bench (editable) and the llama.cpp server + SmolLM2 model.
PY ?= python3

.PHONY: install run test
install:
	$(PY) -m pip install -q -e '.[test]'
	PYTHON=$(PY) .ci/install-engine

run: install
	$(PY) -m bench run --profile quick

test: install
	$(PY) -m pytest -q
