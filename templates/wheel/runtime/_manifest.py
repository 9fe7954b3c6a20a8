"""The build manifest, the machine check and where the artifacts load from.

Imports nothing heavy (no torch, no numpy): both loaders use it, and ``load_numpy()`` must start
without importing torch.
"""

from __future__ import annotations

import json
import logging
import platform
import warnings
from pathlib import Path
from typing import cast

from . import _schema
from ._integrity import IntegrityError
from ._link import ensure_link, sweep_dangling
from ._schema import Manifest
from ._targets import platform_type, variant
from ._trust import UntrustedPath

PACKAGE_DIR = Path(__file__).resolve().parent
ARTIFACTS_DIR = PACKAGE_DIR / "artifacts"
TORCH_INDEX = "https://download.pytorch.org/whl"  # one index per torch build: /cpu, /cu130

_manifest: Manifest | None = None
_swept = False
log = logging.getLogger(__name__)


class IncompatibleRuntime(RuntimeError):
    """The running torch or machine differs from the one the model was built for."""


class NativeRuntimeError(RuntimeError):
    """load_numpy(): the model's C interface reported an error, or torch's libraries could not be opened."""


class UntrustedPathWarning(UserWarning):
    """A folder on the way to the /opt link can be changed by another user: the link is neither
    made nor followed, and the model loads from this package."""


class ArtifactLinkWarning(UserWarning):
    """Kept for code that imports it; no longer issued: a load that cannot make the /opt link
    loads from the package directory, which works, and says so only in a debug log line."""


def manifest() -> Manifest:
    """The build manifest (torch version, target, inputs, tolerances, hashes), checked against its
    definition (_schema.py) once, as it is first read. Treat as read-only."""
    global _manifest
    if _manifest is None:
        path = PACKAGE_DIR / "manifest.json"
        data: object = None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            found = _schema.problems(data, platform_type(data))
        except (OSError, ValueError) as exc:
            found = [f"{type(exc).__name__}: {exc}"]
        if found:
            name = PACKAGE_DIR.name.replace("_", "-")
            raise IntegrityError(
                f"{path} is unreadable or corrupt ({'; '.join(found[:3])}): the installed package is "
                f"damaged; reinstall it (pip install --force-reinstall {name})"
            )
        _manifest = cast(Manifest, data)
    return _manifest


def incompatibilities(m: Manifest, torch_version: str) -> list[str]:
    """Each way this process differs from what the model was built for, with what fixes it: the
    torch and the machine every wheel needs (what its target needs besides: its runtime module's
    problems_here)."""
    problems = []
    if torch_version != m["torch"]["version"]:
        index = f"{TORCH_INDEX}/{variant(m)}"
        problems.append(
            f"torch is {torch_version}, the model was built with torch {m['torch']['version']}: install the "
            f"wheel built for this torch, or `pip install torch=={m['torch']['distribution']}` from {index}"
        )
    if platform.machine() != m["platform"]["machine"]:
        problems.append(
            f"this machine is {platform.machine()}, the model was built for {m['platform']['machine']}: "
            f"install the wheel built for {platform.machine()}"
        )
    return problems


def check_runtime(m: Manifest, torch_version: str, target_problems: list[str]) -> None:
    """Raise IncompatibleRuntime listing every problem, each with its fix (``target_problems``:
    the wheel's target's own, from its runtime module): the one gate load() and load_numpy() both
    pass before opening."""
    problems = incompatibilities(m, torch_version) + list(target_problems)
    if problems:
        raise IncompatibleRuntime(f"{m['dist_name']} {m['full_version']} cannot run here: " + "; ".join(problems) + ".")


def relocatable(m: Manifest) -> bool:
    """Whether the .so runs from the installed package as it is (CPU builds), as the build recorded."""
    return bool(m["relocatable"])


def artifacts_dir() -> Path:
    """Where to load from. A relocatable build loads from this package and writes nothing. A CUDA
    build loads through the /opt link where this process can make it, else from this package
    (the runtime passes the installed kernel folder as cubin_dir, so it works either way)."""
    global _swept
    m = manifest()
    if relocatable(m):
        return ARTIFACTS_DIR
    opt_path = Path(m["opt_path"])
    try:
        ok, detail = ensure_link(opt_path, ARTIFACTS_DIR)
    except UntrustedPath as exc:  # a planted folder: worth saying on every start
        warnings.warn(
            f"{m['dist_name']}: {exc}; loading from {ARTIFACTS_DIR} instead", UntrustedPathWarning, stacklevel=3
        )
        return ARTIFACTS_DIR
    if not _swept:  # once per process: links left by `pip uninstall` of other versions of this model
        _swept = True
        sweep_dangling(opt_path.parents[1], PACKAGE_DIR.name)
    if ok:
        return opt_path
    # Expected on a read-only root or as a non-root user: not worth a warning on every start.
    log.debug(
        "%s: %s; loading from %s (`%s link` with write access makes the link)",
        m["dist_name"],
        detail,
        ARTIFACTS_DIR,
        m["dist_name"],
    )
    return ARTIFACTS_DIR
