"""Where the wheel template lives, and the runtime code the pipeline shares with every wheel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

WHEEL_TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "wheel"
RUNTIME_DIR = WHEEL_TEMPLATE / "runtime"


def _load_runtime_module(name: str) -> ModuleType:
    qualified = f"pipeline._wheel_{name.lstrip('_')}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, RUNTIME_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None  # the file ships with this repository
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module


# The same code makes the example inputs at build time and inside the installed wheel.
wheel_inputs = _load_runtime_module("_inputs")
wheel_compare = _load_runtime_module("_compare")
wheel_integrity = _load_runtime_module("_integrity")
wheel_weights = _load_runtime_module("_weights")
wheel_cuda = _load_runtime_module("_cuda")
wheel_preload = _load_runtime_module("_preload")
wheel_malloc = _load_runtime_module("_malloc")
wheel_dispatch = _load_runtime_module("_dispatch")
wheel_constants = _load_runtime_module("_constants")
