"""Run the compiled model without importing torch: numpy arrays in, numpy arrays out.

``import torch`` costs about a second, nearly all of it Python modules the compiled model never
uses. The .so needs only libtorch_cpu (its kernels call ATen through AOTInductor's C shim), so
this loader opens that library and the model with ctypes and calls the model container's C ABI
(torch/csrc/inductor/aoti_runtime/interface.h), the same entry points torch's own runner uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import _describe, _dispatch, _targets
from ._constants import Store, pairs
from ._deps import require
from ._inputs import check_count, check_sizes, example_sizes, make_arrays, resolve_shape
from ._integrity import opened_verified
from ._malloc import keep_freed_memory
from ._manifest import NativeRuntimeError, manifest
from ._open import checked
from ._preload import load_cxx_runtime
from ._schema import Manifest

if TYPE_CHECKING:
    import numpy as np
else:  # numpy through require(): its absence is an error that says what needs it and how to install it
    np = require("numpy", "numpy", "load_numpy() (numpy arrays in and out)")

_handle = ctypes.c_void_p
_NUMPY_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
_libtorch: ctypes.CDLL | None = None
_libtorch_lock = threading.Lock()


def _torch_dir() -> Path:
    found = importlib.util.find_spec("torch")  # locates the package without importing it
    if found is None or not found.submodule_search_locations:
        raise NativeRuntimeError("torch is not installed: `pip install` this wheel again to get the torch it pins")
    return Path(list(found.submodule_search_locations)[0])


def torch_version() -> str:
    """torch.__version__, read from torch/version.py without importing torch."""
    namespace: dict[str, Any] = {}
    exec((_torch_dir() / "version.py").read_text(encoding="utf-8"), namespace)  # a generated file of constants
    return str(namespace["__version__"])


def _open_libtorch() -> ctypes.CDLL:
    global _libtorch
    with _libtorch_lock:
        if _libtorch is None:
            path = _torch_dir() / "lib" / "libtorch_cpu.so"
            try:
                # RTLD_GLOBAL: the model's .so resolves ATen and the C shim from this copy.
                lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise NativeRuntimeError(f"cannot open {path}: {exc}") from None
            _declare_shim(lib)
            _libtorch = lib
        return _libtorch


def _declare_shim(lib: ctypes.CDLL) -> None:
    i32, i64, p_i64 = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
    signatures = {
        "aoti_torch_create_tensor_from_blob": [
            ctypes.c_void_p,
            i64,
            p_i64,
            p_i64,
            i64,
            i32,
            i32,
            i32,
            ctypes.POINTER(_handle),
        ],
        "aoti_torch_delete_tensor_object": [_handle],
        "aoti_torch_get_data_ptr": [_handle, ctypes.POINTER(ctypes.c_void_p)],
        "aoti_torch_get_dim": [_handle, p_i64],
        "aoti_torch_get_sizes": [_handle, ctypes.POINTER(p_i64)],
        "aoti_torch_get_strides": [_handle, ctypes.POINTER(p_i64)],
        "aoti_torch_get_dtype": [_handle, ctypes.POINTER(i32)],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, i32
    lib.aoti_torch_device_type_cpu.restype = i32


def _dtype_codes(lib: ctypes.CDLL) -> dict[str, int]:
    """numpy dtype name -> torch's dtype code (aoti_torch_dtype_*)."""
    codes = {}
    for name in _NUMPY_DTYPES:
        function = getattr(lib, f"aoti_torch_dtype_{name}")
        function.restype = ctypes.c_int32
        codes[name] = function()
    return codes


class _OutputTensor:
    """Owns one output handle; a numpy array made from it keeps it (and its memory) alive."""

    def __init__(self, lib: ctypes.CDLL, handle: int | None) -> None:
        self._lib, self._handle = lib, handle

    def view(self, dtypes_by_code: dict[int, np.dtype]) -> np.ndarray:
        lib, handle = self._lib, self._handle
        code, data, ndim = ctypes.c_int32(), ctypes.c_void_p(), ctypes.c_int64()
        sizes, strides = ctypes.POINTER(ctypes.c_int64)(), ctypes.POINTER(ctypes.c_int64)()
        _check(lib.aoti_torch_get_dtype(handle, ctypes.byref(code)), "reading an output")
        _check(lib.aoti_torch_get_data_ptr(handle, ctypes.byref(data)), "reading an output")
        _check(lib.aoti_torch_get_dim(handle, ctypes.byref(ndim)), "reading an output")
        _check(lib.aoti_torch_get_sizes(handle, ctypes.byref(sizes)), "reading an output")
        _check(lib.aoti_torch_get_strides(handle, ctypes.byref(strides)), "reading an output")
        if code.value not in dtypes_by_code:
            raise NativeRuntimeError("an output's dtype has no numpy type: use load()")
        dtype = dtypes_by_code[code.value]
        self.__array_interface__ = {
            "version": 3,
            "typestr": dtype.str,
            "shape": tuple(sizes[i] for i in range(ndim.value)),
            "strides": tuple(strides[i] * dtype.itemsize for i in range(ndim.value)),
            "data": (data.value or 0, False),
        }
        return np.asarray(self)

    def __del__(self) -> None:
        if self._handle:
            self._lib.aoti_torch_delete_tensor_object(self._handle)


def _check(code: int, what: str) -> None:
    if code != 0:
        raise NativeRuntimeError(f"the model's C interface failed while {what} (error {code})")


def _check_array(spec: Mapping[str, Any], arg: object) -> None:
    """Refuse what no conversion can make right: not an array, a masked array, another dtype."""
    name = spec["name"]
    if not isinstance(arg, np.ndarray):
        # a newcomer passed load_numpy() the example_inputs() of the README's load() line: torch tensors
        tensor = (
            " (a torch tensor: pass t.numpy(), make arrays with example_arrays(), or use load())"
            if type(arg).__name__ == "Tensor"
            else ""
        )
        raise ValueError(f"input {name!r}: expected a numpy.ndarray, got {type(arg).__name__}{tensor}")
    if isinstance(arg, np.ma.MaskedArray):
        # The C interface sees the data under the mask, never the mask itself.
        raise ValueError(f"input {name!r}: expected a plain numpy.ndarray, got a masked array: pass a.filled(value)")
    if arg.dtype.name != spec["dtype"]:
        raise ValueError(f"input {name!r}: expected dtype {spec['dtype']}, got {arg.dtype.name}")


def _as_c_abi_array(array: np.ndarray) -> np.ndarray:
    """The array as the C interface reads it: native byte order, aligned, C order, a plain ndarray.

    Copies only when one of these is missing (a big-endian '>f4' array would otherwise be read
    as wrong numbers). A read-only array is passed as it is: the model only reads its inputs,
    and an output that shares an input's memory is copied before it is returned."""
    native = array.dtype if array.dtype.isnative else array.dtype.newbyteorder("=")  # an equal dtype would still copy
    return np.require(array, dtype=native, requirements=["C_CONTIGUOUS", "ALIGNED", "ENSUREARRAY"])


class NumpyModel:
    """Call it like the original module, with numpy arrays: arrays in, an array (or tuple) out.

    Outputs are the model's own buffers, handed over without a copy; each call returns new ones.
    """

    # Set from the manifest when this module is imported (_describe.py), with named(outputs) -> dict
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def __init__(
        self,
        m: Manifest,
        library: Path,
        num_models: int,
        static: dict[int, Path] | None = None,
        store: tuple[Store, str] | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        """``record``: the .so's sha256 and size: it is opened once, checked, and loaded through
        that descriptor, so the file checked is the file loaded."""
        self._manifest = m
        self.library = library
        self._constants: dict[str, int] = {}
        # One model per static batch size, each called by route(); last_library: the latest call's .so.
        names = _dispatch.static_library_names(m)
        self._static = {
            size: NumpyModel(
                m, path, num_models, store=store and (store[0], names[size]), record=m["artifacts"][names[size]]
            )
            for size, path in (static or {}).items()
        }
        self.last_library: Path | None = None
        self._lib = _open_libtorch()
        self._codes = _dtype_codes(self._lib)
        self._dtypes_by_code = {code: np.dtype(_NUMPY_DTYPES[name]) for name, code in self._codes.items()}
        self._cpu = self._lib.aoti_torch_device_type_cpu()
        load_cxx_runtime()  # before any AOTInductor .so is opened: see _preload.py
        keep_freed_memory()  # each call's buffers reused, not faulted in again: see _malloc.py
        try:
            with (
                opened_verified(library, record, hold_open=True)
                if record
                else contextlib.nullcontext(str(library)) as loadable
            ):
                self._model = ctypes.CDLL(loadable)
        except OSError as exc:
            raise NativeRuntimeError(f"cannot open {library}: {exc}") from None
        self._container = _handle()
        self._call(
            "AOTInductorModelContainerCreateWithDevice",
            "opening the model",
            ctypes.byref(self._container),
            ctypes.c_size_t(num_models),
            m["device"].encode(),
            None,
        )
        count = ctypes.c_size_t()
        self._call("AOTInductorModelContainerGetNumOutputs", "reading the model", self._container, ctypes.byref(count))
        self._num_outputs = count.value
        if store is not None:  # the constants, shared by the static sizes' models, outside the .so
            self._store = store[0]
            self._constants = store[0].handles(self._lib, store[1])
            array, self._constant_names = pairs(self._constants)
            self._call(
                "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
                "handing over the constants",
                self._container,
                array,
                ctypes.c_size_t(len(self._constants)),
                ctypes.c_bool(False),
                ctypes.c_bool(True),
            )

    def _call(self, name: str, what: str, *args: Any) -> None:
        code = getattr(self._model, name)(*args)
        if code != 0:
            message = ctypes.c_char_p()
            self._model.AOTInductorGetLastError(ctypes.byref(message))
            detail = (message.value or b"").decode(errors="replace").strip()
            raise NativeRuntimeError(f"{self._manifest['dist_name']}: {what} failed: {detail or f'error {code}'}")

    def _input_handle(self, array: np.ndarray) -> ctypes.c_void_p:
        sizes = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        strides = (ctypes.c_int64 * max(array.ndim, 1))(*(s // array.itemsize for s in array.strides))
        handle = _handle()
        _check(
            self._lib.aoti_torch_create_tensor_from_blob(
                array.ctypes.data,
                array.ndim,
                sizes,
                strides,
                0,
                self._codes[array.dtype.name],
                self._cpu,
                0,
                ctypes.byref(handle),
            ),
            "passing an input",
        )
        return handle

    def _checked(self, args: tuple[Any, ...]) -> list[np.ndarray]:
        inputs = self._manifest["inputs"]
        check_count(inputs, len(args), "arrays")
        for spec, arg in zip(inputs, args):
            _check_array(spec, arg)
        # Shapes as the caller gave them: a conversion below must not hide a 0-d array's rank.
        check_sizes(inputs, self._manifest["dims"], [a.shape for a in args])
        return [_as_c_abi_array(a) for a in args]

    def route(self, batch: int) -> str:
        """Which compiled model runs a batch of this size (as CompiledModel.route)."""
        return _dispatch.describe(self._manifest, batch)

    def __call__(self, *args: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the model on its inputs (numpy arrays), by position."""
        arrays = self._checked(args)
        model, batch, runs_at = self, 0, 0
        if self._static:
            batch = arrays[0].shape[0]
            size, runs_at = _dispatch.route(self._manifest, batch)
            model = self._static[size] if size is not None else self
        self.last_library = model.library
        if runs_at != batch:  # padded: repeat the last sample, then slice the outputs back
            arrays = _dispatch.pad(arrays, runs_at, np.concatenate)
            results = tuple(r[:batch] for r in model._run(arrays))
        else:
            results = model._run(arrays)
        return results if self._manifest["returns_tuple"] else results[0]

    def _run(self, arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        # ``arrays`` are kept alive until the call returns: the handles borrow their memory
        handles = (_handle * len(arrays))(*(self._input_handle(a) for a in arrays))  # the run takes ownership
        outputs = (_handle * self._num_outputs)()
        self._call(
            "AOTInductorModelContainerRun",
            "running the model",
            self._container,
            handles,
            ctypes.c_size_t(len(arrays)),
            outputs,
            ctypes.c_size_t(self._num_outputs),
            None,
            None,
        )
        owned = [_OutputTensor(self._lib, handle) for handle in outputs]  # freed with their arrays
        return tuple(self._own_copy_if_aliased(o.view(self._dtypes_by_code), arrays) for o in owned)

    @staticmethod
    def _own_copy_if_aliased(result: np.ndarray, arrays: list[np.ndarray]) -> np.ndarray:
        # An output the model passes through unchanged shares an input's memory, which may be a
        # temporary contiguous copy made above: give the caller its own.
        return result.copy() if any(np.shares_memory(result, a) for a in arrays) else result

    def close(self) -> None:
        """Free the model (also done when the object is collected)."""
        for model in getattr(self, "_static", {}).values():
            model.close()
        if getattr(self, "_container", None):
            self._model.AOTInductorModelContainerDelete(self._container)
            self._container = _handle()
        for handle in getattr(self, "_constants", {}).values():  # after the model that used them
            self._lib.aoti_torch_delete_tensor_object(handle)
        self._constants = {}

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NumpyModel {self._manifest['dist_name']} {self._manifest['full_version']} from {self.library}>"


_describe.describe(NumpyModel, manifest(), "arrays")  # input_names, output_names, help(model)


def example_arrays(seed: int = 0, **sizes: int) -> tuple[np.ndarray, ...]:
    """example_inputs() for load_numpy(): seeded numpy arrays of the declared shapes, dtypes and
    bounds, made without torch (numpy's generator: other numbers than the tensors of that seed)."""
    m = manifest()
    chosen = example_sizes(m["dims"], sizes)
    check_sizes(m["inputs"], m["dims"], [resolve_shape(spec["shape"], chosen) for spec in m["inputs"]])
    return tuple(make_arrays(m["inputs"], chosen, seed))


def load_numpy(num_models: int = 1) -> NumpyModel:
    """Open the compiled model without importing torch; call it with numpy arrays.

    For processes that do not otherwise use PyTorch: start-up skips ``import torch`` (about a
    second). Models with external weights need ``load()``, which can hand the weights over."""
    m = manifest()
    target = _targets.for_manifest(m)
    if not target.NUMPY:
        raise NativeRuntimeError(
            f"{m['dist_name']} {m['full_version']} is a {m['target'].upper()} build; "
            "load_numpy() runs CPU builds only: use load()"
        )
    if m["weights"]["external"]:
        raise NativeRuntimeError(
            f"{m['dist_name']} {m['full_version']} keeps its weights outside the .so; load_numpy() runs models "
            "with embedded weights only: use load()"
        )
    unsupported = [spec["name"] for spec in m["inputs"] if spec["dtype"] not in _NUMPY_DTYPES]
    if unsupported:
        raise NativeRuntimeError(f"inputs {unsupported} have dtypes numpy has no type for: use load()")
    # the target's own needs, read without torch (a CPU wheel's: the CPU kind its kernels need)
    files = checked(m, torch_version(), target, cast(_targets.NumpyTarget, target).problems_without_torch(m))
    store = (files.store, m["library"]) if files.store is not None else None
    return NumpyModel(m, files.library, num_models, files.static, store, record=m["artifacts"][m["library"]])
