"""Where a real wheel's time goes, kernels or not: a sampling profile (Linux `perf`) of a fresh
process calling the installed wheel, grouped by the library each sample fell in.

Inductor's kernel profile (`cpp.enable_kernel_profile`) times only what the compiled model
calls; this sees everything the process does around it: the Python call path, OpenMP's
barriers, the allocator, the kernel. Used by bench.py's "what limits it" when `perf` exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# (group, pattern on perf's dso column), first match wins
GROUPS = [
    ("the model's generated kernels (model.so)", r"^model\.so$"),
    ("oneDNN JIT kernels (convolutions, GEMMs)", r"^\[JIT\]"),
    ("ATen, oneDNN, MKL (libtorch_cpu)", r"^libtorch_cpu\.so"),
    ("OpenMP runtime: barriers and waiting (libgomp)", r"^libgomp"),
    ("Python interpreter", r"^libpython|^python"),
    ("C library (malloc, memcpy)", r"^libc\.so"),
    ("Linux kernel", r"^\[kernel"),
]
OTHER = "other libraries"


def available() -> bool:
    """`perf` is installed and may sample here (perf_event_paranoid, containers)."""
    if shutil.which("perf") is None:
        return False
    trial = subprocess.run(["perf", "record", "-q", "-o", "/dev/null", "--", "true"], capture_output=True)
    return trial.returncode == 0


def profile(cmd: list, out: Path, skip_s: float, frequency: int = 499, cwd: Path | None = None) -> dict:
    """Runs ``cmd`` (in ``cwd``) under `perf record`, sampling only after its first ``skip_s``
    seconds (its start-up: imports, load), and returns {"groups": {group: share of the samples}}."""
    data = out / "perf.data"
    subprocess.run(
        ["perf", "record", "-F", str(frequency), "-D", str(int(skip_s * 1000)), "-o", str(data), "--", *map(str, cmd)],
        check=True,
        capture_output=True,
        cwd=cwd,
    )
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio", "-q"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return grouped(report)


def grouped(report: str) -> dict:
    """perf report's ``--sort dso`` lines (``  76.54%  libgomp.so.1``) summed per group."""
    shares: dict[str, float] = {}
    for line in report.splitlines():
        found = re.match(r"\s*([\d.]+)%\s+(.+?)\s*$", line)
        if not found:
            continue
        dso = found.group(2)
        group = next((name for name, pattern in GROUPS if re.search(pattern, dso)), OTHER)
        shares[group] = shares.get(group, 0.0) + float(found.group(1)) / 100
    return {"groups": dict(sorted(shares.items(), key=lambda item: -item[1]))}
