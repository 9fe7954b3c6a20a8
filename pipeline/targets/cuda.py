"""The CUDA target: a .so plus Triton kernel files (.cubin; .fatbin and .ptx with multi_arch).

The .so records the absolute path of every kernel file, so it is compiled where it ships from
(RELOCATABLE is False) and the wheel's runtime always passes its installed kernel folder as
``cubin_dir``. Facts measured on an H100 are in shared/design-notes.md ("CUDA facts").
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from ..services.frozen import Frozen
from ..services.templates import RUNTIME_DIR
from ..wheel_template.runtime import _target_cuda as wheel_cuda
from .views import CompiledFiles, Rebuild, SpecKeys

NAME = "cuda"
DEVICE = "cuda"
TORCH_DEVICE = DEVICE
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
COMPILES_IN_FORKS = False  # the parent has initialised CUDA, which a forked worker cannot use
# The unet's 734 ops compiled with freezing (this target's default, below) in 107, 115 and 155 s
# on three H200s (../shared/design-notes.md; 75 s without freezing): the line meets the middle one,
# where one of 75 s left a first build's compile "running 1m17s past the estimate". The base, the
# seconds any graph takes, is the CPU target's plus Triton's start, not measured alone.
COMPILE_GUESS_S = (15.0, 0.136)
EMBED_OPTION = "aot_inductor.embed_kernel_binary"
MULTI_ARCH_OPTION = "aot_inductor.emit_multi_arch_kernel"
RUNTIME_FILE = RUNTIME_DIR / "_target_cuda.py"
BF16_SLOW = "this GPU has no native bfloat16 support (compute capability below 8.0): it would run slower"


class BUILD_OPTIONS(Frozen):  # noqa: N801  # the Target protocol's name for it
    """The spec's [build.cuda] section."""

    embed_kernels: bool = Field(False, description="put the kernel binaries inside the .so: one file to ship")
    multi_arch: bool = Field(
        False, description="also ship PTX, which the driver compiles for GPUs newer than the build's"
    )


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return []


def before_torch(options: BUILD_OPTIONS, args: argparse.Namespace) -> None:
    pass


def runner_missing() -> str | None:
    """Why this machine cannot run the release's cuda job on itself (a local run under act), asked
    without torch: the matrix job has none. The job needs an NVIDIA driver, which brings nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver here (nvidia-smi is not on PATH)"
    return None


def unavailable() -> str | None:
    import torch

    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); building for CUDA needs "
            "a CUDA build of torch and a GPU"
        )
    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: torch.cuda.is_available() is "
            "False (check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)"
        )
    try:
        import triton  # noqa: F401  # Inductor writes the CUDA kernels in Triton
    except ImportError:
        return (
            "triton is not installed: Inductor generates the CUDA kernels with it (pip install the triton torch names)"
        )
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return (
            "no CUDA toolkit found (nvcc on PATH or CUDA_HOME): "
            "AOTInductor compiles the model's C++ against its headers"
        )
    return None


def compile_options(spec: SpecKeys) -> dict[str, object]:
    options: BUILD_OPTIONS = spec.build.options(NAME)
    chosen: dict[str, object] = {EMBED_OPTION: options.embed_kernels, MULTI_ARCH_OPTION: options.multi_arch}
    if "freezing" not in spec.compile.model_fields_set and not spec.weights.external:
        # On by default: with the weights constant, Inductor folds and fuses around them (the unet
        # replayed in a CUDA graph: 2.39 ms frozen against 3.18 ms, verified; design-notes.md).
        # External weights stay unfrozen, so they can still be loaded and swapped.
        chosen["freezing"] = True
    return chosen


def graph_passes(options: Mapping[str, object]) -> dict[str, object]:
    return {}


def packed_constant(tensor: Any) -> tuple[bytes, dict[str, Any]] | None:
    return None  # never asked (SHARED_CONSTANTS is False): each .so keeps its own constants


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
    driver = wheel_cuda.driver_cuda_version()
    return f"{torch.cuda.get_device_name()}|sm_{major}{minor}|cuda {torch.version.cuda}|driver {driver}"


def rebuild(manifest: Mapping[str, Any]) -> Rebuild:
    arch = manifest.get("cuda", {}).get("arch", "its GPU architecture")
    return Rebuild(said=f"GPU {arch}", must_match=f"the GPU architecture ({arch}) and CUDA")


def index_variant() -> str:
    import torch

    return wheel_cuda.variant(torch.version.cuda)


def provided_libraries() -> set[str]:
    """The nvidia-* packages' libraries (pip installs them with the pinned torch) and the driver's libcuda."""
    roots = [Path(p) / "nvidia" for p in sys.path if (Path(p) / "nvidia").is_dir()]
    return {lib.name for root in roots for lib in root.rglob("*.so*")} | {"libcuda.so.1"}


def bf16_native() -> bool:
    import torch

    return bool(torch.cuda.is_bf16_supported())


def where_it_runs(manifest: Mapping[str, Any]) -> str:
    return wheel_cuda.where_it_runs(dict(manifest))


def manifest_facts(compiled: CompiledFiles) -> dict[str, Any]:
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


def synchronize() -> None:
    import torch

    torch.cuda.synchronize()
