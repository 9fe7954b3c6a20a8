"""Where the wheel template lives, and the runtime code the pipeline shares with every wheel.

The runtime modules load on first use (``templates.wheel_inputs``): some import torch or numpy,
and commands that need neither (``publish``, ``matrix``) must start without them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

# Installed, the template is package data (pyproject.toml maps templates/wheel to
# pipeline/wheel_template); in a checkout it is the top-level templates/wheel.
_PACKAGE = Path(__file__).resolve().parents[1]  # pipeline/ (this file is pipeline/services/templates.py)
_INSTALLED = _PACKAGE / "wheel_template"
WHEEL_TEMPLATE = _INSTALLED if _INSTALLED.is_dir() else _PACKAGE.parent / "templates" / "wheel"
RUNTIME_DIR = WHEEL_TEMPLATE / "runtime"

# The same code makes the example inputs at build time and inside the installed wheel:
# attribute name -> the runtime module it is.
SHARED = {
    "wheel_inputs": "_inputs", "wheel_compare": "_compare", "wheel_integrity": "_integrity",
    "wheel_weights": "_weights", "wheel_cuda": "_target_cuda", "wheel_targets": "_targets", "wheel_preload": "_preload", "wheel_malloc": "_malloc",
    "wheel_dispatch": "_dispatch", "wheel_constants": "_constants", "wheel_trust": "_trust",
}


# Runtime modules the shared ones import relatively (``from ._deps import require``): loaded
# under the name that import looks for here, pipeline.<name>. One may import those listed
# before it (_integrity imports _trust), which are loaded first.
RELATIVE_IMPORTS = ("_deps", "_trust", "_malloc", "_integrity")


def _load_runtime_module(name: str) -> ModuleType:
    if name in RELATIVE_IMPORTS:
        for earlier in RELATIVE_IMPORTS[:RELATIVE_IMPORTS.index(name)]:
            _load(f"pipeline.{earlier}", RUNTIME_DIR / f"{earlier}.py", helpers=False)
    qualified = f"pipeline.{name}" if name in RELATIVE_IMPORTS else f"pipeline._wheel_{name.lstrip('_')}"
    return _load(qualified, RUNTIME_DIR / f"{name}.py", helpers=name not in RELATIVE_IMPORTS)


def runtime_target(name: str, path: Path) -> ModuleType:
    """A target's runtime-side module (the wheel's _target_<name>.py), from its file."""
    return _load(f"pipeline._wheel_target_{name}", path, helpers=True)


def _load(qualified: str, path: Path, helpers: bool) -> ModuleType:
    if qualified in sys.modules:
        return sys.modules[qualified]
    if helpers:  # the helpers import only helpers listed before them (_load_runtime_module)
        for helper in RELATIVE_IMPORTS:
            _load_runtime_module(helper)
    spec = importlib.util.spec_from_file_location(qualified, path)
    assert spec is not None and spec.loader is not None  # the file ships with this repository
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module


def __getattr__(name: str) -> ModuleType:
    if name in SHARED:
        module = _load_runtime_module(SHARED[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
