"""Keep the memory a CPU model call frees in the heap, so the next call does not fault it in again.

Every call of a compiled CPU model allocates its intermediate buffers and frees them on return.
glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised as large blocks
are freed) with a fresh mmap and unmaps it on free, and gives the heap's top back to the kernel
above its trim threshold; the next call then faults every page in again and the kernel zeroes
each one. On the unet at batch 1 that was 700 to 1000 page faults a call, and how many depended
on what the process had freed before (``import torch`` raises the threshold): the one per-call
difference measured between load_numpy() and load(), whose times differed from run to run.
Fixing both thresholds turns that off: a buffer freed by one call is reused by the next. The
cost is that the process keeps up to
KEEP_AT_MOST of freed heap instead of handing it back between calls (more is still trimmed, and
blocks above 32 MiB are still mapped and unmapped, so a swapped-out model's large weights are
given back). Process-wide, so it is skipped where the user has chosen:
MODELWHEEL_MALLOC=default, glibc's own MALLOC_*_ variables or tunables, or a libc that is not
glibc. Shared, like _preload.py, by the wheel, the build (targets/cpu.py) and the benchmarks.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
KEEP_AT_MOST = 512 << 20  # freed heap kept for the next call; above this glibc trims it
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit systems; blocks above it are still mmapped
OPT_OUT = "MODELWHEEL_MALLOC"
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_lock = threading.Lock()
_outcome: str | None = None


def _reason_to_skip() -> str | None:
    if os.environ.get(OPT_OUT, "").lower() == "default":
        return f"{OPT_OUT}=default"
    chosen = [name for name in _USER_SETTINGS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES")
    if chosen:
        return f"set by the user ({', '.join(chosen)})"
    if platform.libc_ver()[0] != "glibc":
        return "not glibc"
    return None


def keep_freed_memory() -> str:
    """Idempotent; returns what was done ('kept', or why not), for the benchmarks and tests."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _reason_to_skip() or _apply()
        return _outcome


def _apply() -> str:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "no mallopt"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, KEEP_AT_MOST)):
        return "mallopt refused"
    return "kept"
