"""Make the process's C++ runtime global before an AOTInductor .so is opened.

Inductor links the model .so with ``-static-libstdc++`` (torch/_inductor/cpp_builder.py). Where
the process's own libstdc++ is newer than the compiler's (a g++ 13 build opened under GCC 14's
libstdc++, on Ubuntu 24.04), opening it crashed inside std::regex. Loading the process's
libstdc++ with RTLD_GLOBAL first makes the .so bind to that one copy; it loaded and ran then.
Shared, like _inputs.py, by the build (verification opens every candidate) and the wheel.
"""

from __future__ import annotations

import ctypes
import threading

LIBSTDCXX = "libstdc++.so.6"
_lock = threading.Lock()
_loaded = False


def load_cxx_runtime() -> None:
    """Idempotent; where no shared libstdc++ exists the .so's static copy is all there is."""
    global _loaded
    with _lock:
        if _loaded:
            return
        try:
            ctypes.CDLL(LIBSTDCXX, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass
        _loaded = True
