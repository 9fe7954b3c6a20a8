"""The constants store shared by a wheel's compiled models (static batch sizes with embedded weights).

``constants.bin`` holds every distinct constant once (64-byte aligned); ``constants.json`` says,
per model and constant, which bytes and how to read them (dtype, shape, strides, its layout, and
for a layout of the target's own the metadata that describes it). The file is memory-mapped
read-only, and each constant is made a tensor over that memory by torch's own C shim
(``aoti_torch_create_tensor_from_blob_v2``, the call a .so makes for the constants it embeds), so
no weight is copied and the models share the pages. Its layouts besides strided are the target's
(its runtime module's CONSTANT_LAYOUTS: _targets.py's ``constant_layouts``).
Shared by the build (verification) and the wheel (``load()``, ``load_numpy()``); imports no torch,
and numpy only when a store is opened.
"""

from __future__ import annotations

import ctypes
import json
import mmap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._deps import require

INDEX_FILE, BLOB_FILE = "constants.json", "constants.bin"
_i64 = ctypes.c_int64


class _Pair(ctypes.Structure):  # AOTInductorConstantMapEntry (aoti_runtime/interface.h)
    _fields_ = [("name", ctypes.c_char_p), ("handle", ctypes.c_void_p)]


class Store:
    """The store in ``folder``, mapped once; ``handles()`` makes a model's constants from it.
    ``layouts``: the target's own layouts (its name in the store -> the shim's function for it)."""

    def __init__(self, folder: Path, layouts: Mapping[str, str]) -> None:
        self._layouts = {"strided": "aoti_torch_layout_strided", **layouts}
        self.index = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
        size = (folder / BLOB_FILE).stat().st_size
        with (folder / BLOB_FILE).open("rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        # numpy gives the read-only mapping's address; the kernels only read their constants
        np = require("numpy", "numpy", "a model with static batch sizes (its shared constants store)")
        self._bytes = np.frombuffer(self._map, dtype=np.uint8) if self._map is not None else np.empty(0, np.uint8)

    def _address(self, key: str) -> int:
        address: int = self._bytes.ctypes.data + self.index["blobs"][key]["offset"]
        return address

    def _metadata(self, key: str) -> bytes:
        where = self.index["blobs"][key]
        data: bytes = self._bytes[where["offset"] : where["offset"] + where["size"]].tobytes()
        return data

    def handles(self, lib: ctypes.CDLL, library: str) -> dict[str, int]:
        """Each constant of ``library`` (its path in artifacts/) as a new tensor handle over the
        mapped bytes; the caller owns the handles (a tensor made from one, or a model given them)."""
        create = lib.aoti_torch_create_tensor_from_blob_v2
        create.restype = ctypes.c_int32
        create.argtypes = [
            ctypes.c_void_p,
            _i64,
            ctypes.POINTER(_i64),
            ctypes.POINTER(_i64),
            _i64,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int32,
            ctypes.c_char_p,
            _i64,
        ]
        layouts = {name: _code(lib, function) for name, function in self._layouts.items()}
        host = _code(lib, "aoti_torch_device_type_cpu")  # torch's device for host memory: the mapped file
        made: dict[str, int] = {}
        for name, entry in self.index["models"][library].items():
            ndim = len(entry["shape"])
            if entry["layout"] not in layouts:
                raise RuntimeError(
                    f"constant {name!r} of {library} is in layout {entry['layout']!r}, which this wheel's target "
                    f"does not make (its layouts: {', '.join(layouts)})"
                )
            md = self._metadata(entry["md"]) if entry.get("md") else None
            handle = ctypes.c_void_p()
            code = create(
                self._address(entry["blob"]),
                ndim,
                (_i64 * max(ndim, 1))(*entry["shape"]),
                (_i64 * max(ndim, 1))(*entry["stride"]),
                entry["offset"],
                _code(lib, f"aoti_torch_dtype_{entry['dtype']}"),
                host,
                0,
                ctypes.byref(handle),
                layouts[entry["layout"]],
                md,
                len(md) if md else 0,
            )
            if code != 0 or handle.value is None:
                raise RuntimeError(f"could not make constant {name!r} of {library} from {BLOB_FILE} (error {code})")
            made[name] = handle.value
        return made

    def tensors(self, library: str) -> dict[str, Any]:
        """``handles()`` as torch tensors (for torch's runner); imports torch."""
        import torch

        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        capsule = ctypes.pythonapi.PyCapsule_New
        capsule.restype, capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        steal = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
        return {name: steal(capsule(handle, None, None)) for name, handle in self.handles(lib, library).items()}


def pairs(handles: dict[str, int]) -> tuple[ctypes.Array, list[bytes]]:
    """The handles as the C interface's (name, handle) array, and the names it points into (keep both alive)."""
    names = [name.encode() for name in handles]
    array = (_Pair * len(handles))(*(_Pair(name, handle) for name, handle in zip(names, handles.values())))
    return array, names


def _code(lib: ctypes.CDLL, function: str) -> int:
    getattr(lib, function).restype = ctypes.c_int32
    value: int = getattr(lib, function)()
    return value
