"""One constants store for several compiled models: the weights of a model built with static batch
sizes, shared by its dynamic and static .so files.

Freezing, which gives static sizes their speed, folds the weights into new constants (named
``_frozen_paramN``, some packed into layouts of the target's own), so a state-dict file cannot
feed them, and AOTInductor's own ways to keep constants outside the .so cannot either
(``binary_blob`` is one file per .so; the CPU's packed weights: targets/cpu_constants.py). So each
such model is compiled with ``package_constants_in_so = False``, its constants are taken from the
compile (the graph AOTInductor serialises), and stored by content: every distinct run of bytes
once, 64-byte aligned, in ``constants.bin``, and per model and constant its blob, dtype, shape,
strides and, for a layout of the target's own (its ``packed_constant``), what describes it, in
``constants.json``. The wheel's ``_constants.py`` maps the file and hands the constants to each model.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import CompileError
from ..spec import Spec
from ..targets import Compiling, Target

OPTION = "aot_inductor.package_constants_in_so"
INDEX_FILE, BLOB_FILE = "constants.json", "constants.bin"
ALIGN = 64  # what AOTInductor's own constant blob aligns to; packed layouts' kernels expect it too
FORMAT = 1


@contextlib.contextmanager
def captured() -> Iterator[dict[str, torch.Tensor]]:
    """The constants AOTInductor serialises (name -> tensor, packed ones included), taken from
    the graph it hands to its code compiler. A private hook: a torch that no longer calls it is
    named in the error rather than giving a model without weights."""
    from torch._inductor.codecache import AotCodeCompiler  # heavy: Inductor, imported once a compile runs

    original = AotCodeCompiler.__dict__["compile"]
    found: dict[str, torch.Tensor] = {}
    bound = AotCodeCompiler.compile

    def compile_and_capture(graph: Any, *args: Any, **kwargs: Any) -> Any:  # graph: Inductor's GraphLowering
        found.update(
            {
                name: graph.get_original_value_of_constant(name)
                for name in graph.constants
                if name not in graph.folded_constants
            }
        )
        found["__captured__"] = torch.empty(0)
        return bound(graph, *args, **kwargs)

    # torch's private class, patched for the one compile: mypy refuses assigning to a method
    AotCodeCompiler.compile = compile_and_capture  # type: ignore[method-assign]
    try:
        yield found
    finally:
        AotCodeCompiler.compile = original  # type: ignore[method-assign]
    if found.pop("__captured__", None) is None:
        raise CompileError(
            f"could not take the compiled model's constants from torch {torch.__version__} "
            f"(torch._inductor.codecache.AotCodeCompiler.compile was not called)",
            "static batch sizes with embedded weights need a torch this pipeline supports (2.11 to 2.14)",
        )


def _raw(tensor: torch.Tensor, target: Compiling) -> tuple[bytes, dict]:
    """The tensor's bytes and what rebuilds it from them: the target's, for a layout of its own."""
    packed = target.packed_constant(tensor)
    if packed is not None:
        return packed
    storage = tensor.untyped_storage()
    cpu = storage.cpu()  # itself when already in host memory
    data = bytes((ctypes.c_ubyte * cpu.nbytes()).from_address(cpu.data_ptr())) if cpu.nbytes() else b""
    return data, {
        "layout": "strided",
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "stride": list(tensor.stride()),
        "offset": tensor.storage_offset(),
    }


class Writer:
    """Collects models' constants, each distinct blob once; ``write`` puts the store in a folder."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.models: dict[str, dict[str, dict]] = {}

    def _blob(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(key, data)
        return key

    def add(self, library: str, tensors: dict[str, torch.Tensor], target: Compiling) -> None:
        entries = {}
        for name, tensor in sorted(tensors.items()):
            data, entry = _raw(tensor, target)
            entry["blob"] = self._blob(data)
            if "md" in entry:  # a packed layout's description: a blob of its own
                entry["md"] = self._blob(entry["md"])
            entries[name] = entry
        self.models[library] = entries

    def merge(self, folder: Path, library: str) -> None:
        """Add the one model of the store in ``folder`` (as compile wrote it) under the name ``library``."""
        index = json.loads((folder / INDEX_FILE).read_text())
        data = (folder / BLOB_FILE).read_bytes()
        for key, where in index["blobs"].items():
            self.blobs.setdefault(key, data[where["offset"] : where["offset"] + where["size"]])
        (entries,) = index["models"].values()
        self.models[library] = entries

    def write(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        offsets, offset = {}, 0
        with (folder / BLOB_FILE).open("wb") as out:
            for key in sorted(self.blobs):  # sorted: the same inputs give the same bytes
                padding = -offset % ALIGN
                out.write(b"\0" * padding)
                offset += padding
                offsets[key] = {"offset": offset, "size": len(self.blobs[key])}
                out.write(self.blobs[key])
                offset += len(self.blobs[key])
        index = {"format": FORMAT, "blobs": offsets, "models": self.models}
        (folder / INDEX_FILE).write_text(json.dumps(index, sort_keys=True) + "\n")
        return folder / INDEX_FILE, folder / BLOB_FILE


def shared(target: Target, spec: Spec) -> bool:
    """Whether this build's models keep their constants in one shared store: static batch sizes,
    embedded weights (external ones are a state-dict file every size reads already), on a target
    whose runtime can hand constants over (SHARED_CONSTANTS: the CPU's)."""
    return bool(spec.static_dim) and not spec.weights.external and target.SHARED_CONSTANTS
