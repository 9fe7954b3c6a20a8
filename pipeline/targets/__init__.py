"""What differs between build targets (CPU, CUDA), behind one interface and one registry.

A target is one module on each side: here, what the build does differently (``cpu.py``,
``cuda.py``), in four parts (Setup, Compiling, Packaging, Running); and in the wheel's runtime,
how the model loads (``RUNTIME_FILE``: templates/wheel/runtime/_target_<name>.py). PEP 544 lets
a module satisfy a Protocol, as cibuildwheel's ``platforms/`` modules do. What only one target
knows (a CPU's instruction set and oneDNN cap, a GPU's architecture) stays in its two modules.
The registry below is the only list of target names: the spec, the command line, the release
matrix, the manifest, the benchmarks and the Makefile ask it (tests/test_targets.py holds
pipeline/ and templates/ to naming no target outside the target modules).

A target from outside this repository registers under the ``modelwheel.targets`` entry-point
group (``name = "package.module"``); its runtime file ships in the wheels it builds.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from ..errors import SpecError, TargetUnavailableError
from ..services.templates import runtime_target
from ..wheel_template.runtime import _preload as wheel_preload
from . import cpu, cuda
from .views import CompiledFiles, Rebuild, SpecKeys

ENTRY_POINT_GROUP = "modelwheel.targets"


class Setup(Protocol):
    """What building for the target needs: its spec section and flags, the process and machine it
    builds on, and the release workflow's job for it (``modelwheel matrix``)."""

    NAME: str
    # The release job: the runner label, the container image it builds in ("" for none) and that
    # container's options, and the PyTorch index variant (``cpu``, ``cu130``) its torch comes from.
    # A target may also define ``runner_missing() -> str | None``: why this machine cannot run its
    # job on itself (a local run under act, no container), asked without torch; the matrix then
    # leaves the job out.
    RUNNER: str | list[str]
    CONTAINER: str
    CONTAINER_OPTIONS: str
    TORCH_VARIANT: str

    @property
    def BUILD_OPTIONS(self) -> type[BaseModel]:  # noqa: N802  # a module's class: read-only, so a subclass fits
        """The spec's [build.<NAME>] section: its keys, defaults and checks."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """Command-line flags of its own for ``modelwheel build`` (what add_argument returned)."""

    def before_torch(self, options: Any, args: argparse.Namespace) -> None:
        """Set up the process for a build of this target before torch is imported."""

    def unavailable(self) -> str | None:
        """Why this machine cannot build the target (naming what is missing), or None."""

    def machine(self) -> str:
        """The build machine's facts a cached wheel must match to be reused."""

    def rebuild(self, manifest: Mapping[str, Any]) -> Rebuild:
        """How ``modelwheel reproduce`` builds again the wheel this manifest describes."""


class Compiling(Protocol):
    """What compiling for the target adds to the spec's own options, and what the result depends on."""

    # Whether the models of a build with static batch sizes can share one constants store (constants.py)
    # instead of each .so embedding the weights.
    SHARED_CONSTANTS: bool
    BF16_SLOW: str  # why bfloat16 autocast is not tried where the device has no native bfloat16
    # Whether the option search may compile candidates side by side in forked workers: a forked
    # process cannot use an accelerator its parent has initialised (CUDA refuses to, after a fork).
    COMPILES_IN_FORKS: bool
    # A first build's guess at one plain compile, before anything of the model was timed here:
    # (seconds for any graph, seconds per operator of the exported graph), features/first_guess.py.
    COMPILE_GUESS_S: tuple[float, float]

    def packed_constant(self, tensor: Any) -> tuple[bytes, dict[str, Any]] | None:
        """A compiled constant (a torch.Tensor) in a layout of the target's own, as the shared
        constants store keeps it: its bytes and its entry (``layout``, the name its runtime module's
        CONSTANT_LAYOUTS gives the shim's function; ``dtype``, ``shape``, ``stride``, ``offset``;
        ``md``: bytes that describe the layout). None for a strided tensor, which the store reads
        itself. Asked only where SHARED_CONSTANTS."""

    def compile_options(self, spec: SpecKeys) -> dict[str, object]:
        """Inductor options the target adds to the spec's own."""

    def graph_passes(self, options: Mapping[str, object]) -> dict[str, object]:
        """Inductor's graph-pass hooks for a compile with these options: objects, so kept out of the
        options that cache keys and the manifest record (``key_facts`` carries their version)."""

    def key_facts(self, compile_dir: Path) -> tuple[str, ...]:
        """What the compiled files depend on beyond the model, options, torch and compiler."""

    def bf16_native(self) -> bool:
        """Whether the device runs bfloat16 natively (else autocast would only slow it down)."""


class Packaging(Protocol):
    """What goes into the target's wheels: files, the manifest's facts, the runtime module."""

    # Whether a compiled folder still runs after it is copied elsewhere; CUDA kernels are found
    # by the absolute path they were compiled at, so a CUDA .so is compiled where it ships from.
    RELOCATABLE: bool
    RUNTIME_FILE: Path  # the wheel's side of the target (runtime/_targets.py's RuntimeTarget)

    def ships(self, path: Path, options: Mapping[str, object]) -> bool:
        """Whether a file AOTInductor wrote goes into the wheel (else it is kept with the sources)."""

    def index_variant(self) -> str:
        """The wheel's local-label prefix and its index, from the running torch: ``cpu``, ``cu130``."""

    def provided_libraries(self) -> set[str]:
        """Shared libraries the target's torch brings beyond torch/lib (the nvidia-* packages')."""

    def manifest_facts(self, compiled: CompiledFiles) -> dict[str, Any]:
        """Top-level manifest entries describing what the wheel needs to run: the target's own
        facts (a CPU's instruction set, a GPU's architecture), which only its runtime module reads."""

    def where_it_runs(self, manifest: Mapping[str, Any]) -> str:
        """Which machines a wheel of this manifest runs on, in words: the build's summary says it
        before the wheel is published, as its runtime module's does in ``info``."""


class Running(Protocol):
    """Where the model runs, on the build machine (export, verification, timing) and in the wheel."""

    DEVICE: str  # the device its wheels run on, as the manifest records it
    # torch's device kind the build runs the model on: export, the eager reference, the compiled
    # model. The same as DEVICE but for a device torch reaches through another (the tests' fake one).
    TORCH_DEVICE: str
    REFERENCE: str  # what verification compares with, as the report and manifest name it

    def synchronize(self) -> None:
        """Wait for queued device work (around every timing)."""


class Target(Setup, Compiling, Packaging, Running, Protocol):
    """A build target: one module (PEP 544 lets a module satisfy a Protocol), in four parts. A
    stage that needs one part takes that part (``Compiling``), not the whole target."""


# Each module checked against the protocol by the type checker, as it is assigned.
_CPU: Target = cpu
_CUDA: Target = cuda
BUILT_IN: tuple[Target, ...] = (_CPU, _CUDA)
DEFAULT = cpu.NAME  # what a spec without [build] targets builds


@cache
def registry() -> dict[str, Target]:
    """Name -> target: the built-in ones, then those installed packages register."""
    found: dict[str, Target] = {target.NAME: target for target in BUILT_IN}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        module: Target = importlib.import_module(entry.value)  # checked below
        missing = [name for name in _ATTRIBUTES if not hasattr(module, name)]
        missing += [name for name in _METHODS if not callable(getattr(module, name, None))]
        if missing or module.NAME != entry.name or module.NAME in found:
            raise SpecError(
                f"target {entry.name!r} ({entry.value}, entry point group {ENTRY_POINT_GROUP}) is not a "
                f"target: "
                + (
                    f"it lacks {', '.join(missing)}"
                    if missing
                    else f"its NAME is {module.NAME!r}, or another target has that name"
                ),
                "see pipeline/targets/__init__.py's Target for what a target module defines",
            )
        found[module.NAME] = module
    return found


_PARTS = (Setup, Compiling, Packaging, Running)
_ATTRIBUTES = [name for part in _PARTS for name in part.__annotations__]
_ATTRIBUTES += [name for part in _PARTS for name, value in vars(part).items() if isinstance(value, property)]
_METHODS = [
    name for part in _PARTS for name, value in vars(part).items() if callable(value) and not name.startswith("_")
]


def names() -> list[str]:
    return list(registry())


def all() -> list[Target]:  # noqa: A001  # targets.all(), as the registry reads
    return list(registry().values())


def get(name: str) -> Target:
    try:
        return registry()[name]
    except KeyError:
        raise SpecError(f"unknown target {name!r}", f"choose from {', '.join(names())}") from None


def buildable_here(spec_targets: list[str], say: Callable[[str], None]) -> list[str]:
    """A spec's own targets (no --target given) less those this machine cannot build, each said
    with why: the unet names cpu and cuda for the release, and `make build` on a machine without
    a GPU still builds its cpu wheel. Where none is left, all stay, and require_available refuses."""
    reasons = {name: get(name).unavailable() for name in spec_targets}
    left = [name for name in spec_targets if reasons[name] is None]
    if not left:
        return list(spec_targets)
    for name in spec_targets:
        if reasons[name]:
            say(
                f"note: target {name} skipped, not built on this machine: {reasons[name]} (the spec names it for "
                f"machines that have it; --target {name} asks for it)"
            )
    return left


def require_available(chosen: list[str]) -> None:
    """Refuse, before anything is written, a target this machine cannot build."""
    for name in chosen:
        reason = get(name).unavailable()
        if reason:
            others = [t for t in names() if t != name and get(t).unavailable() is None]
            raise TargetUnavailableError(
                f"cannot build target {name!r} here: {reason}",
                "install what it names in this environment, or build on a machine that has it"
                + (f"; or build {others[0]!r} here with --target {others[0]}" if others else ""),
            )


def runtime(target: Target) -> Any:
    """The target's runtime-side module (runtime/_targets.py's RuntimeTarget), loaded from the
    file the wheel ships: the build opens and checks models exactly as the wheel will."""
    return runtime_target(target.NAME, target.RUNTIME_FILE)


def open_runner(target: Target, library: Path, num_models: int = 1, kernels: Path | None = None) -> Any:
    """The compiled model as the wheel opens it (for verification and timing); ``kernels``: where
    its kernel files are, when not beside ``library`` (a /proc/self/fd path)."""
    wheel_preload.load_cxx_runtime()
    side = runtime(target)
    return side.open_runner(library, kernels or library.parent, side.device(None), num_models)


def reference(target: Target) -> AbstractContextManager[None]:
    """The settings the eager reference runs under (TF32 off on a GPU), as the wheel's verify() does."""
    reference: AbstractContextManager[None] = runtime(target).reference()
    return reference
