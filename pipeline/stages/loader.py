"""Turn a spec into an eager nn.Module: import the factory (factory_import.py), apply seeded init or load weights."""

from __future__ import annotations

import hashlib
import inspect
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ModelLoadError
from ..hf import Checkpoint, folder_task, inspect_checkpoint, resolve_task
from ..hf_modules import wrapper_of
from ..hf_tasks import Task, library_install
from ..hf_wrappers import wrapper_example
from ..spec import SpecFile
from .factory_import import describe, factory_hint, import_factory, missing_package, missing_package_error, where_raised

PER_TENSOR_QSCHEMES = (torch.per_tensor_affine, torch.per_tensor_symmetric)


@dataclass(frozen=True)
class LoadedModel:
    module: torch.nn.Module
    source_files: tuple[Path, ...]
    weights_sha256: str


def _load_weights(spec_file: SpecFile, module: torch.nn.Module) -> None:
    from safetensors.torch import load_file

    path = spec_file.weights_path
    assert path is not None
    try:
        state = load_file(str(path))
    except Exception as exc:  # safetensors raises several unrelated types for a bad file
        raise ModelLoadError(f"{path}: cannot read weights: {exc}", "give a valid .safetensors file") from exc
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{name}: file {tuple(state[name].shape)} {state[name].dtype}, model {tuple(t.shape)} {t.dtype}"
        for name, t in expected.items()
        if name in state and (state[name].shape != t.shape or state[name].dtype != t.dtype)
    )
    if missing or extra or wrong:
        lines = (
            [f"missing: {n}" for n in missing]
            + [f"unexpected: {n}" for n in extra]
            + [f"mismatched {w}" for w in wrong]
        )
        raise ModelLoadError(
            f"{path}: weights do not fit the model:\n  " + "\n  ".join(lines[:20]),
            "the safetensors file must hold exactly the module's state_dict names, shapes and dtypes",
        )
    module.load_state_dict(state, strict=True)


def _source_files(factory: Callable[..., Any], module: torch.nn.Module) -> tuple[Path, ...]:
    """The user's files that define the model: the factory's module and every non-torch submodule class."""
    files: set[Path] = set()
    defining: list[Callable[..., Any]] = [factory, *(type(m) for m in module.modules())]
    for obj in defining:
        if getattr(obj, "__module__", "").startswith("torch."):
            continue
        try:
            source = inspect.getsourcefile(obj)
        except (TypeError, OSError):  # a builtin, or a class defined in no file
            continue
        if source is not None:
            files.add(Path(source).resolve())
    return tuple(sorted(files))


def forward_arguments(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """The spec's inputs (in forward's parameter order) as forward takes them: keyword-only
    parameters (`def forward(self, x, *, mask)`) by name, the others by position.

    Keyword-only parameters follow all the others, so torch.export's flattened inputs, and so the
    compiled model's, keep the spec's order either way.
    """
    params = list(inspect.signature(module.forward).parameters.values())
    keyword = {index: p.name for index, p in enumerate(params) if p.kind == p.KEYWORD_ONLY}
    args = tuple(t for index, t in enumerate(inputs) if index not in keyword)
    return args, {name: inputs[index] for index, name in keyword.items() if index < len(inputs)}


def call_forward(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Any:
    """``module`` run on the spec's inputs, keyword-only parameters given by name."""
    args, kwargs = forward_arguments(module, inputs)
    return module(*args, **kwargs)


def weight_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name: what the compiled model takes as constants."""
    return {name: t.detach() for name, t in [*module.named_parameters(), *module.named_buffers()]}


def tensor_bytes(tensor: torch.Tensor) -> tuple[str, bytes]:
    """A header naming what the values mean, and the values as bytes in row-major order.

    Equal for equal values whatever the strides, storage offset or sharing, conjugate or negative
    bit; a contiguous dense tensor's header and bytes are those of the hashes made before every
    kind was handled, so existing models keep their content hashes and cache keys.
    """
    tensor = tensor.detach().cpu()
    header = f"{tensor.dtype}:{tuple(tensor.shape)}"
    if tensor.layout != torch.strided:  # sparse: hashed by value, the layout named
        header += f":{tensor.layout}"
        tensor = tensor.to_dense()
    if tensor.is_quantized:  # the integers and what maps them to values
        header += f":{tensor.qscheme()}:" + (
            f"{tensor.q_scale()}:{tensor.q_zero_point()}"
            if tensor.qscheme() in PER_TENSOR_QSCHEMES
            else f"{tensor.q_per_channel_scales().tolist()}:{tensor.q_per_channel_zero_points().tolist()}:"
            f"{tensor.q_per_channel_axis()}"
        )
        tensor = tensor.int_repr()
    # reshape(-1): a 0-dim tensor cannot be viewed as bytes of another element size.
    flat = tensor.resolve_conj().resolve_neg().contiguous().reshape(-1)
    return header, flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def state_sha256(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(weight_tensors(module).items()):
        if tensor.is_meta:
            raise ModelLoadError(
                f"{name}: the model's tensor is on the meta device (it has a shape but no values)",
                "build the model with real tensors in the factory, "
                "or give [weights] file = a .safetensors with every tensor",
            )
        header, values = tensor_bytes(tensor)
        digest.update(f"{name}:{header}\n".encode())
        digest.update(values)
    return digest.hexdigest()


# What the model libraries print while a model loads: progress bars (redrawn with \r, in pipes
# too), and for a --hf folder transformers' ANSI-coloured LOAD REPORT, whose missing and
# mismatched keys the build checks itself (_check_loaded, below). A factory's own
# warnings stay: they are the user's code's. Set only where the user has not set them
# (TRANSFORMERS_VERBOSITY=info brings the report back).
QUIET_BARS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
QUIET_LOGS = {"TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error"}


def quiet_model_libraries(checkpoint: bool) -> None:
    """Before a model loads: through the environment for the libraries it imports later, and
    through their logging modules for those already imported (they read it at import)."""
    wanted = {**QUIET_BARS, **(QUIET_LOGS if checkpoint else {})}
    ours = {name for name, value in wanted.items() if os.environ.setdefault(name, value) == value}
    for library in ("transformers", "diffusers"):
        logs = sys.modules.get(f"{library}.utils.logging")
        if logs is None:
            continue
        if "HF_HUB_DISABLE_PROGRESS_BARS" in ours:
            logs.disable_progress_bar()
        if f"{library.upper()}_VERBOSITY" in ours:
            logs.set_verbosity_error()


def load_model(spec_file: SpecFile) -> LoadedModel:
    spec = spec_file.spec
    quiet_model_libraries(checkpoint=spec.model.hf is not None)
    if spec.model.hf is not None:  # a save_pretrained folder: the task's wrapper around from_pretrained
        return load_checkpoint(spec_file)
    assert spec.model.factory is not None  # a spec holds exactly one of factory and hf
    factory = import_factory(spec_file, spec.model.factory)
    if spec.weights.seed is not None:
        torch.manual_seed(spec.weights.seed)
    try:
        module = factory(**spec.model.kwargs)
    except SystemExit as exc:  # would end the build with its exit code, 0 included, and no wheel
        where = where_raised(exc)
        raise ModelLoadError(
            f"{spec_file.path}: key 'model.factory': {spec.model.factory}(**model.kwargs) "
            f"{describe(exc)}{f' at {where}' if where else ''} instead of returning a module",
            "the factory must return the nn.Module; remove the sys.exit()/exit() call from it",
        ) from exc
    except Exception as exc:
        package = missing_package(exc)
        if package:
            raise missing_package_error(
                f"{spec_file.path}: key 'model.factory': {spec.model.factory}(**model.kwargs)", package, exc
            ) from exc
        where = where_raised(exc)
        raise ModelLoadError(
            f"{spec_file.path}: key 'model.factory': {spec.model.factory}(**model.kwargs) raised "
            f"{describe(exc)}{f' (at {where})' if where else ''}",
            factory_hint(exc, bool(spec.model.kwargs)),
        ) from exc
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(
            f"{spec_file.path}: key 'model.factory': {spec.model.factory} returned {type(module).__name__}, "
            "not an nn.Module",
            "the factory must return a torch.nn.Module",
        )
    if spec.weights.file is not None:
        _load_weights(spec_file, module)
    module.eval()
    return LoadedModel(module=module, source_files=_source_files(factory, module), weights_sha256=state_sha256(module))


def _from_pretrained(checkpoint: Checkpoint, task: Task) -> tuple[torch.nn.Module, dict[str, Any]]:
    # Read when huggingface_hub is imported: no request leaves this process, whatever the folder says.
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        library = __import__(task.library)
    except ImportError as exc:
        raise ModelLoadError(
            f"{checkpoint.folder}: a {task.library} checkpoint, but {task.library} is not installed here ({exc})",
            library_install(task.library, shlex.quote(sys.executable)),
        ) from exc
    quiet_model_libraries(checkpoint=True)  # diffusers reads no setting for its bars: set now it is imported
    loader = getattr(library, task.loader)
    dtype = (
        {"dtype": torch.float32, "trust_remote_code": False}
        if task.library == "transformers"
        else {"torch_dtype": torch.float32}
    )
    try:
        loaded: tuple[torch.nn.Module, dict[str, Any]] = loader.from_pretrained(
            str(checkpoint.folder), local_files_only=True, use_safetensors=True, output_loading_info=True, **dtype
        )
        return loaded
    except Exception as exc:  # the libraries raise ValueError, OSError, KeyError… for a folder they cannot load
        # the task the saved class names first, where it is another: a newcomer's BERT built as
        # image-classification was sent to write a wrapper
        fits = folder_task(checkpoint.folder)
        other = (
            f"its config.json names {fits[0]}: use --task {fits[1]}; "
            if fits and fits[1] not in (None, task.name)
            else ""
        )
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""  # not the library's list of 40 classes
        said = said if len(said) <= 200 else said[:200] + "…"
        raise CheckpointError(
            f"{checkpoint.folder}: {task.library}.{task.loader}.from_pretrained cannot load it for "
            f"task {task.name!r}: {type(exc).__name__}: {said}",
            f"{other}check that the task fits the model (the tasks are listed by --task help) and that the "
            f"folder is complete; or write a small wrapper for {checkpoint.class_name}:\n"
            + wrapper_example(checkpoint.folder),
        ) from exc


def _check_loaded(checkpoint: Checkpoint, task: Task, info: dict[str, Any]) -> None:
    """Weights the folder lacks would be left at random: refuse, unless the outputs never use them."""
    missing = [k for k in info.get("missing_keys", []) if not k.startswith(task.unused)]
    mismatched = [str(m) for m in info.get("mismatched_keys", [])]
    if missing or mismatched:
        shown = [f"missing: {k}" for k in sorted(missing)] + [f"mismatched: {m}" for m in mismatched]
        raise CheckpointError(
            f"{checkpoint.folder}: the safetensors files lack weights that {task.loader} for task {task.name!r} "
            f"needs (they would be random):\n  " + "\n  ".join(shown[:20]),
            "pick the task the checkpoint was trained for (its config.json names "
            f"{checkpoint.class_name}), or save the whole model with save_pretrained()",
        )


def _zero_unused(model: torch.nn.Module, task: Task, info: dict[str, Any]) -> None:
    """The weights the folder lacks that the outputs never use (a BERT encoder's pooler): the library
    fills them at random on each load, so two builds of one folder hashed other weights (H46: every
    unchanged rebuild refused by dist/, no build-cache hit, `reproduce` failing). Zeroed, they are the
    same bytes in every build."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name in info.get("missing_keys", []):
            if name.startswith(task.unused) and name in tensors:
                tensors[name].zero_()


def load_checkpoint(spec_file: SpecFile) -> LoadedModel:
    """The wrapped model of a spec with ``model.hf``, as loader.load_model returns a factory's."""
    hf, task_name = spec_file.spec.model.hf, spec_file.spec.model.task
    assert hf is not None and task_name is not None  # load_model's check; load_spec completed the task
    task = resolve_task(task_name, hf)
    checkpoint = inspect_checkpoint(Path(hf), task)
    task = checkpoint.task
    model, info = _from_pretrained(checkpoint, task)
    _check_loaded(checkpoint, task, info)
    _zero_unused(model, task, info)
    wrapper = wrapper_of(task)
    module = wrapper(model).eval()
    # config.json among the sources: its values (eps, scales) shape the graph, so it is part of
    # the content hash as a factory's code is.
    sources = sorted({*_source_files(wrapper, module), checkpoint.config_file})
    return LoadedModel(module=module, source_files=tuple(sources), weights_sha256=state_sha256(module))
