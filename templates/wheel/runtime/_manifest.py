"""The build manifest, the machine check and where the artifacts load from.

Imports nothing heavy (no torch, no numpy): both loaders use it, and ``load_numpy()`` must start
without importing torch.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import warnings
from pathlib import Path
from typing import cast

from . import _schema
from ._integrity import IntegrityError
from ._schema import Manifest
from ._targets import variant
from ._link import ensure_link, sweep_dangling
from ._trust import UntrustedPath

PACKAGE_DIR = Path(__file__).resolve().parent
ARTIFACTS_DIR = PACKAGE_DIR / "artifacts"
# Inductor's CPU code needs at least the vector ISA it was built for; ATen picks its own at run time.
CPU_CAPABILITY_ORDER = ["DEFAULT", "AVX2", "AVX512"]
NAMED_CPU_KINDS = ("AVX2", "AVX512")  # the kinds `modelwheel build --cpu-isa` builds for by name
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
            found = _schema.problems(data)
        except (OSError, ValueError) as exc:
            found = [f"{type(exc).__name__}: {exc}"]
        if found:
            name = PACKAGE_DIR.name.replace("_", "-")
            raise IntegrityError(f"{path} is unreadable or corrupt ({'; '.join(found[:3])}): the installed package is "
                                 f"damaged; reinstall it (pip install --force-reinstall {name})")
        _manifest = cast(Manifest, data)
    return _manifest


def incompatibilities(m: Manifest, torch_version: str, cpu_capability: str) -> list[str]:
    """Each way this process differs from what the model was built for, with what fixes it."""
    problems = []
    if torch_version != m["torch"]["version"]:
        index = f"{TORCH_INDEX}/{variant(m)}"
        problems.append(f"torch is {torch_version}, the model was built with torch {m['torch']['version']}: install the "
                        f"wheel built for this torch, or `pip install torch=={m['torch']['distribution']}` from {index}")
    if platform.machine() != m["platform"]["machine"]:
        problems.append(f"this machine is {platform.machine()}, the model was built for {m['platform']['machine']}: "
                        f"install the wheel built for {platform.machine()}")
    needed = m["platform"].get("cpu_capability")  # CPU kernels only; a CUDA wheel's GPU is checked by _target_cuda.py
    if needed is not None and _lacks(cpu_capability, needed):
        problems.append(_cpu_kind_problem(cpu_capability, needed))
    return problems


def _cpu_kind_problem(have: str, needed: str) -> str:
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "")
    why = (f"torch runs {have} kernels here, as ATEN_CPU_CAPABILITY={forced} asks" if forced.upper() == have
           else f"this CPU supports {have}")
    # `modelwheel build --cpu-isa` names avx2 and avx512; a wheel for a CPU below AVX2 is built on one.
    wheel = (f"a wheel built for {have.lower()} (modelwheel build --cpu-isa {have.lower()})" if have in NAMED_CPU_KINDS
             else f"a wheel built on a CPU without {CPU_CAPABILITY_ORDER[1]} (modelwheel build --cpu-isa native there)")
    fix = (f"unset ATEN_CPU_CAPABILITY, or install {wheel}" if forced.upper() == have else
           f"run it on a CPU with {needed}, or install {wheel}")
    return f"{why}, but the model's kernels were built for {needed} CPUs: {fix}"


def _lacks(have: str, needed: str) -> bool:
    if needed in CPU_CAPABILITY_ORDER and have in CPU_CAPABILITY_ORDER:
        return CPU_CAPABILITY_ORDER.index(have) < CPU_CAPABILITY_ORDER.index(needed)
    return have != needed


def check_runtime(m: Manifest, torch_version: str, cpu_capability: str, gpu_problems: list[str] = ()) -> None:
    """Raise IncompatibleRuntime listing every problem, each with its fix (``gpu_problems``: a
    CUDA wheel's, from _target_cuda.py). Where the model can run, hold oneDNN at the build's
    cap (hold_onednn_isa): this is the one gate load() and load_numpy() both pass before opening."""
    problems = incompatibilities(m, torch_version, cpu_capability) + list(gpu_problems)
    if problems:
        raise IncompatibleRuntime(f"{m['dist_name']} {m['full_version']} cannot run here: " + "; ".join(problems) + ".")
    hold_onednn_isa(m)


def hold_onednn_isa(m: Manifest) -> None:
    """Run oneDNN at the instruction set the build packed the weights for. A wheel built for a
    named CPU kind (--cpu-isa avx2: the release's portable one) holds weights in that kind's
    blocked layouts; on a CPU with more (AVX-512), an uncapped oneDNN picks its own kernels and
    reorders every packed weight on every call: 6x slower than eager on the unet. oneDNN reads
    the cap once, at its first use in the process, so a process that ran oneDNN before this
    (eager convolutions) keeps its own: set ONEDNN_MAX_CPU_ISA before it starts (docs:
    publishing.md, "Which CPUs a wheel runs on"). A cap the user set is theirs."""
    cap = m["platform"].get("onednn_max_isa")
    if cap and not (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")):
        os.environ["ONEDNN_MAX_CPU_ISA"] = cap


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
        warnings.warn(f"{m['dist_name']}: {exc}; loading from {ARTIFACTS_DIR} instead", UntrustedPathWarning,
                      stacklevel=3)
        return ARTIFACTS_DIR
    if not _swept:  # once per process: links left by `pip uninstall` of other versions of this model
        _swept = True
        sweep_dangling(opt_path.parents[1], PACKAGE_DIR.name)
    if ok:
        return opt_path
    # Expected on a read-only root or as a non-root user: not worth a warning on every start.
    log.debug("%s: %s; loading from %s (`%s link` with write access makes the link)", m["dist_name"], detail,
              ARTIFACTS_DIR, m["dist_name"])
    return ARTIFACTS_DIR
