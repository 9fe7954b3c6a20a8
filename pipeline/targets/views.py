"""What a target reads of the records above it: the spec's keys its compile options depend on,
and a compile's options and files. Structural types (PEP 544), so the targets, a layer below the
spec and the stages, name what they read without importing either: spec.py's Spec and
stages/compile.py's Compiled match them as they are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class CompileKeys(Protocol):
    @property
    def inductor(self) -> Mapping[str, bool | int | float | str]: ...

    @property
    def model_fields_set(self) -> set[str]: ...  # the keys the spec gave, not defaulted


class WeightsKeys(Protocol):
    @property
    def external(self) -> bool: ...


class BuildKeys(Protocol):
    def options(self, target: str) -> Any: ...  # the target's own [build.<target>] section


class SpecKeys(Protocol):
    """The spec's sections a target's compile options read."""

    @property
    def compile(self) -> CompileKeys: ...

    @property
    def weights(self) -> WeightsKeys: ...

    @property
    def build(self) -> BuildKeys: ...


class CompiledFiles(Protocol):
    """A compiled model as a target's manifest facts read it."""

    @property
    def options(self) -> Mapping[str, object]: ...

    @property
    def artifacts(self) -> tuple[Path, ...]: ...


@dataclass(frozen=True)
class Rebuild:
    """What ``modelwheel reproduce`` needs from the target of a wheel it rebuilds."""

    said: str  # what the rebuild runs as, in its announcement ("CPU kind avx2")
    must_match: str  # what the machine must match for the same bytes, in its hint ("the CPU kind (AVX2)")
    arguments: dict[str, object] = field(default_factory=dict)  # the target's build flags (add_arguments' dests)
