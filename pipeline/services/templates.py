"""Where the wheel template lives, and the target modules of its runtime.

The runtime is a package of its own, ``pipeline.wheel_template.runtime`` (templates/wheel/runtime;
in a checkout ``pipeline/wheel_template`` links to templates/wheel, and an installed modelwheel
carries it there as package data). The build imports it like any other package, and packaging
copies its files into each wheel under the wheel's own module name: its modules import one
another relatively, so they run the same under either name. Its package imports neither torch
nor numpy (commands that need neither, ``publish`` and ``matrix``, start without them).
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

from ..wheel_template import runtime
from ..wheel_template.runtime import _targets

RUNTIME_DIR = Path(runtime.__file__).parent
WHEEL_TEMPLATE = RUNTIME_DIR.parent


@cache
def runtime_target(name: str, path: Path) -> ModuleType:
    """A target's runtime-side module (the wheel's _target_<name>.py), as a module of the runtime
    package, as the wheel ships it: a built-in target's is imported; one from outside this
    repository (an entry point's ``RUNTIME_FILE``) is run from its file under that name."""
    qualified = f"{runtime.__name__}.{_targets.module_name(name)}"
    if path.resolve() == (RUNTIME_DIR / f"{_targets.module_name(name)}.py").resolve():
        return importlib.import_module(qualified)
    spec = importlib.util.spec_from_file_location(qualified, path)
    assert spec is not None and spec.loader is not None  # RUNTIME_FILE names a .py file
    module = importlib.util.module_from_spec(spec)  # its relative imports reach the runtime package
    spec.loader.exec_module(module)
    return module
