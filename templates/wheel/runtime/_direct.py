"""The .so's model container opened with ctypes and called through its single-threaded entry point.

torch's runner calls ``AOTInductorModelContainerRun``, which first waits on a ``cudaEvent`` of the
previous run; querying an event is not allowed while a stream captures a CUDA graph, so that
call cannot be captured. ``AOTInductorModelContainerRunSingleThreaded`` (same arguments,
torch/csrc/inductor/aoti_runtime/interface.h) runs the model directly, without that bookkeeping:
torch's own ``aoti_load_package(run_single_threaded=True)`` exists for CUDA graphs. One model
instance, one caller at a time (``_graphs.GraphRunner`` holds a lock around it).

Tensors cross the C interface as handles (``at::Tensor*``): ``unsafe_alloc_void_ptrs_from_tensors``
makes them (capsules with no name and no destructor), ``alloc_tensors_by_stealing_from_void_ptrs``
turns handles back into tensors and frees them. Target-neutral: the target says which stream.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Callable

import torch

from ._constants import pairs
from ._manifest import NativeRuntimeError

_handle = ctypes.c_void_p
_size = ctypes.c_size_t
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

RUN = "AOTInductorModelContainerRunSingleThreaded"
_SIGNATURES = {  # name -> argument types; each returns AOTIRuntimeError (int32)
    "AOTInductorModelContainerCreateWithDevice": [ctypes.POINTER(_handle), _size, ctypes.c_char_p, ctypes.c_char_p],
    "AOTInductorModelContainerDelete": [_handle],
    "AOTInductorModelContainerGetNumOutputs": [_handle, ctypes.POINTER(_size)],
    # container, input handles (stolen), count, output handles (the caller steals them), count,
    # stream (cudaStream_t; NULL on the CPU), proxy executor
    RUN: [_handle, ctypes.POINTER(_handle), _size, ctypes.POINTER(_handle), _size, _handle, _handle],
    "AOTInductorModelContainerGetNumConstants": [_handle, ctypes.POINTER(_size)],
    "AOTInductorModelContainerGetConstantName": [_handle, _size, ctypes.POINTER(ctypes.c_char_p)],
    "AOTInductorModelContainerGetConstantOriginalFQN": [_handle, _size, ctypes.POINTER(ctypes.c_char_p)],
    "AOTInductorModelContainerSwapConstantBuffer": [_handle],
}
_PAIRS = {
    True: "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
    False: "AOTInductorModelContainerUpdateConstantBufferPairs",
}


class DirectUnavailable(NativeRuntimeError):
    """The .so lacks an entry point this path needs (built by a torch without it)."""


def _to_handles(tensors: list[torch.Tensor]) -> tuple[list[Any], list[int]]:
    """New handles to ``tensors`` (the capsules, and the pointers inside them)."""
    capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(tensors)
    return capsules, [_get_pointer(c, None) for c in capsules]


def _steal(pointers: list[int]) -> list[torch.Tensor]:
    """Tensors taking over ``pointers``' handles: each handle is freed with its tensor."""
    return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_new_capsule(p, None, None) for p in pointers])


class DirectRunner:
    """The model at ``library`` as a container of one model instance, called through ``RUN``.

    Offers what _load.py and _weights.py use of torch's runner: ``run``,
    ``get_constant_names_to_original_fqns``, ``update_constant_buffer``, ``swap_constant_buffer``.
    Not safe to call from two threads at once."""

    def __init__(
        self,
        library: Path,
        device: str,
        kernel_dir: Path | None,
        stream: Callable[[], int | None],
        constants: bool = False,
    ) -> None:
        """``constants``: the caller will hand over constants (external weights, a shared store):
        refuse now, before the model is used, if the .so cannot take them through this path."""
        try:
            self._so = ctypes.CDLL(str(library))
        except OSError as exc:
            raise NativeRuntimeError(f"cannot open {library}: {exc}") from None
        missing = [
            name for name in [*_SIGNATURES, *(_PAIRS.values() if constants else ())] if not hasattr(self._so, name)
        ]
        if missing:
            raise DirectUnavailable(f"{library.name} exports no {', '.join(missing)} (compiled by a torch without it)")
        for name in _PAIRS.values():  # (container, (name, handle) array, count, use_inactive, validate_full_update)
            if hasattr(self._so, name):
                getattr(self._so, name).restype = ctypes.c_int32
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self._so, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int32
        self._stream = stream
        self._container = _handle()
        self._call(
            "AOTInductorModelContainerCreateWithDevice",
            "opening the model",
            ctypes.byref(self._container),
            1,
            device.encode(),
            str(kernel_dir).encode() if kernel_dir else None,
        )
        count = _size()
        self._call("AOTInductorModelContainerGetNumOutputs", "reading the model", self._container, ctypes.byref(count))
        self._num_outputs = count.value
        # User-managed constants: the container keeps our handles, per buffer (active, inactive).
        self._owned: list[list[int]] = [[], []]

    def _call(self, name: str, what: str, *args: Any) -> None:
        if not hasattr(self._so, name):  # the constants' C-ABI-safe calls came after the rest
            raise DirectUnavailable(f"the model's .so exports no {name} (compiled by a torch without it)")
        code = getattr(self._so, name)(*args)
        if code != 0:
            message = ctypes.c_char_p()
            if hasattr(self._so, "AOTInductorGetLastError"):
                self._so.AOTInductorGetLastError.restype = ctypes.c_int32
                self._so.AOTInductorGetLastError(ctypes.byref(message))
            detail = (message.value or b"").decode(errors="replace").strip()
            raise NativeRuntimeError(f"{what} failed: {detail or f'error {code}'}")

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The model's outputs for ``inputs``, new tensors each call, on the target's current stream."""
        _capsules, pointers = _to_handles(inputs)  # the capsules keep nothing alive: the run takes the handles
        handles = (_handle * len(pointers))(*pointers)
        outputs = (_handle * self._num_outputs)()
        self._call(
            RUN,
            "running the model",
            self._container,
            handles,
            len(pointers),
            outputs,
            self._num_outputs,
            self._stream(),
            None,
        )
        return _steal([o or 0 for o in outputs])

    def get_constant_names_to_original_fqns(self) -> dict[str, str]:
        count = _size()
        self._call(
            "AOTInductorModelContainerGetNumConstants", "reading the constants", self._container, ctypes.byref(count)
        )
        names = {}
        for index in range(count.value):
            name, fqn = ctypes.c_char_p(), ctypes.c_char_p()
            self._call(
                "AOTInductorModelContainerGetConstantName",
                "reading the constants",
                self._container,
                index,
                ctypes.byref(name),
            )
            self._call(
                "AOTInductorModelContainerGetConstantOriginalFQN",
                "reading the constants",
                self._container,
                index,
                ctypes.byref(fqn),
            )
            names[(name.value or b"").decode()] = (fqn.value or b"").decode()
        return names

    def update_constant_buffer(
        self, tensors: dict[str, torch.Tensor], inactive: bool, validate_full_update: bool, user_managed: bool
    ) -> None:
        """As torch's runner: user-managed tensors are read in place, so their handles are kept
        until that buffer is given other ones."""
        _capsules, pointers = _to_handles(list(tensors.values()))
        array, _names = pairs(dict(zip(tensors, pointers)))
        try:
            self._call(
                _PAIRS[user_managed],
                "handing over the constants",
                self._container,
                array,
                _size(len(pointers)),
                ctypes.c_bool(inactive),
                ctypes.c_bool(validate_full_update),
            )
        except Exception:
            _steal(pointers)
            raise
        buffer = 1 if inactive else 0
        old, self._owned[buffer] = self._owned[buffer], pointers if user_managed else []
        _steal(old + ([] if user_managed else pointers))  # freed once nothing reads them

    def swap_constant_buffer(self) -> None:
        self._call("AOTInductorModelContainerSwapConstantBuffer", "swapping the constants", self._container)
        self._owned.reverse()

    def close(self) -> None:
        if getattr(self, "_container", None):
            self._so.AOTInductorModelContainerDelete(self._container)
            self._container = _handle()
            _steal([p for buffer in self._owned for p in buffer])
            self._owned = [[], []]

    def __del__(self) -> None:
        self.close()
