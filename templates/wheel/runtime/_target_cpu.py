"""The runtime side of the CPU target (_targets.py): a .so of C++ kernels that runs from any
folder, on the host, through torch's CPU runner or load_numpy()'s C interface.

Shared with the build (pipeline/targets/cpu.py opens the model it verifies and times through
this file, so what the build checks is what the wheel runs). Every fact about the CPU a wheel
needs (the vector ISA its kernels were built for, the oneDNN cap its weights were packed under)
is read here, and nowhere else in the runtime. Imports torch only when opening.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ._malloc import keep_freed_memory
from ._schema import Platform

if TYPE_CHECKING:
    from ._schema import Manifest

RELOCATABLE = True  # runs from wherever the wheel is installed; writes nothing outside it
NUMPY = True  # load_numpy() can open it without torch
# Freezing packs convolution and linear weights into oneDNN's blocked layouts (torch's mkldnn
# tensors): the constants store (_constants.py) keeps each with its memory descriptor, and the
# shim makes it again as that layout (pipeline/targets/cpu_constants.py writes them).
CONSTANT_LAYOUTS = {"mkldnn": "aoti_torch_layout__mkldnn"}
# Inductor's CPU code needs at least the vector ISA it was built for; ATen picks its own at run time.
CPU_CAPABILITY_ORDER = ["DEFAULT", "AVX2", "AVX512"]
NAMED_CPU_KINDS = ("AVX2", "AVX512")  # the kinds `modelwheel build --cpu-isa` builds for by name
# What `info` says beside a compile option that reads as a mistake: the build plans every model's
# loops for 8 threads (pipeline/targets/cpu.py's SCHEDULE_THREADS), and a newcomer took
# "cpp.threads 8" on a 2-core machine for a wrong setting.
OPTION_NOTES = {
    "cpp.threads": "the threads its loops are planned for, whatever the build machine had; "
    "it runs on as many as the serving process has",
    "cpp.dynamic_threads": "the thread count read when it runs, not fixed at build time",
    "freezing": "the weights folded into the compiled code as constants",
    "force_layout_optimization": "convolutions laid out channels-last",
    "max_autotune": "each kernel chosen by timing several at build time",
}


class CpuPlatform(Platform, total=False):
    """A CPU wheel's facts about its machine (pipeline/targets/cpu.py's manifest_facts)."""

    vec_isa: str  # the instruction set the kernels were built with
    cpu_capability: str  # the CPU kind its kernels need
    onednn_max_isa: str  # the oneDNN cap the build packed its weights under (a named CPU kind's)


PLATFORM = CpuPlatform  # what the load checks the manifest's platform facts against (_targets.py)


def device(asked: str | None) -> str:
    if asked is not None and asked != "cpu":
        raise ValueError(f"device {asked!r}: this wheel is a CPU build; install its CUDA wheel to run on a GPU")
    return "cpu"


def problems_here(m: Manifest, device: str) -> list[str]:
    """The CPU kind the kernels need, against the one torch runs here (load(): torch is imported)."""
    import torch

    return problems_on(m, torch.backends.cpu.get_cpu_capability())


def problems_without_torch(m: Manifest) -> list[str]:
    """The same check for load_numpy(), which reads the CPU kind without importing torch."""
    return problems_on(m, cpu_capability())


def problems_on(m: Manifest, have: str) -> list[str]:
    needed = platform_facts(m).get("cpu_capability")
    return [_cpu_kind_problem(have, needed)] if needed is not None and _lacks(have, needed) else []


def where_it_runs(m: Manifest) -> str:
    """Which CPUs the wheel runs on, said before it is published (a newcomer's default build ran on
    AVX-512 CPUs only, and only ``info`` said so)."""
    facts = platform_facts(m)
    needed, machine = facts.get("cpu_capability", "DEFAULT"), m["platform"].get("machine", "")
    if machine != "x86_64":
        return f"{machine} CPUs like the build machine's"
    cpus = "any x86-64 CPU" if needed == "DEFAULT" else f"x86-64 CPUs with {needed}"
    if "onednn_max_isa" in facts:  # a named kind (--cpu-isa)
        return f"{cpus} (built for that kind by name: --cpu-isa {needed.lower()})"
    wider = "" if needed in ("DEFAULT", "AVX2") else "; --cpu-isa avx2 builds one for any x86-64 CPU with AVX2"
    return f"{cpus}, the build machine's kind (native{wider})"


def platform_facts(m: Manifest) -> CpuPlatform:
    """The manifest's platform facts, which the load checked against PLATFORM."""
    return cast(CpuPlatform, m["platform"])


def cpu_capability() -> str:
    """The vector ISA ATen would pick here (what torch.backends.cpu.get_cpu_capability() reports)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "DEFAULT"
    if platform.machine() != "x86_64":
        return "DEFAULT"
    best = (
        "AVX512"
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags
        else ("AVX2" if {"avx2", "fma"} <= flags else "DEFAULT")
    )
    # ATen honours this variable to run a lower ISA; mirror it.
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    order = CPU_CAPABILITY_ORDER
    if forced in order and order.index(forced) < order.index(best):
        return forced
    return best


def _cpu_kind_problem(have: str, needed: str) -> str:
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "")
    why = (
        f"torch runs {have} kernels here, as ATEN_CPU_CAPABILITY={forced} asks"
        if forced.upper() == have
        else f"this CPU supports {have}"
    )
    # `modelwheel build --cpu-isa` names avx2 and avx512; a wheel for a CPU below AVX2 is built on one.
    wheel = (
        f"a wheel built for {have.lower()} (modelwheel build --cpu-isa {have.lower()})"
        if have in NAMED_CPU_KINDS
        else f"a wheel built on a CPU without {CPU_CAPABILITY_ORDER[1]} (modelwheel build --cpu-isa native there)"
    )
    fix = (
        f"unset ATEN_CPU_CAPABILITY, or install {wheel}"
        if forced.upper() == have
        else f"run it on a CPU with {needed}, or install {wheel}"
    )
    return f"{why}, but the model's kernels were built for {needed} CPUs: {fix}"


def _lacks(have: str, needed: str) -> bool:
    if needed in CPU_CAPABILITY_ORDER and have in CPU_CAPABILITY_ORDER:
        return CPU_CAPABILITY_ORDER.index(have) < CPU_CAPABILITY_ORDER.index(needed)
    return have != needed


def before_open(m: Manifest) -> None:
    """Run oneDNN at the instruction set the build packed the weights for. A wheel built for a
    named CPU kind (--cpu-isa avx2: the release's portable one) holds weights in that kind's
    blocked layouts; on a CPU with more (AVX-512), an uncapped oneDNN picks its own kernels and
    reorders every packed weight on every call: 6x slower than eager on the unet. oneDNN reads
    the cap once, at its first use in the process, so a process that ran oneDNN before this
    (eager convolutions) keeps its own: set ONEDNN_MAX_CPU_ISA before it starts (docs:
    publishing.md, "Which CPUs a wheel runs on"). A cap the user set is theirs."""
    cap = platform_facts(m).get("onednn_max_isa")
    if cap and not (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")):
        os.environ["ONEDNN_MAX_CPU_ISA"] = cap


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
