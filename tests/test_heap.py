"""The wheel runtime's heap setting (templates/wheel/runtime/_malloc.py): memory a model call frees
stays in the heap, so the next call does not fault it in again; the user's own choice wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.services.templates import RUNTIME_DIR

# A model call in miniature: ten 4 MiB buffers alive at once, written, all freed on return.
# Prints what keep_freed_memory() did, then the page faults of one such call, once warm.
CALLS = f"""
import ctypes, importlib.util, resource
spec = importlib.util.spec_from_file_location("_malloc", {str(RUNTIME_DIR / "_malloc.py")!r})
heap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heap)
print(heap.keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def call(size=4 << 20):
    blocks = [libc.malloc(size) for _ in range(10)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
call(); call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    call()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="the setting is glibc's"
)


def faults_per_call(**env: str) -> tuple[str, int]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GLIBC_TUNABLES", "MODELWHEEL_MALLOC") and not k.startswith("MALLOC_")
    }
    ran = subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True, env={**clean, **env})
    assert ran.returncode == 0, ran.stderr
    outcome, faults = ran.stdout.split("\n")[:2]
    return outcome, int(faults)


def test_freed_buffers_are_reused_without_faulting_pages_in_again():
    outcome, faults = faults_per_call()
    assert outcome == "kept"
    assert faults < 100, f"{faults} page faults a call with the heap kept"


def test_glibc_defaults_fault_every_call_and_are_what_the_opt_out_gives():
    outcome, faults = faults_per_call(MODELWHEEL_MALLOC="default")
    assert outcome == "MODELWHEEL_MALLOC=default"
    assert faults > 5000, "ten freed 4 MiB buffers are given back to the kernel and faulted in again"


@pytest.mark.parametrize(
    "env, named",
    [
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"}, "GLIBC_TUNABLES"),
        ({"MALLOC_TRIM_THRESHOLD_": "1000"}, "MALLOC_TRIM_THRESHOLD_"),
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(env, named):
    outcome, faults = faults_per_call(**env)
    assert outcome == f"set by the user ({named})"
    assert faults > 5000, "the user's trim threshold, not the runtime's, governs the heap"
