"""A compiled PyTorch model packaged by modelwheel.

    model = load()                       # opens the AOTInductor .so (a CUDA wheel's through its /opt link)
    outputs = model(*example_inputs())   # tensors in, tensors out
    manifest()                           # torch version, target, input specs, tolerances, hashes
    verify()                             # re-run the golden cases recorded at build time
    load(weights="finetune.safetensors") # other weights, when built with [weights] external = true
    model.swap_weights("v2.safetensors") # switch weights in place, without downtime
    fast = load_numpy()                  # numpy arrays in and out, without importing torch
    fast(*example_arrays())              # example inputs as numpy arrays, made without torch
    lazy = lazy_load(numpy=True)         # serving: loads on first use in each process (fork-safe)
    DynamicBatcher(lazy)                 # serving: concurrent requests batched up to the built max
    ModelThreads(lazy)                   # serving: an asyncio server's calls, on the model's own thread

Importing this package imports neither torch nor numpy: ``load_numpy()`` users never pay for
torch, ``load()`` users need no numpy, and each loads on first use.
"""

from importlib import import_module
from typing import Any

from ._deps import MissingDependency
from ._integrity import IntegrityError
from ._manifest import ArtifactLinkWarning, IncompatibleRuntime, NativeRuntimeError, UntrustedPathWarning, manifest

# name -> the module defining it; these import torch (or numpy: NumpyModel), so they load when first asked for
_TORCH_SIDE = {
    "CompiledModel": "._load",
    "example_inputs": "._load",
    "load": "._load",
    "verify": "._load",
    "GoldenMismatch": "._golden",
    "WeightsMismatch": "._weights",
    "NumpyModel": "._native",
    "example_arrays": "._native",
    "GraphCaptureWarning": "._graphs",
}
# the serving helpers (docs/serving.md): they import asyncio, and torch or numpy only when called
_SERVING = {
    name: "._serving"
    for name in (
        "DynamicBatcher",
        "LazyModel",
        "ModelThreads",
        "RequestError",
        "check_request",
        "max_batch",
        "max_request_bytes",
        "read_npz",
        "run_batch",
    )
}

__all__ = [
    "ArtifactLinkWarning",
    "CompiledModel",
    "DynamicBatcher",
    "GoldenMismatch",
    "GraphCaptureWarning",
    "IncompatibleRuntime",
    "IntegrityError",
    "LazyModel",
    "MissingDependency",
    "ModelThreads",
    "NativeRuntimeError",
    "NumpyModel",
    "RequestError",
    "UntrustedPathWarning",
    "WeightsMismatch",
    "check_request",
    "example_arrays",
    "example_inputs",
    "lazy_load",
    "load",
    "load_numpy",
    "manifest",
    "max_batch",
    "max_request_bytes",
    "read_npz",
    "run_batch",
    "verify",
]


def load_numpy(num_models: int = 1) -> Any:
    """Open the compiled model without importing torch; call it with numpy arrays (see
    ``_native.load_numpy``). Without numpy installed it raises MissingDependency."""
    from ._native import load_numpy as load_with_numpy

    return load_with_numpy(num_models)


def lazy_load(num_models: int = 1, numpy: bool = False, **options: Any) -> Any:
    """A ``LazyModel``: ``load(num_models, **options)`` (or ``load_numpy(num_models)``) run on first
    use in each process, so it may be made before a server forks its workers (docs/serving.md).
    ``options``: load()'s keywords (a CUDA wheel's ``cuda_graphs``, ``copy_outputs``, ``device``)."""
    from ._serving import LazyModel

    def open_model() -> Any:
        return load_numpy(num_models) if numpy else __getattr__("load")(num_models, **options)

    return LazyModel(open_model)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read on first use: a damaged manifest fails load(), not the import
        return manifest()["full_version"]
    if name in _TORCH_SIDE or name in _SERVING:
        value = getattr(import_module({**_TORCH_SIDE, **_SERVING}[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_SIDE) | set(_SERVING))
