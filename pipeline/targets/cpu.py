"""The CPU target: a .so of C++ kernels that runs from any folder on any machine with at least
the vector ISA it was compiled for."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import conv_prepack
from ..templates import wheel_malloc, wheel_preload

if TYPE_CHECKING:
    from ..compile import Compiled
    from ..spec import Spec

NAME = "cpu"
DEVICE = "cpu"
REFERENCE = "eager"  # what verification compares with
RELOCATABLE = True
SHARED_CONSTANTS = True
DYNAMIC_THREADS_OPTION = "cpp.dynamic_threads"
SCHEDULE_THREADS_OPTION = "cpp.threads"
# The thread count Inductor plans its loops for, whatever the build machine has: which loops of a
# kernel are split among threads is decided at compile time, from this count.
SCHEDULE_THREADS = 8
# Inductor's name for the vector ISA -> the torch CPU capability the kernels need at run time.
VEC_ISA_CAPABILITY = {"avx512": "AVX512", "avx2": "AVX2", "none": "DEFAULT"}


def unavailable() -> str | None:
    return None


def compile_options(spec: Spec) -> dict[str, object]:
    # Inductor otherwise sizes a parallel reduction's per-thread partial results by the build
    # machine's thread count, while the loop runs on every thread the serving process has: a
    # model compiled with 2 threads wrote past those arrays and crashed when run with 8.
    options: dict[str, object] = {DYNAMIC_THREADS_OPTION: True}
    # Planned for the build's 2 threads, a kernel whose outer loop is the batch (a group norm)
    # split only that loop among threads, and at batch 1 ran on one. With the thread count fixed
    # (dynamic threads turned off) this option would be that count, so it is left out then.
    if spec.compile.inductor.get(DYNAMIC_THREADS_OPTION, True):
        options[SCHEDULE_THREADS_OPTION] = SCHEDULE_THREADS
    return options


def graph_passes(options: Mapping[str, object]) -> dict[str, object]:
    # Only freezing makes weights constants that can be packed at compile time.
    return conv_prepack.inductor_options() if options.get("freezing") else {}


def ships(path: Path, options: Mapping[str, object]) -> bool:
    return path.suffix == ".so"


def vec_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa()) or "none"


def key_facts(compile_dir: Path) -> tuple[str, ...]:
    return (vec_isa(), conv_prepack.VERSION)


def machine() -> str:
    return torch.backends.cpu.get_cpu_capability()


def variant(cuda_version: str | None) -> str:
    return NAME


def manifest_facts(compiled: Compiled) -> dict[str, Any]:
    isa = vec_isa()
    return {
        "platform": {
            "machine": platform.machine(),
            "vec_isa": isa,
            "cpu_capability": VEC_ISA_CAPABILITY.get(isa, torch.backends.cpu.get_cpu_capability()),
            "glibc": platform.libc_ver()[1],
        },
    }


def open_runner(library: Path, num_models: int = 1) -> Any:
    """The .so opened as the wheel's load() opens it, so what the build times and verifies is what ships."""
    wheel_preload.load_cxx_runtime()
    wheel_malloc.keep_freed_memory()
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), num_models)


@contextlib.contextmanager
def reference() -> Iterator[None]:
    yield


def synchronize() -> None:
    pass
