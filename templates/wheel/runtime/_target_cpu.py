"""The runtime side of the CPU target (_targets.py): a .so of C++ kernels that runs from any
folder, on the host, through torch's CPU runner or load_numpy()'s C interface.

Shared with the build (pipeline/targets/cpu.py opens the model it verifies and times through
this file, so what the build checks is what the wheel runs). Imports torch only when opening.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ._malloc import keep_freed_memory

RELOCATABLE = True  # runs from wherever the wheel is installed; writes nothing outside it
NUMPY = True  # load_numpy() can open it without torch


def device(asked: str | None) -> str:
    if asked is not None and asked != "cpu":
        raise ValueError(f"device {asked!r}: this wheel is a CPU build; install its CUDA wheel to run on a GPU")
    return "cpu"


def problems_here(m: dict[str, Any], device: str) -> list[str]:
    """The CPU's own needs (its vector ISA) are checked by _manifest.check_runtime for every target."""
    return []


def open_runner(library: Path, kernel_dir: Path, device: str, num_models: int) -> Any:
    """``kernel_dir`` is unused: a CPU .so has no kernel files beside it."""
    import torch

    keep_freed_memory()  # each call's buffers reused, not faulted in again: see _malloc.py
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), num_models)


def graphs_off(asked: bool | None) -> str | None:
    """A CPU build runs without CUDA graphs; asking for them is an error."""
    if asked:
        raise ValueError("cuda_graphs=True: this wheel is a CPU build; CUDA graphs need its CUDA wheel")
    return "a CPU build"


def reference() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()
