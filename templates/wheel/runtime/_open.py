"""The load sequence ``load()`` and ``load_numpy()`` share, after each has checked what only it
needs: the machine gate, where the artifacts load from, their hashes, and the shared constants.

Imports neither torch nor numpy: the caller hands in torch's version and its target's problems
(load_numpy() reads them without importing torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import _dispatch
from ._constants import Store
from ._integrity import check_artifacts, check_files
from ._manifest import PACKAGE_DIR, artifacts_dir, check_runtime
from ._schema import Manifest
from ._targets import RuntimeTarget, constant_layouts


@dataclass(frozen=True)
class Checked:
    """What a loader opens, each file checked against the manifest (each .so as it is opened)."""

    directory: Path  # where the artifacts load from: this package's, or a CUDA wheel's /opt link
    library: Path  # the dynamic model's .so
    static: dict[int, Path]  # each static batch size's .so
    store: Store | None  # the static sizes' shared constants, mapped (None: the .so files hold them)


def checked(m: Manifest, torch_version: str, target: RuntimeTarget, target_problems: list[str]) -> Checked:
    """Raise IncompatibleRuntime or IntegrityError before anything is opened; ``target_problems``:
    the wheel's target's own (runtime/_targets.py's problems_here)."""
    check_runtime(m, torch_version, target_problems)
    target.before_open(m)  # the target's own set-up of the process (a CPU wheel's oneDNN cap)
    directory = artifacts_dir()
    check_artifacts(directory, m, skip=_dispatch.library_names(m))  # each .so is checked as it is opened
    store = None
    if m.get("constants"):  # static batch sizes: the models' constants, shared, outside the .so files
        check_files(PACKAGE_DIR, m["constants"])
        store = Store(PACKAGE_DIR, constant_layouts(target))
    return Checked(directory, directory / m["library"], _dispatch.static_libraries(m, directory), store)
