"""The CPU target: a .so of C++ kernels that runs from any folder on any machine with at least
the vector ISA it was compiled for.

torch is imported inside the functions that use it: the registry is read by commands that
need no torch (``matrix``, ``publish``).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field

from ..errors import UsageError
from ..services.frozen import Frozen
from ..services.templates import RUNTIME_DIR
from ..wheel_template.runtime import _target_cpu as wheel_cpu
from ..wheel_template.runtime._schema import Manifest
from . import cpu_isa
from .views import CompiledFiles, Rebuild, SpecKeys

NAME = "cpu"
DEVICE = "cpu"
TORCH_DEVICE = DEVICE
REFERENCE = "eager"  # what verification compares with
RELOCATABLE = True
SHARED_CONSTANTS = True
COMPILES_IN_FORKS = True  # Inductor's C++ compiles: host code only
# Measured on this project's 2-core build machine (AVX-512), a fresh Inductor cache: the tiny MLP's
# 19 ops in 11.3 s, the unet's 734 ops in 56.3 s (features/first_guess.py scales it to the machine).
COMPILE_GUESS_S = (10.1, 0.063)
# The release workflow (.github/workflows/release.yml, through `pipeline matrix`): the runner
# label, a manylinux_2_28 image with the compiler (PyPA's; torch's own wheels are manylinux_2_28,
# so a wheel built there is no narrower than the torch it pins) and PyTorch's index variant.
RUNNER: str | list[str] = "ubuntu-latest"
CONTAINER = "quay.io/pypa/manylinux_2_28_x86_64"
CONTAINER_OPTIONS = ""
TORCH_VARIANT = "cpu"
DYNAMIC_THREADS_OPTION = "cpp.dynamic_threads"
SCHEDULE_THREADS_OPTION = "cpp.threads"
# The thread count Inductor plans its loops for, whatever the build machine has: which loops of a
# kernel are split among threads is decided at compile time, from this count.
SCHEDULE_THREADS = 8
# Inductor's name for the vector ISA -> the torch CPU capability the kernels need at run time.
VEC_ISA_CAPABILITY = {"avx512": "AVX512", "avx2": "AVX2", "none": "DEFAULT"}
# The CPU kinds a build can be made for: the build machine's own, or a named one. A named kind
# is selected for the whole build process before torch starts: ATen's kernels (the eager
# reference), Inductor's vector ISA (it reads ATEN_CPU_CAPABILITY) and oneDNN's (which packs the
# weights) all run as on a CPU of that kind, so verification checks what such a CPU runs.
ISA_CHOICES = ("native", "avx2", "avx512")
ISA_ENV = "MODELWHEEL_CPU_ISA"
_ONEDNN_ISA = {"avx2": "AVX2", "avx512": "AVX512_CORE"}
RUNTIME_FILE = RUNTIME_DIR / "_target_cpu.py"
BF16_SLOW = "this CPU has no native bfloat16 instructions (AVX512-BF16 or AMX): it would run slower"


class BUILD_OPTIONS(Frozen):  # noqa: N801  # the Target protocol's name for it
    """The spec's [build.cpu] section."""

    isa: Literal["native", "avx2", "avx512"] = Field(
        "native",
        description="the CPU kind the kernels are built for: the build machine's own (native), or avx2 (any "
        "x86-64 CPU with AVX2) or avx512",
    )


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        parser.add_argument(
            "--cpu-isa",
            choices=ISA_CHOICES,
            default=None,
            help="the CPU kind a cpu wheel's kernels are built for: native (this machine's), or avx2 for "
            f"any x86-64 CPU with AVX2 (default: ${ISA_ENV}, else the spec's [build.cpu] isa, "
            "else native)",
        )
    ]


def before_torch(options: BUILD_OPTIONS, args: argparse.Namespace) -> None:
    """The CPU kind is fixed before torch is imported: it decides the ISA its kernels use."""
    from_env = os.environ.get(ISA_ENV)
    if from_env and from_env not in ISA_CHOICES:
        raise UsageError(f"{ISA_ENV}={from_env!r} is not a CPU kind", f"set it to one of {', '.join(ISA_CHOICES)}")
    select_isa(getattr(args, "cpu_isa", None) or from_env or options.isa)


def select_isa(isa: str) -> None:
    """Build for CPUs of kind ``isa`` (one of ISA_CHOICES); call before torch is imported."""
    if isa == "native":
        return
    os.environ["ATEN_CPU_CAPABILITY"] = isa
    os.environ["ONEDNN_MAX_CPU_ISA"] = _ONEDNN_ISA[isa]


def unavailable() -> str | None:
    import torch

    if torch.version.cuda is not None or torch.version.hip is not None:
        # Its wheel would pin this torch, whose version (2.13.0, or 2.13.0+cu130) a CPU user's
        # torch (2.13.0+cpu) satisfies for pip but not for the runtime's exact check.
        return (
            f"torch {torch.__version__} is a GPU build; a CPU wheel pins the torch it was built with, so it is "
            f"built with PyTorch's CPU build: pip install torch=={torch.__version__.split('+')[0]}+cpu "
            "--index-url https://download.pytorch.org/whl/cpu"
        )
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    running = torch.backends.cpu.get_cpu_capability()
    if asked and asked != "DEFAULT" and asked != running:
        return (
            f"the build asks for {asked} kernels (ATEN_CPU_CAPABILITY={asked.lower()}), but this CPU runs "
            f"{running} at most, so it cannot verify them; build with --cpu-isa {running.lower()} or native, "
            f"or on a CPU with {asked}"
        )
    return None


def packed_constant(tensor: Any) -> tuple[bytes, dict[str, Any]] | None:
    from . import cpu_constants  # it imports torch: not on reading the registry (see above)

    return cpu_constants.packed(tensor)


def compile_options(spec: SpecKeys) -> dict[str, object]:
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
    from . import cpu_prepack  # it imports torch: not on reading the registry

    # Only freezing makes weights constants that can be packed at compile time.
    return cpu_prepack.inductor_options() if options.get("freezing") else {}


def ships(path: Path, options: Mapping[str, object]) -> bool:
    return path.suffix == ".so"


def vec_isa() -> str:
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    cpu_isa.remember_probes()
    return str(pick_vec_isa()) or "none"


def key_facts(compile_dir: Path) -> tuple[str, ...]:
    from . import cpu_prepack  # it imports torch: not on reading the registry

    return (vec_isa(), cpu_prepack.VERSION)


def machine() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()


def rebuild(manifest: Mapping[str, Any]) -> Rebuild:
    """A named CPU kind is one whose oneDNN cap the build ran under (select_isa); native has none."""
    platform_facts = manifest.get("platform", {})
    isa = str(platform_facts["cpu_capability"]).lower() if platform_facts.get("onednn_max_isa") else "native"
    # the kind said as the build's lines say it ("CPU kind AVX512"), native or named (H48: "CPU kind native")
    kind = platform_facts.get("cpu_capability", NAME)
    how = "native: the build machine's own" if isa == "native" else f"--cpu-isa {isa}"
    return Rebuild(
        said=f"CPU kind {kind} ({how})",
        must_match=f"the CPU kind ({platform_facts.get('cpu_capability', NAME)})",
        arguments={"cpu_isa": isa},
    )


def index_variant() -> str:
    return TORCH_VARIANT


def provided_libraries() -> set[str]:
    return set()


def bf16_native() -> bool:
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def where_it_runs(manifest: Mapping[str, Any]) -> str:
    return wheel_cpu.where_it_runs(cast(Manifest, manifest))


def manifest_facts(compiled: CompiledFiles) -> dict[str, Any]:
    import torch

    isa = vec_isa()
    return {
        "platform": {
            "machine": platform.machine(),
            "vec_isa": isa,
            # The CPU kind the kernels were built for: a CPU without it cannot run them.
            "cpu_capability": VEC_ISA_CAPABILITY.get(isa, torch.backends.cpu.get_cpu_capability()),
            "glibc": platform.libc_ver()[1],
            # The oneDNN cap the build ran under (a named kind: select_isa), which packed the
            # weights; the runtime holds oneDNN there too (runtime/_target_cpu.py's before_open).
            **({"onednn_max_isa": cap} if (cap := os.environ.get("ONEDNN_MAX_CPU_ISA")) else {}),
        },
    }


def synchronize() -> None:
    pass
