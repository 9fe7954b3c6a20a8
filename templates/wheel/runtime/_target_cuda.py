"""The runtime side of the CUDA target (_targets.py): what the GPU, driver and torch must be for
the kernels to run, the device a call runs on, and opening the .so.

Shared, like _inputs.py, by the build (pipeline/targets/cuda.py records these facts in the
manifest, and opens and checks the model through this file) and the wheel (load() checks them).
Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The oldest Linux driver each CUDA major runs on, with minor version compatibility (NVIDIA's
# "CUDA Toolkit and Minimum Required Driver Version" table); cuDriverGetVersion reports the
# newest CUDA a driver supports, so a driver is new enough when it reports at least major.0.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
KERNEL_SUFFIXES = (".cubin", ".fatbin", ".ptx")
# The .so records the absolute path of its kernel files: it runs where it was compiled (the /opt
# link), or with its installed kernel folder passed as cubin_dir (open_runner).
RELOCATABLE = False
NUMPY = False  # load_numpy()'s C interface runs host (CPU) models only


def variant(cuda_version: str | None) -> str:
    """PyTorch's name for a CUDA build: ``13.0`` -> ``cu130`` (the wheel's label and its index)."""
    if not cuda_version:
        raise ValueError("no CUDA version: a CUDA wheel needs a CUDA build of torch")
    return "cu" + cuda_version.replace(".", "")


def driver_cuda_version() -> int | None:
    """The newest CUDA the installed driver supports (cuDriverGetVersion: 13000 for 13.0), or None
    when there is no driver library."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def format_cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def requirements(cuda_version: str, capability: tuple[int, int]) -> dict[str, Any]:
    """The manifest's record of what the kernels need (without the build options and files)."""
    major = int(cuda_version.split(".")[0])
    return {
        "version": cuda_version,
        "capability": f"{capability[0]}.{capability[1]}",
        "arch": f"sm_{capability[0]}{capability[1]}",
        "min_driver": MIN_DRIVER.get(major, f"a driver for CUDA {major}.0"),
        "min_driver_cuda": major * 1000,
    }


def _capability(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def runs_on(needs: dict[str, Any], capability: tuple[int, int]) -> bool:
    """Triton compiles each kernel for the build GPU's exact architecture (sm_90a on an H100), so
    a cubin runs on that compute capability only; PTX (multi_arch) is compiled by the driver for
    the GPU at hand, so it also serves newer ones."""
    built = _capability(needs["capability"])
    return capability == built or (needs.get("multi_arch", False) and capability > built)


def where_it_runs(m: dict[str, Any]) -> str:
    """Which GPUs the wheel runs on (the build's summary and ``info``)."""
    needs = m["cuda"]
    newer = " and newer (its PTX)" if needs.get("multi_arch") else " only (the build GPU's)"
    return (
        f"NVIDIA GPUs of compute capability {needs['capability']} ({needs['arch']}){newer}, with a driver "
        f"for CUDA {needs['version']} ({needs['min_driver']} or newer)"
    )


def problems(
    m: dict[str, Any],
    *,
    torch_cuda: str | None,
    device: str,
    device_count: int,
    gpu: str,
    capability: tuple[int, int] | None,
    driver_cuda: int | None,
) -> list[str]:
    """Why this CUDA wheel cannot run on ``device`` here, each naming both sides; [] if it can."""
    needs, torch_version = m["cuda"], m["torch"]["version"]
    if torch_cuda is None:
        return [
            f"the installed torch is a CPU-only build; "
            f"the model needs torch {torch_version} with CUDA {needs['version']}"
        ]
    found = []
    if torch_cuda != needs["version"]:
        found.append(
            f"torch runs CUDA {torch_cuda}; the model's kernels were built with CUDA {needs['version']} "
            f"(torch {torch_version})"
        )
    if device_count == 0:
        return found + [
            "no CUDA device is visible (torch.cuda.device_count() is 0; check the driver, nvidia-smi "
            "and CUDA_VISIBLE_DEVICES)"
        ]
    index = int(device.partition(":")[2] or 0)
    if index >= device_count:
        return found + [
            f"{device} does not exist: {device_count} CUDA device(s) visible (cuda:0 to cuda:{device_count - 1})"
        ]
    if driver_cuda is None or driver_cuda < needs["min_driver_cuda"]:
        have = (
            "no NVIDIA driver library (libcuda.so.1)"
            if driver_cuda is None
            else f"the NVIDIA driver supports CUDA {format_cuda(driver_cuda)}"
        )
        found.append(
            f"{have}; the model needs a driver for CUDA {needs['version'].split('.')[0]}.x (>= {needs['min_driver']})"
        )
    if capability is not None and not runs_on(needs, capability):
        ptx = (
            "" if needs.get("multi_arch") else " (build with [build.cuda] multi_arch = true to ship PTX for newer GPUs)"
        )
        found.append(
            f"{device} ({gpu}) has compute capability {capability[0]}.{capability[1]}; the model's kernels "
            f"are for {needs['capability']} ({needs['arch']}, built on {needs['gpu']}){ptx}"
        )
    return found


def device_facts(device: str) -> dict[str, Any]:
    """What problems() needs, read from torch and the driver."""
    import torch

    facts: dict[str, Any] = {
        "torch_cuda": torch.version.cuda,
        "device_count": 0,
        "gpu": "?",
        "capability": None,
        "driver_cuda": driver_cuda_version(),
    }
    if torch.version.cuda is None or not torch.cuda.is_available():
        return facts
    facts["device_count"] = torch.cuda.device_count()
    index = int(device.partition(":")[2] or 0)
    if index < facts["device_count"]:
        facts["gpu"] = torch.cuda.get_device_name(index)
        facts["capability"] = tuple(torch.cuda.get_device_capability(index))
    return facts


def problems_here(m: dict[str, Any], device: str) -> list[str]:
    """Why this CUDA wheel cannot run on ``device`` in this process ([] if it can)."""
    return problems(m, device=device, **device_facts(device))


def before_open(m: dict[str, Any]) -> None:
    """Nothing to set up in the process: the GPU's needs are all checked by problems_here."""


def resolve_device(device: str | None) -> str:
    """``None`` or ``"cuda"`` -> the current CUDA device as ``cuda:N``; ``"cuda:N"`` as given."""
    import torch

    text = "cuda" if device is None else str(device)
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"device {text!r}: this wheel runs on CUDA devices ('cuda' or 'cuda:N')")
    if index:
        return text
    current = torch.cuda.current_device() if torch.version.cuda and torch.cuda.is_available() else 0
    return f"cuda:{current}"


def open_runner(library: Path, kernel_dir: Path, device: str, num_models: int) -> Any:
    """The .so through torch's CUDA runner. ``kernel_dir`` is always passed as ``cubin_dir``: the
    .so records the absolute path its kernels were compiled at, and this finds them wherever the
    wheel is installed, with or without the /opt link (embedded kernels ignore it)."""
    import torch

    return torch._C._aoti.AOTIModelContainerRunnerCuda(str(library), num_models, device, str(kernel_dir))


# Servers set it to 0 to run every CUDA wheel as without graphs (load(cuda_graphs=...) overrides it).
GRAPHS_VARIABLE = "MODELWHEEL_CUDA_GRAPHS"


def stream(device: str) -> Callable[[], int]:
    """The stream the .so's single-threaded entry point runs on: the caller's current one on
    ``device`` (the capturing stream while a graph is captured)."""
    import torch

    where = torch.device(device)
    return lambda: torch.cuda.current_stream(where).cuda_stream


def graphs_off(asked: bool | None) -> str | None:
    """Why calls run without CUDA graphs (None: they replay graphs, the default)."""
    if asked is False:
        return "load(cuda_graphs=False)"
    if asked is None and os.environ.get(GRAPHS_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{GRAPHS_VARIABLE}={os.environ[GRAPHS_VARIABLE]}"
    return None


class CudaGraphs:
    """_graphs.GraphBackend on a GPU: a torch.cuda.CUDAGraph per capture, all in one memory pool.

    Sharing the pool is safe because a GraphRunner replays one graph at a time and copies what it
    returns before the next call: a later graph may reuse an earlier one's workspace, never while
    that one runs."""

    def __init__(self, device: str) -> None:
        import torch

        self._device = torch.device(device)
        self._pool = torch.cuda.graph_pool_handle()

    def settings(self) -> tuple[bool, bool]:
        """What a capture bakes in beside the shapes: whether cuDNN and cuBLAS may use TF32 (the
        golden check turns both off: reference())."""
        import torch

        return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32

    def capture(self, run: Callable[[], list[Any]], warmups: int) -> tuple[Any, list[Any]]:
        import torch

        with torch.cuda.device(self._device):
            side = torch.cuda.Stream()  # warm-up on a side stream, as torch's CUDA graph docs do
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmups):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls during the capture do not invalidate it
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                outputs = run()
        return graph, outputs


def graph_backend(device: str) -> CudaGraphs:
    return CudaGraphs(device)


def device(asked: str | None) -> str:
    """The device a call runs on: the current GPU, or the one asked for (``cuda:1``)."""
    return resolve_device(asked)


@contextlib.contextmanager
def reference() -> Iterator[None]:
    """The settings the build's reference and the golden outputs were recorded under."""
    with exact_float32():
        yield


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off for cuDNN and cuBLAS while inside: eager's convolutions use TF32 by default, which
    alone differed from the compiled UNet by 1e-3 on an H100 (2.4e-6 with it off). The build's
    reference and the wheel's golden check both run under it, so they compare like with like."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
