"""A third build target, for the tests only: the whole of its build side, in one file.

It runs on the host (torch reaches the fake device through the CPU, and it borrows the cpu
target's compile options), but it has its own name, device, runner, container, index variant,
[build.fake] section, flag and runtime module (``_target_fake.py``, beside it), and records none
of the CPU's facts (no instruction set, no oneDNN cap): shared code that assumes a CPU wheel
fails its tests. tests/test_targets.py registers it as an installed package
would (a ``modelwheel.targets`` entry point) and builds, lists, installs and loads it: no file
of pipeline/ or templates/ names it.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from pipeline.services.frozen import Frozen
from pipeline.targets import cpu

NAME = "fake"
DEVICE = "fake"  # what its wheels record and load(device=) names
TORCH_DEVICE = cpu.DEVICE  # torch reaches the fake device through the host's
REFERENCE = "eager, on the fake device"
RELOCATABLE = True
SHARED_CONSTANTS = True
COMPILES_IN_FORKS = True
COMPILE_GUESS_S = cpu.COMPILE_GUESS_S
RUNNER: str | list[str] = ["self-hosted", "fake-accelerator"]
CONTAINER = "registry.example.org/fake-builder:1"
CONTAINER_OPTIONS = "--device /dev/fake0"
TORCH_VARIANT = cpu.TORCH_VARIANT  # its torch is the CPU build
RUNTIME_FILE = Path(__file__).with_name("_target_fake.py")
BF16_SLOW = "the fake device has no bfloat16"
_chosen = {"label": "plain"}


class BUILD_OPTIONS(Frozen):  # noqa: N801
    """The spec's [build.fake] section."""

    label: str = Field("plain", pattern=r"^[a-z]+$", description="a word the manifest records")


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        parser.add_argument("--fake-label", default=None, help="the fake target's label (default: [build.fake] label)")
    ]


def before_torch(options: BUILD_OPTIONS, args: argparse.Namespace) -> None:
    _chosen["label"] = getattr(args, "fake_label", None) or options.label


def unavailable() -> str | None:
    return None


def compile_options(spec: Any) -> dict[str, object]:
    return cpu.compile_options(spec)


def packed_constant(tensor: Any) -> tuple[bytes, dict[str, Any]] | None:
    return cpu.packed_constant(tensor)  # its compiles are the cpu target's, and so are its packed weights


def graph_passes(options: Mapping[str, object]) -> dict[str, object]:
    return {}


def ships(path: Path, options: Mapping[str, object]) -> bool:
    return path.suffix == ".so"


def key_facts(compile_dir: Path) -> tuple[str, ...]:
    return (NAME,)


def machine() -> str:
    return f"fake|{platform.machine()}"


def rebuild(manifest: Any) -> Any:
    from pipeline.targets.views import Rebuild

    label = manifest.get("fake", {}).get("label", "plain")
    return Rebuild(said=f"fake label {label}", must_match="the fake device", arguments={"fake_label": label})


def index_variant() -> str:
    return "fake"


def provided_libraries() -> set[str]:
    return set()


def bf16_native() -> bool:
    return False


def manifest_facts(compiled: Any) -> dict[str, Any]:
    """Its own facts only: a shared check that reads a CPU's (cpu_capability) finds none here."""
    return {
        "platform": {"machine": platform.machine(), "glibc": platform.libc_ver()[1]},
        "fake": {"label": _chosen["label"]},
    }


def where_it_runs(manifest: Any) -> str:
    return f"the fake device, label {manifest['fake']['label']}"


def synchronize() -> None:
    pass
