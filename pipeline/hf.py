"""Build from a `save_pretrained` folder with no code (issue 30): `--hf DIR --task TASK`, or
`[model] hf = "…"` and `task = "…"` in a spec.

The folder's config.json and the task (pipeline/hf_tasks.py) make the spec's dims, inputs and
outputs; keys the user's spec gives override them, and the result goes through the same
validation as any spec. The weights come from the folder's safetensors files, loaded with
`from_pretrained(local_files_only=True)` (the load stage, stages/loader.py): nothing is downloaded and no
pickle file is read. The spec reads this module; it imports nothing above the spec.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import CheckpointError, SpecError, UnsupportedTaskError
from .hf_limits import SEQUENCE, check_sequence
from .hf_tasks import TASKS, ConfigProblem, Facts, Task, close_task, find_task, for_class, supported
from .hf_wrappers import saved_config, wrapper_example

PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")
SUMMARY_REFUSED = re.compile(r"[\\\x00-\x1f\x7f]")  # what a wheel's one-line summary cannot hold


@dataclass(frozen=True)
class Checkpoint:
    folder: Path  # the model's own folder (a diffusers pipeline's unet/ for the denoising task)
    library: str  # "transformers" or "diffusers"
    class_name: str  # what saved it: config.json's architectures[0] or _class_name
    config_file: Path
    config_sha256: str
    facts: Facts
    task: Task  # the task as it builds this class (the unconditional UNet's denoising, say)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path}: cannot read it as JSON: {exc}",
            "save the model again with save_pretrained(), which writes this file",
        ) from exc
    if not isinstance(value, dict):
        raise CheckpointError(
            f"{path}: holds a {type(value).__name__}, not a JSON object", "save the model again with save_pretrained()"
        )
    return value


def _optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def _model_folder(folder: Path, task: Task) -> Path:
    """The folder whose config.json describes the model: a diffusers pipeline's (model_index.json
    beside unet/, vae/, …) keeps its UNet in unet/."""
    if not folder.is_dir():
        # a misspelt folder answered with the one beside it, as a task's is (H64: my-vitt beside my-vit)
        beside = [p.name for p in folder.parent.iterdir() if p.is_dir()] if folder.parent.is_dir() else []
        near = difflib.get_close_matches(folder.name, beside, n=1, cutoff=0.8)
        meant = f" (did you mean {folder.parent / near[0]}?)" if near and not folder.exists() else ""
        raise CheckpointError(
            f"--hf {folder}: {'is not a folder' if folder.exists() else 'does not exist'}{meant}",
            "give the folder that model.save_pretrained(folder) wrote",
        )
    if (folder / "model_index.json").is_file() and not (folder / "config.json").is_file():
        if task.library == "diffusers" and (folder / "unet" / "config.json").is_file():
            return folder / "unet"
        raise CheckpointError(
            f"{folder}: is a diffusers pipeline folder (model_index.json) without a "
            f"{'unet/ subfolder' if task.library == 'diffusers' else 'transformers model'}",
            "give the folder of one model of it (e.g. DIR/unet with --task denoising)",
        )
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{folder}: not a save_pretrained folder: it holds no config.json",
            "give the folder that model.save_pretrained(folder) wrote (config.json and "
            "*.safetensors), from transformers or diffusers",
        )
    return folder


def _library(config_file: Path, config: dict[str, Any]) -> tuple[str, str]:
    if "_class_name" in config:
        return "diffusers", str(config["_class_name"])
    if "model_type" in config:
        return "transformers", str((config.get("architectures") or [config["model_type"]])[0])
    raise CheckpointError(
        f"{config_file}: has neither 'model_type' (transformers) nor '_class_name' (diffusers)",
        "give a folder written by a transformers or diffusers model's save_pretrained()",
    )


def _require_safetensors(folder: Path) -> None:
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLED for p in folder.glob(pattern))
    if pickled:
        raise CheckpointError(
            f"{folder}: holds {', '.join(pickled)} (pickle) but no .safetensors file: modelwheel loads weights only "
            "from safetensors, since loading a pickle file runs code from it",
            "save it again as safetensors: load it where you trust the file, then model.save_pretrained(folder) "
            "(transformers 5 and diffusers write model.safetensors by default; older transformers need "
            "safe_serialization=True)",
        )
    raise CheckpointError(
        f"{folder}: holds no weights (*.safetensors)",
        "give the folder that model.save_pretrained(folder) wrote, weights included",
    )


def resolve_task(name: str, folder: Path | str) -> Task:
    task = find_task(name)
    if task is None:
        meant = close_task(name)
        if meant is not None:
            found = folder_task(folder)
            raise UnsupportedTaskError(
                f"task {name!r} is not one modelwheel builds; did you mean {meant!r}?{_fit_note(found, meant)} "
                f"The tasks it builds:\n{supported()}",
                f"--task {(found and found[1]) or meant}",
            )
        raise UnsupportedTaskError(
            f"task {name!r} is not one modelwheel builds from a checkpoint folder with no code; it builds:\n"
            f"{supported()}",
            "for another task, write a small wrapper and a spec instead:\n" + wrapper_example(folder),
        )
    return task


def _fit_note(found: tuple[str, str | None] | None, meant: str) -> str:
    """What the folder says of the task a typo most likely meant (``found``: folder_task's): a
    newcomer who followed 'did you mean image-classification' on a BERT got transformers' refusal."""
    if found is None or find_task(found[1] or "") is find_task(meant):
        return ""
    saved, fits = found
    if fits is None:
        return f" Its config.json names {saved}: check that the task builds that class."
    return f" But its config.json names {saved}, which --task {fits} builds."


def inspect_checkpoint(folder: Path, task: Task) -> Checkpoint:
    model_folder = _model_folder(folder, task)
    config_file = model_folder / "config.json"
    config = _read_json(config_file)
    library, class_name = _library(config_file, config)
    if library != task.library:
        raise CheckpointError(
            f"{model_folder}: is a {library} checkpoint ({class_name}), but task {task.name!r} builds "
            f"{task.library} models ({task.loader})",
            "pick the task that fits the model; the tasks are:\n" + supported(),
        )
    if task.classes and class_name not in task.classes:
        raise CheckpointError(
            f"{model_folder}: holds a {class_name}, but task {task.name!r} builds {' or '.join(task.classes)} only",
            f"write a small wrapper for {class_name} and a spec instead:\n" + wrapper_example(folder),
        )
    _require_safetensors(model_folder)
    pipeline = model_folder.parent if model_folder != folder.resolve() and model_folder.name == "unet" else None
    facts = Facts(
        config=config,
        preprocessor=_optional_json(folder / "preprocessor_config.json"),
        text_config=_optional_json(pipeline / "text_encoder" / "config.json") if pipeline else {},
        scheduler=_optional_json(pipeline / "scheduler" / "scheduler_config.json") if pipeline else {},
    )
    return Checkpoint(
        folder=model_folder,
        library=library,
        class_name=class_name,
        config_file=config_file,
        config_sha256=hashlib.sha256(config_file.read_bytes()).hexdigest(),
        facts=facts,
        task=for_class(task, class_name),
    )


def _description(checkpoint: Checkpoint, task: Task) -> str:
    folder = SUMMARY_REFUSED.sub("?", checkpoint.folder.name)
    return (
        f"{checkpoint.class_name} ({task.name}) from the save_pretrained folder '{folder}', "
        f"config.json sha256 {checkpoint.config_sha256[:16]}"
    )


def _merged(generated: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The user's keys over the generated ones: [model] and each [dims.X] key by key, the
    [[inputs]] and [[outputs]] lists whole, every other section as the user gave it."""
    merged = {**generated, **raw}
    merged["model"] = {**generated["model"], **raw.get("model", {})}
    dims = {name: dict(dim) for name, dim in generated["dims"].items()}
    for name, dim in (raw.get("dims") or {}).items():
        if name in dims and isinstance(dim, dict):
            if ("min" in dim or "max" in dim) and "example" not in dim:
                dims[name].pop("example", None)  # the generated one may lie outside the new range
            dims[name].update(dim)
        else:
            dims[name] = dim
    merged["dims"] = dims
    return merged


def _refuse_unused_dims(generated: dict[str, Any], raw: dict[str, Any], task: str, where: str) -> None:
    """An override's [dims.X] that the task's inputs do not name, where it gives no [[inputs]] of its
    own: a misspelling, which built with exit 0 and the user's range left out (H50: [dims.sequnce])."""
    if "inputs" in raw:
        return
    known = list(generated["dims"])
    for name in raw.get("dims") or {}:
        if name in known:
            continue
        near = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
        raise SpecError(
            f"{where}: key 'dims.{name}': the {task} task's inputs name no dim '{name}' (theirs: "
            f"{', '.join(known)})" + (f"; did you mean [dims.{near[0]}]?" if near else ""),
            f"rename it [dims.{near[0]}]" if near else "remove it, or give [[inputs]] of your own that use it",
        )


def complete_spec(raw: dict[str, Any], base: Path, where: str) -> dict[str, Any]:
    """A spec's TOML (``raw``, with ``model.hf`` set) completed from the checkpoint folder; a
    relative ``hf`` is taken from ``base`` (the spec's folder, or the current one for --hf)."""
    model = raw.get("model", {})
    if "factory" in model:
        raise SpecError(
            f"{where}: key 'model.factory': given with 'model.hf': a spec builds either your factory or "
            "a checkpoint folder",
            "remove one of them",
        )
    if not model.get("task"):
        raise SpecError(
            f"{where}: key 'model.task': missing: a checkpoint folder is built for one task",
            f'add task = "…" under [model], one of:\n{supported()}',
        )
    folder = (base / str(model["hf"])).resolve()
    task = resolve_task(str(model["task"]), folder)
    checkpoint = inspect_checkpoint(folder, task)
    task = checkpoint.task
    try:
        generated = task.spec(checkpoint.facts)
    except ConfigProblem as exc:
        raise CheckpointError(
            f"{checkpoint.config_file}: {exc}, so the {task.name} task cannot make its inputs",
            "pick the task that fits the model, or write a wrapper and a spec "
            "(docs/library-models.md#a-wrapper-of-your-own)",
        ) from exc
    generated["model"] = {"description": _description(checkpoint, task)}
    _refuse_unused_dims(generated, raw, task.name, where)
    completed = _merged(generated, raw)
    if SEQUENCE in generated["dims"]:  # before export: the config's limits, not torch's guard, say what fits
        check_sequence(
            completed["dims"],
            (raw.get("dims") or {}).get(SEQUENCE),
            checkpoint.facts.config,
            checkpoint.config_file,
            where,
        )
    completed["model"].update(hf=str(folder), task=task.name)
    return completed


def suggested_name(folder: Path) -> str:
    name = re.sub(r"[^a-z0-9_]+", "_", folder.resolve().name.lower()).strip("_")
    return name if name[:1].isalpha() else f"model_{name}"


# A fragment of the saved class's name -> the task that builds such a class.
CLASS_HINTS = {
    "ImageClassification": "image-classification",
    "ObjectDetection": "object-detection",
    "SemanticSegmentation": "semantic-segmentation",
    "CausalLM": "text-generation",
    "LMHead": "text-generation",
    "UNet2D": "denoising",
}


def folder_task(folder: Path | str) -> tuple[str, str | None] | None:
    """The class the folder's config names, and the task that builds it where that can be told."""
    found = saved_config(folder)
    return (found[1], fitting_task(found[1], found[2])) if found else None


def fitting_task(saved: str, config: dict[str, Any]) -> str | None:
    found = next((task for fragment, task in CLASS_HINTS.items() if fragment in saved), None)
    if found is None and saved.endswith("Model") and "vocab_size" in config:
        return "feature-extraction"  # a text model's base class (BertModel): its hidden states
    return found


def guess_task(folder: str) -> str:
    """A hint for --hf without --task: the task the saved class's name suggests."""
    if not (Path(folder) / "config.json").is_file():
        return f"add --task, one of:\n{supported()}"
    found = folder_task(folder)
    if found is not None and found[1] is not None:
        return f"its config.json names {found[0]}: add --task {found[1]}"
    return f"its config.json names {found[0] if found else 'no class'}; add --task, one of:\n{supported()}"


class _ModelKeys(Protocol):
    """The spec's [model] keys the checkpoint's record reads (spec.Spec is a layer above)."""

    @property
    def hf(self) -> str | None: ...
    @property
    def task(self) -> str | None: ...


class _SpecKeys(Protocol):
    @property
    def model(self) -> _ModelKeys: ...


def checkpoint_record(spec: _SpecKeys) -> dict[str, Any] | None:
    """What the manifest says of the checkpoint (no path: a manifest does not depend on where the
    build ran); the report adds the folder's path."""
    hf, task_name = spec.model.hf, spec.model.task
    if hf is None or task_name is None:  # no checkpoint (load_spec refuses an hf folder without a task)
        return None
    task = resolve_task(task_name, hf)
    checkpoint = inspect_checkpoint(Path(hf), task)
    return {
        "folder": checkpoint.folder.name,
        "task": task.name,
        "library": checkpoint.library,
        "class": checkpoint.class_name,
        "config_sha256": checkpoint.config_sha256,
    }


__all__ = ["TASKS", "checkpoint_record", "complete_spec", "guess_task", "inspect_checkpoint", "resolve_task"]
