# Entry points: `make build MODEL=unet`, `make test`. Both create .venv with the pinned
# toolchain (requirements.txt) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
MODEL  ?= unet
SPEC   ?= models/$(MODEL)/spec.toml
ARGS   ?=

.PHONY: build test test-slow venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

build: venv
	$(PY) -m pipeline build --spec $(SPEC) $(ARGS)

test: venv
	$(PY) -m pytest -q $(ARGS)

test-slow: venv
	$(PY) -m pytest -q -m slow $(ARGS)

clean:
	rm -rf build dist
