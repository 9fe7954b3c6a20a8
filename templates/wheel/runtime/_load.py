"""Load the compiled model: check the machine against the manifest, then open the .so directly.

Imports torch and nothing of its compiler stack (torch._inductor, torch._dynamo): opening the
.so costs milliseconds, importing the compiler about 1.5 s.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Mapping

import torch

from . import _cuda
from ._golden import GoldenMismatch, GoldenResult, describe_failures, run_golden
from ._inputs import check_inputs, make_inputs
from ._integrity import check_artifacts, check_files, weights_record
from ._manifest import ARTIFACTS_DIR, PACKAGE_DIR, artifacts_dir, check_runtime, manifest
from ._preload import load_cxx_runtime
from ._weights import WeightsMismatch, check_weights, load_into, read_weights


def _device(m: dict[str, Any], device: str | torch.device | None) -> str:
    """The device this wheel's model runs on: ``cpu`` for a CPU wheel, ``cuda:N`` for a CUDA one."""
    if m["target"] == "cuda":
        return _cuda.resolve_device(None if device is None else str(device))
    if device is not None and str(device) != "cpu":
        raise ValueError(f"device {str(device)!r}: {m['dist_name']} {m['full_version']} is a CPU build; install its CUDA wheel to run on a GPU")
    return "cpu"


def example_inputs(seed: int = 0, *, device: str | torch.device | None = None, **sizes: int) -> tuple[torch.Tensor, ...]:
    """Seeded inputs of the declared shapes, on the model's device (``cuda`` is the current GPU);
    dynamic dims default to their example size."""
    m = manifest()
    unknown = sorted(set(sizes) - set(m["dims"]))
    if unknown:
        raise ValueError(f"unknown dims {unknown}; this model's dynamic dims are {sorted(m['dims'])}")
    chosen = {name: dim["example"] for name, dim in m["dims"].items()} | sizes
    where = _device(m, device)
    tensors = [t.to(where) for t in make_inputs(m["inputs"], chosen, seed)]
    check_inputs(m["inputs"], m["dims"], tensors, where)
    return tuple(tensors)


def _weights_from(source: str | Path | Mapping[str, torch.Tensor], m: dict[str, Any], device: str) -> dict[str, torch.Tensor]:
    """Read (memory-mapped) and check a weights file or mapping against the manifest's tensors;
    on a GPU they are then copied to it."""
    if isinstance(source, Mapping):
        tensors, name = {k: v.detach().contiguous() for k, v in source.items()}, "the weights given"
    else:
        tensors, name = read_weights(source), str(source)
    check_weights(tensors, m["weights"]["tensors"], name)
    return {k: v.to(device) for k, v in tensors.items()}


def _open_runner(m: dict[str, Any], library: Path, device: str, num_models: int) -> Any:
    load_cxx_runtime()  # before any AOTInductor .so is opened: see _preload.py
    if m["target"] == "cuda":
        return _cuda.open_runner(library, ARTIFACTS_DIR, device, num_models)
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), num_models)


class CompiledModel:
    """Call it like the original module: tensors in, a tensor (or tuple of tensors) out."""

    def __init__(self, runner: Any, m: dict[str, Any], library: Path, device: str) -> None:
        self._runner = runner
        self._manifest = m
        self.library = library
        self.device = device
        self._swap_lock = threading.Lock()
        # The runner reads external weights straight from these tensors (user-managed, memory-mapped
        # from the file): keep the active and the previous set alive.
        self._held: tuple[dict[str, torch.Tensor], ...] = ()

    def _install(self, tensors: dict[str, torch.Tensor], *, inactive: bool) -> None:
        load_into(self._runner, tensors, inactive=inactive)
        self._held = (tensors, *self._held[:1])

    def swap_weights(self, weights: str | Path | Mapping[str, torch.Tensor]) -> None:
        """Switch to new weights without downtime: they are loaded into the second constant buffer,
        then swapped in. Each call runs wholly on the old or wholly on the new weights."""
        if not self._manifest["weights"]["external"]:
            raise WeightsMismatch(_EMBEDDED.format(**self._manifest))
        tensors = _weights_from(weights, self._manifest, self.device)
        with self._swap_lock:
            self._install(tensors, inactive=True)
            self._runner.swap_constant_buffer()

    def __call__(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        m = self._manifest
        check_inputs(m["inputs"], m["dims"], args, self.device)
        outputs = self._runner.run([arg.contiguous() for arg in args])
        return tuple(outputs) if m["returns_tuple"] else outputs[0]

    def __repr__(self) -> str:
        return f"<CompiledModel {self._manifest['dist_name']} {self._manifest['full_version']} on {self.device} from {self.library}>"


_EMBEDDED = (
    "{dist_name} {full_version} has its weights compiled into the .so; build it with "
    "[weights] external = true to load or swap other weights"
)


def load(num_models: int = 1, weights: str | Path | Mapping[str, torch.Tensor] | None = None,
         device: str | torch.device | None = None) -> CompiledModel:
    """Open the compiled model. ``num_models`` is how many calls may run concurrently; ``weights``
    (a safetensors file or a name -> tensor mapping) replaces the packaged weights when they are
    external; ``device`` picks a GPU for a CUDA wheel (``"cuda:1"``; default: the current one)."""
    m = manifest()
    external = m["weights"]["external"]
    if weights is not None and not external:
        raise WeightsMismatch(_EMBEDDED.format(**m))
    where = _device(m, device)
    gpu_problems = _cuda.problems(m, device=where, **_cuda.device_facts(where)) if m["target"] == "cuda" else []
    check_runtime(m, torch.__version__, torch.backends.cpu.get_cpu_capability(), gpu_problems)
    tensors = None
    if external:
        if weights is None:
            check_files(PACKAGE_DIR, {m["weights"]["file"]: weights_record(m)})
            weights = PACKAGE_DIR / m["weights"]["file"]
        tensors = _weights_from(weights, m, where)  # checked before anything is loaded
    directory = artifacts_dir()
    check_artifacts(directory, m)
    library = directory / m["library"]
    model = CompiledModel(_open_runner(m, library, where, num_models), m, library, where)
    if tensors is not None:
        model._install(tensors, inactive=False)
    return model


def verify(model: CompiledModel | None = None) -> list[GoldenResult]:
    """Re-run the golden cases recorded at build time; raise GoldenMismatch naming any output off."""
    m = manifest()
    check_files(PACKAGE_DIR, {m["golden"]["file"]: m["golden"]}, full=True)
    model = model or load()
    # the golden outputs were recorded under the build's reference settings (TF32 off on a GPU)
    settings = _cuda.exact_float32() if m["target"] == "cuda" else contextlib.nullcontext()
    with settings:
        results = run_golden(model, m, PACKAGE_DIR / m["golden"]["file"], model.device)
    failures = describe_failures(results)
    if failures:
        raise GoldenMismatch(f"{m['dist_name']} {m['full_version']} differs from its golden outputs:\n{failures}")
    return results
