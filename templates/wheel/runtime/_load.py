"""Load the compiled model: check the machine against the manifest, then open the .so directly.

Imports torch and nothing of its compiler stack (torch._inductor, torch._dynamo): opening the
.so costs milliseconds, importing the compiler about 1.5 s.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch

from . import _describe, _dispatch, _targets
from ._constants import Store
from ._direct import DirectRunner, DirectUnavailable
from ._golden import GoldenMismatch, GoldenResult, describe_failures, run_golden
from ._graphs import GraphCaptureWarning, GraphRunner
from ._inputs import check_inputs, check_sizes, example_sizes, make_inputs, resolve_shape
from ._integrity import opened_verified, weights_record
from ._manifest import ARTIFACTS_DIR, PACKAGE_DIR, manifest
from ._open import checked
from ._preload import load_cxx_runtime
from ._schema import Manifest
from ._weights import WeightsMismatch, check_weights, load_into, read_weights


def _device(m: Manifest, device: str | torch.device | None) -> str:
    """The device this wheel's model runs on, as its target resolves it (``cpu``, ``cuda:N``)."""
    try:
        return _targets.for_manifest(m).device(None if device is None else str(device))
    except ValueError as exc:
        raise ValueError(f"{m['dist_name']} {m['full_version']}: {exc}") from None


def example_inputs(
    seed: int = 0, *, device: str | torch.device | None = None, **sizes: int
) -> tuple[torch.Tensor, ...]:
    """Seeded inputs of the declared shapes, on the model's device (``cuda`` is the current GPU);
    dynamic dims default to their example size."""
    m = manifest()
    chosen = example_sizes(m["dims"], sizes)
    # The sizes first, before any tensor is made: batch=10**6 filled 770 MB before it was refused.
    check_sizes(m["inputs"], m["dims"], [resolve_shape(spec["shape"], chosen) for spec in m["inputs"]])
    where = _device(m, device)
    tensors = [t.to(where) for t in make_inputs(m["inputs"], chosen, seed)]
    check_inputs(m["inputs"], m["dims"], tensors, where)
    return tuple(tensors)


def _weights_from(source: str | Path | Mapping[str, torch.Tensor], m: Manifest, device: str) -> dict[str, torch.Tensor]:
    """Read (memory-mapped) and check a weights file or mapping against the manifest's tensors;
    on a GPU they are then copied to it."""
    if isinstance(source, Mapping):
        tensors, name = {k: v.detach().contiguous() for k, v in source.items()}, "the weights given"
    else:
        tensors, name = read_weights(source), str(source)
    check_weights(tensors, m["weights"]["tensors"], name)
    return {k: v.to(device) for k, v in tensors.items()}


def _open_runner(
    m: Manifest,
    library: Path,
    device: str,
    num_models: int,
    kernels: Path = ARTIFACTS_DIR,
    record: Mapping[str, Any] | None = None,
    graphs: Any = None,
    copy_outputs: bool = True,
) -> Any:
    """``kernels``: where a CUDA .so's kernel files are (a static size's: its own folder).
    ``record``: the .so's sha256 and size: it is opened once, checked, and loaded through that
    descriptor, so the file checked is the file loaded. ``graphs``: a _graphs.GraphBackend: the
    .so is opened through its single-threaded entry point and its calls replay graphs."""
    load_cxx_runtime()  # before any AOTInductor .so is opened: see _preload.py
    target = _targets.for_manifest(m)
    with (
        opened_verified(library, record, hold_open=True) if record else contextlib.nullcontext(str(library))
    ) as loadable:
        if graphs is not None:
            try:
                direct = DirectRunner(
                    Path(loadable),
                    device,
                    kernels,
                    cast(_targets.GraphTarget, target).stream(device),
                    constants=bool(m["weights"]["external"] or m.get("constants")),
                )
                return GraphRunner(direct, graphs, f"{m['dist_name']} {m['full_version']}", copy_outputs=copy_outputs)
            except DirectUnavailable as exc:  # an older torch's .so: torch's runner, as without graphs
                warnings.warn(
                    f"{m['dist_name']} {m['full_version']}: {exc}; it runs without CUDA graphs",
                    GraphCaptureWarning,
                    stacklevel=3,
                )
        return target.open_runner(Path(loadable), kernels, device, num_models)


_BY_BATCH = -1  # CompiledModel._run: pick the model by the batch of the call


class CompiledModel:
    """Call it like the original module: tensors in, a tensor (or tuple of tensors) out.

    With static batch sizes, each call runs on the model compiled for its batch (see
    ``route()``); ``last_library`` is the .so that ran the latest call."""

    # Set from the manifest when this module is imported (_describe.py), with named(outputs) -> dict
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def __init__(
        self, runner: Any, m: Manifest, library: Path, device: str, static: dict[int, tuple[Any, Path]] | None = None
    ) -> None:
        self._runner = runner
        self._manifest = m
        self.library = library
        self.device = device
        self._static = static or {}
        self.graphs_off: str | None = None  # why calls run without CUDA graphs (load sets it)
        self._store: Store | None = None  # static sizes' shared constants: the runners read its mapped file
        self.last_library: Path | None = None
        self._swap_lock = threading.Lock()
        # The runner reads external weights straight from these tensors (user-managed, memory-mapped
        # from the file): keep the active and the previous set alive.
        self._held: tuple[dict[str, torch.Tensor], ...] = ()

    def _runners(self) -> list[Any]:
        return [self._runner, *(runner for runner, _ in self._static.values())]

    def _install(self, tensors: dict[str, torch.Tensor], *, inactive: bool) -> None:
        for runner in self._runners():  # every size reads the one set of weights
            load_into(runner, tensors, inactive=inactive)
        self._held = (tensors, *self._held[:1])

    def swap_weights(self, weights: str | Path | Mapping[str, torch.Tensor]) -> None:
        """Switch to new weights without downtime: they are loaded into the second constant buffer,
        then swapped in. Each call runs wholly on the old or wholly on the new weights."""
        if not self._manifest["weights"]["external"]:
            raise WeightsMismatch(_EMBEDDED.format(**self._manifest))
        tensors = _weights_from(weights, self._manifest, self.device)
        with self._swap_lock:
            self._install(tensors, inactive=True)
            for runner in self._runners():
                runner.swap_constant_buffer()

    def route(self, batch: int) -> str:
        """Which compiled model runs a batch of this size: ``dynamic``, ``static batch=4``, or
        ``static batch=4 (padded from 3)``."""
        return _dispatch.describe(self._manifest, batch)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run the model on its inputs, by position."""
        m = self._manifest
        check_inputs(m["inputs"], m["dims"], args, self.device)
        outputs = self._run([arg.contiguous() for arg in args])
        return tuple(outputs) if m["returns_tuple"] else outputs[0]

    def _run(self, args: list[torch.Tensor], size: int | None = _BY_BATCH) -> list[torch.Tensor]:
        """On the model for the batch of ``args`` (or on static ``size``; None: the dynamic model)."""
        batch = args[0].shape[0] if self._static else 0
        runs_at = batch
        if size == _BY_BATCH:
            size, runs_at = _dispatch.route(self._manifest, batch) if self._static else (None, batch)
        runner, self.last_library = self._static[size] if size is not None else (self._runner, self.library)
        if runs_at != batch:  # padded: repeat the last sample, then slice the outputs back
            args = _dispatch.pad(args, runs_at, torch.cat)
            return [o[:batch] for o in runner.run(args)]
        outputs: list[torch.Tensor] = runner.run(args)
        return outputs

    @property
    def copy_outputs(self) -> bool:
        """False when calls hand back the CUDA graph's own output tensors (load(copy_outputs=False)),
        which the next call overwrites."""
        return getattr(self._runner, "copy_outputs", True)

    def info(self) -> dict[str, Any]:
        """Which path calls run on: ``{"path": "CUDA graphs", "graphs": [input shapes captured],
        ...}``, the single-threaded entry point after a capture failed (``"refused"`` says why), or
        torch's AOTInductor runner (``"graphs_off"`` says why)."""
        where = {"target": self._manifest["target"], "device": self.device}
        if isinstance(self._runner, GraphRunner):
            return (
                where
                | self._runner.info()
                | {"static": {size: runner.info() for size, (runner, _) in self._static.items()}}
            )
        return where | {"path": "AOTInductor runner", "graphs_off": self.graphs_off}

    def __repr__(self) -> str:
        return (
            f"<CompiledModel {self._manifest['dist_name']} {self._manifest['full_version']} "
            f"on {self.device} from {self.library}>"
        )


_describe.describe(CompiledModel, manifest(), "tensors")  # input_names, output_names, help(model)

_EMBEDDED = (
    "{dist_name} {full_version} has its weights compiled into the .so; build it with "
    "[weights] external = true to load or swap other weights"
)


def load(
    num_models: int = 1,
    weights: str | Path | Mapping[str, torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    *,
    cuda_graphs: bool | None = None,
    copy_outputs: bool = True,
) -> CompiledModel:
    """Open the compiled model. ``num_models`` is how many calls may run concurrently; ``weights``
    (a safetensors file or a name -> tensor mapping) replaces the packaged weights when they are
    external; ``device`` picks a GPU for a CUDA wheel (``"cuda:1"``; default: the current one).

    A CUDA wheel replays a CUDA graph per input shape (docs/cuda.md): ``cuda_graphs=False``, or
    MODELWHEEL_CUDA_GRAPHS=0 in the environment, runs torch's runner instead; ``copy_outputs=False``
    returns the graph's own output tensors, overwritten by the next call."""
    m = manifest()
    external = m["weights"]["external"]
    if weights is not None and not external:
        raise WeightsMismatch(_EMBEDDED.format(**m))
    where = _device(m, device)
    target = _targets.for_manifest(m)
    graphs_off = _targets.graphs_off(target, m["target"], cuda_graphs)
    files = checked(m, torch.__version__, target, target.problems_here(m, where))
    tensors = None
    if external:
        if weights is None:  # the packaged file: read (memory-mapped) through the descriptor its hash was checked on
            with opened_verified(PACKAGE_DIR / m["weights"]["file"], weights_record(m)) as opened:
                tensors = _weights_from(Path(opened), m, where)
        else:
            tensors = _weights_from(weights, m, where)  # checked before any model is opened
    directory, library = files.directory, files.library
    names = _dispatch.static_library_names(m)
    # one backend: one memory pool for every graph of the model
    graphs = None if graphs_off else cast(_targets.GraphTarget, target).graph_backend(where)
    static = {
        size: (
            _open_runner(
                m,
                path,
                where,
                num_models,
                ARTIFACTS_DIR / path.parent.name,
                record=m["artifacts"][names[size]],
                graphs=graphs,
                copy_outputs=copy_outputs,
            ),
            path,
        )
        for size, path in files.static.items()
    }
    runner = _open_runner(
        m, library, where, num_models, record=m["artifacts"][m["library"]], graphs=graphs, copy_outputs=copy_outputs
    )
    model = CompiledModel(runner, m, library, where, static)
    model.graphs_off = (
        graphs_off
        if graphs_off or isinstance(runner, GraphRunner)
        else "the .so cannot be called through its single-threaded entry point (the GraphCaptureWarning says why)"
    )
    if files.store is not None:  # static batch sizes: the models' constants, shared, outside the .so files
        model._store = files.store
        for runner, path in [(model._runner, library), *static.values()]:
            runner.update_constant_buffer(
                model._store.tensors(path.relative_to(directory).as_posix()), False, True, True
            )
    if tensors is not None:
        model._install(tensors, inactive=False)
    _capture_static(model)
    return model


def _capture_static(model: CompiledModel) -> None:
    """Each static size's graph, captured now on seeded inputs of its size: the first call of
    that size replays it at once."""
    m = model._manifest
    for size, (runner, _) in model._static.items():
        if isinstance(runner, GraphRunner):
            sizes = {name: dim["example"] for name, dim in m["dims"].items()} | {m["static"]["dim"]: size}
            runner.capture([t.to(model.device) for t in make_inputs(m["inputs"], sizes, 0)])


def verify(model: CompiledModel | None = None) -> list[GoldenResult]:
    """Re-run the golden cases recorded at build time; raise GoldenMismatch naming any output off."""
    m = manifest()
    model = model or load()
    # the golden outputs were recorded under the build's reference settings (TF32 off on a GPU)
    settings = _targets.for_manifest(m).reference()
    # read through the descriptor its hash was checked on
    with opened_verified(PACKAGE_DIR / m["golden"]["file"], m["golden"], full=True) as opened, settings:
        golden = Path(opened)  # the dynamic model's cases on it, each static size's on that size's model
        results = run_golden(_on(model, None), m, golden, model.device)
        for size, record in m.get("static", {}).get("sizes", {}).items():
            results += run_golden(_on(model, int(size)), m, golden, model.device, record["golden_cases"])
    failures = describe_failures(results)
    if failures:
        raise GoldenMismatch(f"{m['dist_name']} {m['full_version']} differs from its golden outputs:\n{failures}")
    return results


def _on(model: CompiledModel, size: int | None) -> Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]:
    """``model`` called on one compiled model: the dynamic one (None) or a static size's."""

    def call(*args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = model._run([arg.contiguous() for arg in args], size)
        return tuple(outputs) if model._manifest["returns_tuple"] else outputs[0]

    return call
