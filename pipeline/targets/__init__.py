"""What differs between build targets (CPU, CUDA), behind one interface.

Each target is a module (``cpu.py``, ``cuda.py``) offering what ``Target`` declares: PEP 544
lets a module satisfy a Protocol, as cibuildwheel's ``platforms/`` modules do. The rest of the
pipeline asks ``get(name)`` and never tests a target's name, so a third target (ROCm, say) is
one new module and one registry entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import SpecError, TargetUnavailableError
from . import cpu, cuda

if TYPE_CHECKING:
    from ..compile import Compiled
    from ..spec import Spec


class Target(Protocol):
    NAME: str
    DEVICE: str  # where export, the eager reference and the compiled model run
    REFERENCE: str  # what verification compares with, as the report and manifest name it
    # Whether a compiled folder still runs after it is copied elsewhere; CUDA kernels are found
    # by the absolute path they were compiled at, so a CUDA .so is compiled where it ships from.
    RELOCATABLE: bool
    # Whether the models of a build with static batch sizes can share one constants store (constants.py)
    # instead of each .so embedding the weights.
    SHARED_CONSTANTS: bool
    # The release workflow's job for this target (``pipeline matrix``): the runner label, the
    # container image it builds in ("" for none) and that container's options, and the PyTorch
    # index variant (``cpu``, ``cu130``) its torch comes from.
    RUNNER: str | list[str]
    CONTAINER: str
    CONTAINER_OPTIONS: str
    TORCH_VARIANT: str

    def unavailable(self) -> str | None:
        """Why this machine cannot build the target (naming what is missing), or None."""

    def compile_options(self, spec: Spec) -> dict[str, object]:
        """Inductor options the target adds to the spec's own."""

    def graph_passes(self, options: Mapping[str, object]) -> dict[str, object]:
        """Inductor's graph-pass hooks for a compile with these options: objects, so kept out of the
        options that cache keys and the manifest record (``key_facts`` carries their version)."""

    def ships(self, path: Path, options: Mapping[str, object]) -> bool:
        """Whether a file AOTInductor wrote goes into the wheel (else it is kept with the sources)."""

    def key_facts(self, compile_dir: Path) -> tuple[str, ...]:
        """What the compiled files depend on beyond the model, options, torch and compiler."""

    def machine(self) -> str:
        """The build machine's facts a cached wheel must match to be reused."""

    def variant(self, cuda_version: str | None) -> str:
        """The wheel's local-label prefix and its index: ``cpu``, ``cu130``."""

    def manifest_facts(self, compiled: Compiled) -> dict[str, Any]:
        """Top-level manifest entries describing what the wheel needs to run."""

    def open_runner(self, library: Path, num_models: int = 1, kernels: Path | None = None) -> Any:
        """The compiled model as the wheel opens it (for verification and timing); ``kernels``:
        where its kernel files are, when not beside ``library`` (a /proc/self/fd path)."""

    def reference(self) -> AbstractContextManager[None]:
        """Settings the eager reference runs under."""

    def synchronize(self) -> None:
        """Wait for queued device work (around every timing)."""


TARGETS: dict[str, ModuleType] = {"cpu": cpu, "cuda": cuda}


def get(name: str) -> Target:
    try:
        return TARGETS[name]  # type: ignore[return-value]  # a module satisfying the Protocol
    except KeyError:
        raise SpecError(f"unknown target {name!r}", f"choose from {', '.join(sorted(TARGETS))}") from None


def require_available(names: list[str]) -> None:
    """Refuse, before anything is written, a target this machine cannot build."""
    for name in names:
        reason = get(name).unavailable()
        if reason:
            others = [t for t in TARGETS if t != name and get(t).unavailable() is None]
            raise TargetUnavailableError(
                f"cannot build target {name!r} here: {reason}",
                f"build it on a machine that has what is missing{f', or build {others[0]!r} here with --target {others[0]}' if others else ''}",
            )
