"""Static batch sizes: the model compiled again with its batch dim fixed at each of
``[dims.<batch>] static = [...]``, beside the dynamic model.

At a fixed size Inductor compiles code for that size alone (and packs convolution weights for
it; the dynamic model's are packed where one layout serves every size: targets/cpu_prepack.py).
Each size is compiled with the options the search chose for the dynamic model (the search runs once), into
``<output>/batch<N>/`` (where it ships from: a CUDA .so finds its kernels by that path), and
verified like the dynamic model on its own cases at that size. With ``[weights] external = true``
every size reads the one weights file the dynamic model reads; with embedded weights on the CPU
target, every model's constants (freezing's packed ones included) go into one shared constants
store, each distinct blob once (constants.py); on CUDA each .so carries its own.

With ``pad = true`` a size between the static ones runs on the next larger one, its inputs padded
along the batch and its outputs sliced; the gate below checks, on the compiled models, that the
padded results match eager at the unpadded size (a model that mixes samples across the batch,
batch norm in training mode or a sum over the batch, fails it). The doctor runs the same gate on
eager alone first, so such a model is refused before any compile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import targets
from ..errors import VerificationError
from ..services.cache import Cache
from ..services.manifest import sha256_file
from ..services.progress import say, step
from ..spec import Spec, SpecFile
from ..wheel_template.runtime import _compare as wheel_compare
from ..wheel_template.runtime import _dispatch as wheel_dispatch
from ..wheel_template.runtime import _inputs as wheel_inputs
from ..wheel_template.runtime._schema import Manifest, Static
from . import constants
from .compile import Compiled, CompilePlan, compile_model, plan_compile
from .export import Exported, export_program, prepare, spec_inputs
from .loader import LoadedModel, call_forward
from .verify import Verified, as_tuple, open_runner, verify_model
from .verify_cases import tolerances

PAD_SEED = 500


@dataclass(frozen=True)
class StaticModel:
    size: int
    exported: Exported  # the spec with the batch dim fixed at ``size``
    compiled: Compiled


@dataclass(frozen=True)
class VerifiedStatic(StaticModel):
    """A static size after the verify stage: its own cases passed."""

    verified: Verified


def folder(size: int) -> str:
    """The static model's folder inside the output folder (and the wheel's artifacts/)."""
    return f"batch{size}"


def fixed_spec(spec_file: SpecFile, dim: str, size: int) -> SpecFile:
    """The spec with ``dim`` fixed at ``size``: dropped from [dims], a number in every input shape."""
    raw = spec_file.spec.model_dump(
        exclude_none=True, exclude_unset=True
    )  # keys left out stay left out: a target may default them
    raw["dims"].pop(dim)
    for spec_input in raw["inputs"]:
        spec_input["shape"] = [size if axis == dim else axis for axis in spec_input["shape"]]
    return SpecFile(path=spec_file.path, spec=Spec.model_validate(raw))


def compile_sizes(
    exported: Exported,
    loaded: LoadedModel,
    chosen: str,
    chosen_plan: CompilePlan,
    cxx_version: str,
    output_dir: Path,
    work_dir: Path,
    store: Cache,
) -> list[StaticModel]:
    """Export and compile each static size with the options of the candidate the search chose
    (``chosen``, compiled by ``chosen_plan``), from the cache when it holds them."""
    spec_file = exported.spec_file
    dim = spec_file.spec.static_dim
    if dim is None:
        return []
    sizes = spec_file.spec.dims[dim].static
    models = []
    for index, size in enumerate(sizes):
        step(f"static {index + 1}/{len(sizes)} {dim}={size}: compiling")
        fixed = prepare(fixed_spec(spec_file, dim, size), loaded, exported.target)
        shared = {constants.OPTION: False} if constants.shared(exported.target, spec_file.spec) else {}
        plan = plan_compile(
            fixed, cxx_version, output_dir / folder(size), {**chosen_plan.overrides, **shared}, chosen_plan.keep_debug
        )
        if not store.has(plan.key):
            fixed = export_program(fixed, loaded.source_files)
        plan.compile_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        compiled = compile_model(fixed, plan, work_dir / "static" / folder(size), store)
        took = "from the build cache" if compiled.from_cache else f"in {time.perf_counter() - started:.1f}s"
        say(f"    static {dim}={size}: compiled {took} ({chosen} options)")
        models.append(StaticModel(size, fixed, compiled))
    return models


def verify_sizes(models: list[StaticModel], weights_file: Path | None, work_dir: Path) -> list[VerifiedStatic]:
    """Each size verified like the dynamic model, on its own cases at that size."""
    verified: list[VerifiedStatic] = []
    for model in models:
        result = verify_model(
            model.exported,
            model.compiled,
            work_dir / "static" / folder(model.size),
            weights_file,
            f"static {model.size}: verifying ",
        )
        worst = ", ".join(f"{name} {w['max_abs']:.2g}" for name, w in result.worst().items())
        say(f"    static {folder(model.size)}: {len(result.cases)} cases passed (max abs diff: {worst})")
        verified.append(VerifiedStatic(model.size, model.exported, model.compiled, result))
    return verified


def padded_sizes(sizes: list[int], low: int) -> dict[int, int]:
    """Each size from ``low`` up that the wheel pads -> the static size it runs at, by the
    runtime's own rule (``_dispatch.route_among``), so the gate checks what the wheel will do."""
    routes = {batch: wheel_dispatch.route_among(sizes, True, batch) for batch in range(low, max(sizes))}
    return {batch: runs_at for batch, (_, runs_at) in routes.items() if runs_at != batch}


def pads(spec: Spec) -> bool:
    """Whether the spec lets sizes between the static ones run padded (``pad = true``)."""
    return spec.static_dim is not None and spec.dims[spec.static_dim].pad


def padding_calls(spec: Spec) -> int:
    """The eager calls check_padding_eager() makes, about: two a padded size it checks (padded and at
    its own size), for the smallest and largest that pad to each static size."""
    dim = spec.static_dim
    return 4 * len(spec.dims[dim].static or ()) if dim is not None else 0


def check_padding_eager(exported: Exported) -> None:
    """The padding gate on eager alone, in the doctor, before any compile: a model that mixes the
    batch is refused in seconds, not after every size is compiled. The compiled gate below
    (``check_padding``) still runs on the compiled static models."""
    spec = exported.spec_file.spec
    dim = spec.static_dim
    assert dim is not None and spec.dims[dim].static  # pads(spec): a static dim with its sizes
    _padding_gate(
        exported,
        spec.dims[dim].static,
        lambda to, padded: as_tuple(call_forward(exported.module, tuple(padded)), exported.returns_tuple),
    )


def check_padding(
    exported: Exported, models: Sequence[StaticModel], weights_file: Path | None
) -> dict[str, dict[str, dict[str, Any]]]:
    """The batch-independence gate of ``pad = true``: for the smallest and largest size that pads to
    each static size, the static model's padded, sliced outputs against eager at the unpadded size."""
    by_size = {model.size: model for model in models}
    runners: dict[int, Any] = {}  # static size: its runner

    def run(to: int, padded: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        if to not in runners:  # opened once per static size (setdefault would open it for every case)
            runners[to] = open_runner(by_size[to].compiled, weights_file)
        outputs: Sequence[torch.Tensor] = runners[to].run(padded)
        return outputs

    results, checked = _padding_gate(exported, list(by_size), run)
    say(f"    padding: {checked} padded sizes match eager at their own size (model is batch-independent)")
    return results


def _padding_gate(
    exported: Exported, static_sizes: Sequence[int], run: Callable[[int, list[torch.Tensor]], Sequence[torch.Tensor]]
) -> tuple[dict[str, dict[str, dict[str, Any]]], int]:
    """The gate's cases, each padded batch run by ``run(static size, padded inputs)``, against eager
    at the unpadded size; refused with every failing case. Returns each case's diffs and their count."""
    spec = exported.spec_file.spec
    dim = spec.static_dim
    assert dim is not None  # only a spec with a static dim pads
    pads = padded_sizes(sorted(static_sizes), spec.dims[dim].min)
    checked = sorted(
        {min(b for b in pads if pads[b] == s) for s in set(pads.values())}
        | {max(b for b in pads if pads[b] == s) for s in set(pads.values())}
    )
    tols, names = tolerances(exported), [o.name for o in spec.outputs]
    sizes = {name: d.export_size for name, d in spec.dims.items()}
    target = exported.target
    results: dict[str, dict[str, dict[str, Any]]] = {}  # case: output: its diff
    failures: list[str] = []
    for batch in checked:
        to = pads[batch]
        inputs = tuple(
            t.to(exported.device)
            for t in wheel_inputs.make_inputs(spec_inputs(exported.spec_file), {**sizes, dim: batch}, PAD_SEED + batch)
        )
        with torch.no_grad(), targets.reference(target):
            want = as_tuple(call_forward(exported.module, inputs), exported.returns_tuple)
            got = run(to, wheel_dispatch.pad(list(inputs), to, torch.cat))
        case = f"{dim}={batch} padded to {to}"
        for name, g, w in zip(names, got, want):
            if g.dim() == 0 or g.shape[0] != to:
                failures.append(
                    f"  case {case}: output {name!r} has shape {list(g.shape)}, not {dim} ({to}) first: "
                    f"it cannot be sliced back to {batch}"
                )
                continue
            diff = wheel_compare.compare(name, g[:batch], w, *tols[name])
            results.setdefault(case, {})[name] = {"max_abs": diff.max_abs, "passed": diff.passed}
            if not diff.passed:
                failures.append(f"  case {case}: {diff.describe()}")
    if failures:
        raise VerificationError(
            f"[dims.{dim}] pad = true, but the model is not batch-independent: its outputs for a padded batch, sliced "
            f"back, differ from eager at the unpadded size:\n" + "\n".join(failures),
            f"remove 'pad = true' from [dims.{dim}] in {exported.spec_file.path}: sizes between the static ones then "
            "run on the dynamic model; or make samples independent "
            "(no batch norm in training mode, no sums over the batch)",
        )
    return results, len(checked)


def manifest_record(exported: Exported, models: list[VerifiedStatic]) -> Static | None:
    """The manifest's "static" section: the dim, whether padding is allowed, each size's .so and verification."""
    spec = exported.spec_file.spec
    dim = spec.static_dim
    if dim is None:
        return None
    return Static(
        dim=dim,
        pad=spec.dims[dim].pad,
        sizes={
            str(m.size): {
                "library": f"{folder(m.size)}/{m.compiled.library.name}",
                "golden_cases": [f"{folder(m.size)}/{case}" for case in m.verified.golden_cases],
                "verification": {"passed": True, "cases": [c.case for c in m.verified.cases]},
            }
            for m in models
        },
    )


def merge_golden(golden_file: Path, models: list[VerifiedStatic]) -> None:
    """Each size's golden cases into the wheel's one golden file, under ``batch<N>/<case>``."""
    if not models:
        return
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(golden_file))
    for model in models:
        for key, tensor in load_file(str(model.verified.golden_file)).items():
            tensors[f"{folder(model.size)}/{key}"] = tensor
    save_file(tensors, str(golden_file))


def add_to_manifest(
    manifest: Manifest, exported: Exported, models: list[VerifiedStatic], store: tuple[Path, ...]
) -> Manifest:
    """The static sizes' .so files under "artifacts" (by their path in artifacts/), and the "static" section."""
    record = manifest_record(exported, models)
    if record is None:
        return manifest
    for model in models:
        for path in model.compiled.artifacts:
            name = f"{folder(model.size)}/{path.name}"
            manifest["artifacts"][name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest["static"] = record
    if store:  # the shared constants: the wheel's _constants.py reads them, its integrity check hashes them
        manifest["constants"] = {
            path.name: {"sha256": sha256_file(path), "size": path.stat().st_size} for path in store
        }
    return manifest


@dataclass(frozen=True)
class StaticSizes:
    """The static sizes' models, verified, and the padding gate's cases (None: padding not allowed)."""

    models: list[VerifiedStatic]
    padding: dict[str, dict[str, dict[str, Any]]] | None


def verify_all(
    exported: Exported, models: list[StaticModel], verified: Verified, weights_file: Path | None, work_dir: Path
) -> StaticSizes:
    """The verify stage's part: each size on its own cases, the padding gate, and every size's
    golden cases merged into the wheel's one golden file."""
    checked = verify_sizes(models, weights_file, work_dir)
    spec = exported.spec_file.spec
    padding = check_padding(exported, checked, weights_file) if checked and pads(spec) else None
    merge_golden(verified.golden_file, checked)
    return StaticSizes(checked, padding)


def package(
    manifest: Manifest, exported: Exported, compiled: Compiled, sizes: StaticSizes, work_dir: Path
) -> tuple[Manifest, tuple[Path, ...], list[Path]]:
    """The package stage's part: the manifest with the sizes' files and section, the shared
    constants store, and the sizes' .so files to ship."""
    store = shared_store(compiled, sizes.models, work_dir)
    libraries = [path for model in sizes.models for path in model.compiled.artifacts]
    return add_to_manifest(manifest, exported, sizes.models, store), store, libraries


def report(sizes: StaticSizes) -> dict[str, Any]:
    """The build report's "static" section: each size's verification, and the padding gate's cases."""
    return {
        "sizes": {
            str(m.size): {
                "verification": m.verified.report(),
                "compile_cache_key": m.compiled.cache_key,
                "from_cache": m.compiled.from_cache,
            }
            for m in sizes.models
        },
        "padding": sizes.padding,
    }


def shared_store(compiled: Compiled, models: Sequence[StaticModel], work_dir: Path) -> tuple[Path, ...]:
    """The one constants store of the dynamic and every static model (their own stores merged, each
    distinct blob once), written to ``work_dir/constants/``; () when the models embed their weights."""
    if compiled.constants is None:
        return ()
    writer = constants.Writer()
    writer.merge(compiled.constants, compiled.library.name)
    for model in models:
        assert model.compiled.constants is not None  # compiled with the dynamic model's shared-constants option
        writer.merge(model.compiled.constants, f"{folder(model.size)}/{model.compiled.library.name}")
    return writer.write(work_dir / "constants")
