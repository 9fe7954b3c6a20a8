"""Stage 1: capture the module's forward with torch.export, turning its errors into line-level advice."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import logging
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ExportError, SpecError
from ..spec import InputSpec, SpecFile
from ..targets import Target
from ..wheel_template.runtime import _inputs as wheel_inputs
from .input_fit import check_index_ranges, size_suspects, watching_embeddings
from .loader import LoadedModel, call_forward, forward_arguments

EXAMPLE_SEED = 0
log = logging.getLogger("pipeline.stages.export")


@dataclass(frozen=True)
class Exported:
    spec_file: SpecFile
    target: Target
    module: torch.nn.Module  # on the target's device
    program: torch.export.ExportedProgram | None  # None until export_program runs (not needed on a cache hit)
    example_inputs: tuple[torch.Tensor, ...]
    returns_tuple: bool
    output_dtypes: tuple[str, ...]
    content_hash: str
    sources_sha256: str
    weights_sha256: str

    @property
    def device(self) -> str:
        """torch's device the build runs the model on."""
        return self.target.TORCH_DEVICE


def export_sizes(spec_file: SpecFile) -> dict[str, int]:
    return {name: dim.export_size for name, dim in spec_file.spec.dims.items()}


def spec_inputs(spec_file: SpecFile) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in spec_file.spec.inputs]


def where_defined(obj: Callable[..., Any]) -> str:
    """file:line of a function's `def` (of the function itself when decorated: libraries wrap forwards)."""
    obj = inspect.unwrap(obj)
    try:
        lines, start = inspect.getsourcelines(obj)
        decorators = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), 0)
        return f"{inspect.getsourcefile(obj)}:{start + decorators}"
    except (TypeError, OSError):
        return repr(obj)


def check_signature(spec_file: SpecFile, module: torch.nn.Module) -> None:
    """Tensors in only: no *args/**kwargs, no optional arguments, one parameter per spec input."""
    forward = type(module).forward
    where = where_defined(forward)
    params = list(inspect.signature(module.forward).parameters.values())
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ExportError(
                f"{where}: forward takes {'*' if param.kind == param.VAR_POSITIONAL else '**'}{param.name}",
                "give forward one named tensor parameter per input; "
                "variadic arguments cannot be exported as a fixed signature",
            )
        if param.default is not param.empty:
            raise ExportError(
                f"{where}: forward parameter {param.name!r} is optional (default {param.default!r})",
                "remove the default: decide optional behaviour in __init__ and build one module per variant",
            )
    names = [p.name for p in params]
    if len(names) != len(spec_file.spec.inputs):
        raise SpecError(
            f"{spec_file.path}: key 'inputs': {len(spec_file.spec.inputs)} inputs declared, but forward at {where} "
            f"takes {len(names)} ({', '.join(names)})",
            "declare one [[inputs]] table per forward parameter, in order",
        )


def _count_problem(spec_file: SpecFile, module: torch.nn.Module) -> str | None:
    """Why the spec's number of inputs cannot fit forward's signature, or None. Variadic and
    optional parameters are the doctor's to report, so they only widen what fits here."""
    params = list(inspect.signature(module.forward).parameters.values())
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in named if p.default is p.empty]
    declared = len(spec_file.spec.inputs)
    if len(required) <= declared and (variadic or declared <= len(named)):
        return None
    inputs = ", ".join(i.name for i in spec_file.spec.inputs)
    takes = f"{len(required)}" if len(required) == len(named) else f"{len(required)} to {len(named)}"
    return (
        f"{spec_file.path}: key 'inputs': {declared} input(s) declared ({inputs}), but forward at "
        f"{where_defined(type(module).forward)} takes {takes} ({', '.join(p.name for p in named)})"
    )


def _shown(spec_input: InputSpec, tensor: torch.Tensor) -> str:
    shape = ", ".join(f"{s}={n}" if isinstance(s, str) else str(n) for s, n in zip(spec_input.shape, tensor.shape))
    return f"{spec_input.name!r} {str(tensor.dtype).removeprefix('torch.')}[{shape}]"


def check_inputs_fit(
    spec_file: SpecFile, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], source_files: tuple[Path, ...]
) -> None:
    """The spec's inputs against the model, before anything traces it: their number against
    forward's signature, then one eager call on the example inputs. A failure is the spec's
    (its [[inputs]] do not fit the model), named with the model's own file:line and message."""
    problem = _count_problem(spec_file, module)
    if problem:
        raise SpecError(problem, "declare one [[inputs]] table per forward parameter, in forward's order")
    with watching_embeddings(module, inputs) as fed:
        try:
            with torch.no_grad():
                call_forward(module, inputs)
        except Exception as exc:  # the user's forward can raise anything
            check_index_ranges(spec_file, fed)  # the cause an IndexError deep in a library leaves to guess
            raise _rejected(spec_file, module, inputs, source_files, exc) from exc
    check_index_ranges(spec_file, fed)  # ids past an embedding's end that this draw happened not to reach


def _rejected(
    spec_file: SpecFile,
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    source_files: tuple[Path, ...],
    exc: Exception,
) -> SpecError:
    where = _user_frame(exc, source_files) or where_defined(type(module).forward)
    said = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:400]
    shown = ", ".join(_shown(i, t) for i, t in zip(spec_file.spec.inputs, inputs))
    suspects = size_suspects(spec_file, module, inputs)
    likely = "".join(f"\n  most likely: {s}" for s in suspects)
    return SpecError(
        f"{spec_file.path}: key 'inputs': the model does not accept the spec's example inputs ({shown}):\n"
        f"  {where}\n  {type(exc).__name__}: {said}{likely}",
        (
            "make the [[inputs]] shape fit the model's config (the dim named above), or build the model from a config "
            "of the spec's sizes; "
            if suspects
            else ""
        )
        + f"make the [[inputs]] shapes and dtypes (and [dims] sizes, and low/high of integer inputs) match what the "
        f"model expects at {where.split(': ')[0]}; if they already do, the error is in the model's code there",
    )


def _user_frame(exc: BaseException, source_files: tuple[Path, ...]) -> str | None:
    """file:line and code of the innermost traceback frame in the user's model code."""
    wanted = {str(f) for f in source_files}
    found = None
    link: BaseException | None = exc
    while link is not None:
        for frame in traceback.extract_tb(link.__traceback__):
            if str(Path(frame.filename).resolve()) in wanted:
                found = f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
        link = link.__cause__ or link.__context__
    return found


# torch's suggested fix for a dim, e.g. "sequence = Dim('sequence', max=14)": the spec's [dims] keys.
SUGGESTED_DIM = re.compile(r"^\s*(\w+) = Dim\('\w+'((?:, (?:min|max)=\d+)*)\)\s*$", re.M)


def _torch_guards(exc: BaseException) -> str:
    """torch's own lines under a constraints error (the guard each dim's range failed, its suggested
    fixes): they say which range exports, so they stay in the message."""
    text = str(exc)
    if "Constraints violated" not in text:
        return ""
    kept = []
    for line in text.splitlines()[1:]:
        if line.startswith("The error above occurred"):
            break
        if line.strip():
            kept.append(f"  {line.rstrip()}")
    return "\n" + "\n".join(kept) if kept else ""


def suggested_dims(exc: BaseException) -> list[str]:
    """torch's suggested fixes as spec keys: "[dims.sequence] max = 14"."""
    return [
        f"[dims.{name}] " + ", ".join(part.strip().replace("=", " = ") for part in bounds.split(",") if part.strip())
        for name, bounds in SUGGESTED_DIM.findall(str(exc))
    ]


def _export_hint(exc: BaseException, checkpoint: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "DataDependent" in text or "data-dependent" in text or "GuardOnDataDependentSymNode" in text:
        return (
            "the code branches on tensor values (data-dependent control flow): replace the Python `if` with "
            "torch.where, or torch.cond for whole branches; see docs/writing-models.md"
        )
    if "Constraints violated" in text or "specialized" in text:
        fixes = suggested_dims(exc)
        suggested = f"; torch's suggestion, as spec keys: {'; '.join(fixes)}" if fixes else ""
        if checkpoint:  # no code of the user's to change: the range is theirs to narrow
            return (
                "the checkpoint's model code takes only part of a [dims] range (torch's guard above): narrow that "
                "dim's min/max in an override spec (--spec overrides.toml)" + suggested
            )
        return (
            "a dimension declared dynamic in [dims] is treated as a constant by the code (e.g. a view with a fixed "
            "size): use x.shape[...] instead of constants, or narrow the dim's min/max in the spec" + suggested
        )
    if "Unsupported" in type(exc).__name__ or "graph break" in text.lower():
        return (
            "the forward calls something torch.export cannot trace: move it to __init__ or replace it with tensor ops"
        )
    return "see docs/writing-models.md for the patterns that export; run with --verbose for the full traceback"


def _sources_sha256(loaded: LoadedModel) -> str:
    digest = hashlib.sha256()
    for path in loaded.source_files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def content_hash(spec_file: SpecFile, loaded: LoadedModel) -> str:
    digest = hashlib.sha256()
    # Not whether or how long the search ran (the manifest records the options it chose): a wheel
    # built with --no-search had another hash than its rebuild from the spec, which `reproduce` said.
    digest.update(spec_file.spec.model_dump_json(exclude={"compile": set(spec_file.spec.compile.SEARCH_KEYS)}).encode())
    digest.update(loaded.weights_sha256.encode())
    digest.update(_sources_sha256(loaded).encode())
    return "sha256:" + digest.hexdigest()


def example_inputs(spec_file: SpecFile, device: str | None) -> tuple[torch.Tensor, ...]:
    """The seeded example inputs, on ``device`` (None: in host memory, where they are made)."""
    made = wheel_inputs.make_inputs(spec_inputs(spec_file), export_sizes(spec_file), EXAMPLE_SEED)
    return tuple(made if device is None else (t.to(device) for t in made))


# How torch words a tensor on another device than the inputs (CUDA's; the meta device's).
_DEVICE_MISMATCH = ("Expected all tensors to be on the same device", "is not on the expected device")


def _forward_hint(exc: Exception, device: str) -> str:
    if any(words in str(exc) for words in _DEVICE_MISMATCH):
        # seen on an H200: a timestep embedding's torch.arange(...) made on the CPU
        return (
            f"forward makes a tensor on another device than its inputs' ({device}): create it on an input's device "
            "(torch.arange(..., device=x.device)) or register it as a buffer, so that module.to() moves it"
        )
    return "check the [[inputs]] shapes and dtypes (and low/high of integer inputs) against what forward expects"


def prepare(spec_file: SpecFile, loaded: LoadedModel, target: Target) -> Exported:
    """Everything the later stages need but the exported program: inputs, output structure, hashes,
    with the module and inputs on the target's device (AOTInductor compiles for that device).

    Cheap (one eager call), so a build can tell from it whether torch.export is needed at all.
    """
    spec = spec_file.spec
    device = target.TORCH_DEVICE
    module = loaded.module.to(device)
    example = example_inputs(spec_file, device)
    try:
        with torch.no_grad():
            eager = call_forward(module, example)
    except Exception as exc:  # the user's forward can raise anything
        where = _user_frame(exc, loaded.source_files) or where_defined(type(module).forward)
        raise ExportError(
            f"{where}\n  forward raised {type(exc).__name__}: {exc} on the spec's example inputs",
            _forward_hint(exc, device),
        ) from exc
    returns_tuple = isinstance(eager, (tuple, list))
    outputs = tuple(eager) if returns_tuple else (eager,)
    if not all(isinstance(t, torch.Tensor) for t in outputs):
        kinds = ", ".join(sorted({type(t).__name__ for t in outputs}))
        raise ExportError(
            f"{where_defined(type(module).forward)}: forward returns {type(eager).__name__} holding {kinds}",
            "return a tensor or a flat tuple of tensors",
        )
    if len(outputs) != len(spec.outputs):
        raise SpecError(
            f"{spec_file.path}: key 'outputs': {len(spec.outputs)} outputs declared, "
            f"but forward returns {len(outputs)}",
            "declare one [[outputs]] table per returned tensor, in order",
        )
    return Exported(
        spec_file=spec_file,
        target=target,
        module=module,
        program=None,
        example_inputs=example,
        returns_tuple=returns_tuple,
        output_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in outputs),
        content_hash=content_hash(spec_file, loaded),
        sources_sha256=_sources_sha256(loaded),
        weights_sha256=loaded.weights_sha256,
    )


def dynamic_shapes(spec_file: SpecFile) -> tuple[dict[int, Any] | None, ...]:
    """The spec's [dims] as torch.export dynamic shapes, one entry per input."""
    spec = spec_file.spec
    dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in spec.dims.items()}
    return tuple(
        {axis: dims[size] for axis, size in enumerate(i.shape) if isinstance(size, str)} or None for i in spec.inputs
    )


def export_program(exported: Exported, source_files: tuple[Path, ...]) -> Exported:
    """Run torch.export with the spec's dynamic dims; errors name the user's line and a fix."""
    module = exported.module
    args, kwargs = forward_arguments(module, exported.example_inputs)
    per_input = dynamic_shapes(exported.spec_file)
    shapes: tuple[dict[int, Any] | None, ...] | dict[str, dict[int, Any] | None] = per_input
    if kwargs:  # by parameter name: torch.export matches a tuple to positional arguments only
        shapes = dict(zip(inspect.signature(module.forward).parameters, per_input))
    # torch.export prints partial graphs to stderr on failure; keep them for --verbose only.
    torch_stderr = io.StringIO()
    try:
        with torch.no_grad(), contextlib.redirect_stderr(torch_stderr):
            program = torch.export.export(module, args, kwargs=kwargs, dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # torch.export raises many unrelated types; all mean "did not export"
        log.info("%s", torch_stderr.getvalue())
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        model = exported.spec_file.spec.model
        where = (
            f"{model.hf} (checkpoint folder, task {model.task})"
            if model.hf is not None  # not our wrapper's line
            else _user_frame(exc, source_files) or where_defined(type(module).forward)
        )
        raise ExportError(
            f"{where}\n  torch.export failed: {type(exc).__name__}: {first_line}{_torch_guards(exc)}",
            _export_hint(exc, exported.spec_file.spec.model.hf is not None),
        ) from exc
    return dataclasses.replace(exported, program=program)
