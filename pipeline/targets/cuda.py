"""The CUDA target: a .so plus Triton kernel files (.cubin; .fatbin and .ptx with multi_arch).

The .so records the absolute path of every kernel file, so it is compiled where it ships from
(RELOCATABLE is False) and the wheel's runtime always passes its installed kernel folder as
``cubin_dir``. Facts measured on an H100 are in shared/design-notes.md ("CUDA facts").
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..templates import wheel_cuda, wheel_preload

if TYPE_CHECKING:
    from ..compile import Compiled
    from ..spec import Spec

NAME = "cuda"
DEVICE = "cuda"
# The release workflow: a GPU runner label, a manylinux_2_28 image with the CUDA toolkit
# (PyTorch's own builder), the GPU handed to it, and the PyTorch index variant it builds against.
RUNNER: str | list[str] = ["self-hosted", "linux", "gpu"]
CONTAINER = "pytorch/manylinux2_28-builder:cuda13.0"
CONTAINER_OPTIONS = "--gpus all"
TORCH_VARIANT = "cu130"
REFERENCE = "eager, TF32 off"  # what verification compares with: see reference()
RELOCATABLE = False
# Static batch sizes keep their weights in each .so: the shared store hands constants over as CPU
# tensors (oneDNN layouts), which a CUDA model cannot take as they are.
SHARED_CONSTANTS = False
EMBED_OPTION = "aot_inductor.embed_kernel_binary"
MULTI_ARCH_OPTION = "aot_inductor.emit_multi_arch_kernel"


def unavailable() -> str | None:
    import torch

    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); building for CUDA needs "
                "a CUDA build of torch and a GPU")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: torch.cuda.is_available() is "
                "False (check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)")
    try:
        import triton  # noqa: F401  # Inductor writes the CUDA kernels in Triton
    except ImportError:
        return "triton is not installed: Inductor generates the CUDA kernels with it (pip install the triton torch names)"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "no CUDA toolkit found (nvcc on PATH or CUDA_HOME): AOTInductor compiles the model's C++ against its headers"
    return None


def compile_options(spec: Spec) -> dict[str, object]:
    return {EMBED_OPTION: spec.build.cuda.embed_kernels, MULTI_ARCH_OPTION: spec.build.cuda.multi_arch}


def graph_passes(options: Mapping[str, object]) -> dict[str, object]:
    return {}


def ships(path: Path, options: Mapping[str, object]) -> bool:
    """The .so always; the kernel files unless they are embedded in it."""
    return path.suffix == ".so" or (not options.get(EMBED_OPTION) and path.suffix in wheel_cuda.KERNEL_SUFFIXES)


def _capability() -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]


def key_facts(compile_dir: Path) -> tuple[str, ...]:
    import torch
    import triton

    major, minor = _capability()
    return (str(torch.version.cuda), f"sm_{major}{minor}", triton.__version__, str(compile_dir))


def machine() -> str:
    import torch

    major, minor = _capability()
    return f"{torch.cuda.get_device_name()}|sm_{major}{minor}|cuda {torch.version.cuda}|driver {wheel_cuda.driver_cuda_version()}"


def variant(cuda_version: str | None) -> str:
    return wheel_cuda.variant(cuda_version)


def manifest_facts(compiled: Compiled) -> dict[str, Any]:
    import torch
    import triton

    return {
        "platform": {"machine": platform.machine(), "glibc": platform.libc_ver()[1]},
        "cuda": {
            **wheel_cuda.requirements(str(torch.version.cuda), _capability()),
            "gpu": torch.cuda.get_device_name(),
            "triton": triton.__version__,
            "embed_kernels": bool(compiled.options.get(EMBED_OPTION)),
            "multi_arch": bool(compiled.options.get(MULTI_ARCH_OPTION)),
            # their sha256 and size are under "artifacts", with the .so's
            "kernels": sorted(p.name for p in compiled.artifacts if p.suffix in wheel_cuda.KERNEL_SUFFIXES),
        },
    }


def open_runner(library: Path, num_models: int = 1, kernels: Path | None = None) -> Any:
    """``kernels``: the folder of the kernel files (default: the library's own; verification
    loads the .so through /proc/self/fd and names the folder)."""
    import torch

    wheel_preload.load_cxx_runtime()
    return wheel_cuda.open_runner(library, kernels or library.parent, f"cuda:{torch.cuda.current_device()}", num_models)


def reference() -> contextlib.AbstractContextManager[None]:
    return wheel_cuda.exact_float32()


def synchronize() -> None:
    import torch

    torch.cuda.synchronize()
