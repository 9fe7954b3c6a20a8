"""What the build knows per task of a `save_pretrained` folder (issue 30): the library class that
loads it, the wrapper that turns its keyword options and output objects into tensors, and the
spec's dims, inputs and outputs, read from the folder's config.json.

As Optimum's task tables do for ONNX: a task names a family of models (every ViT, DeiT, ResNet…
image classifier is `image-classification`), and the config gives the sizes. The wrappers are
the ones a user would write (docs/library-models.md#the-wrapper), in pipeline/hf_modules.py: this
table names them, so that a refusal (a missing folder, an unknown task, `--task help`) costs no
torch import.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .hf_limits import sequence_dim

DEFAULT_IMAGE_SIZE = 224  # what most image processors resize to, where neither config says
DEFAULT_TEXT_LENGTH = 77  # CLIP's text length: what Stable Diffusion's UNets are conditioned on
DEFAULT_BATCH = {"min": 1, "max": 8}

# The library versions this project builds --hf checkpoints with: requirements-test.txt's pins (a test
# holds the two equal), named here too because an installed modelwheel has no checkout to read them from.
TESTED_LIBRARIES = {"transformers": "5.23.0", "diffusers": "0.42.1"}


def library_install(library: str, python: str) -> str:
    """The one command that installs ``library`` where ``python`` (the one running modelwheel) finds it."""
    pinned = f"{library}=={TESTED_LIBRARIES[library]}" if library in TESTED_LIBRARIES else library
    return (
        f"install it into the Python that runs modelwheel: {python} -m pip install {pinned} (the version this "
        "project tests, pinned in requirements-test.txt; in a checkout, `make test-deps` installs it into .venv); "
        "the wheel it builds does not need it"
    )


class ConfigProblem(ValueError):
    """config.json lacks what the task needs; the caller names the folder."""


@dataclass(frozen=True)
class Facts:
    """What the spec is made from: the model's config.json, and what sits beside it."""

    config: dict[str, Any]
    preprocessor: dict[str, Any]  # preprocessor_config.json, or {}
    text_config: dict[str, Any]  # a diffusers pipeline's text_encoder/config.json, or {}
    scheduler: dict[str, Any]  # a diffusers pipeline's scheduler/scheduler_config.json, or {}


@dataclass(frozen=True)
class Task:
    name: str
    library: str  # "transformers" or "diffusers"
    loader: str  # the class whose from_pretrained loads the folder
    wrapper: str  # its wrapper's class in hf_modules.py (which imports torch): hf_modules.wrapper_of(task)
    spec: Callable[[Facts], dict[str, Any]]  # dims, inputs, outputs
    summary: str
    # Weights the kept outputs never use, so the folder may lack them (BertModel's pooler, when
    # the folder was saved from a BertForMaskedLM).
    unused: tuple[str, ...] = ()
    # The saved classes it takes, where the loader is one class (diffusers'); () for Auto classes.
    classes: tuple[str, ...] = ()


def _square(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value[0], value[1]
    if isinstance(value, dict):  # an image processor's {"height", "width"} or {"shortest_edge"}
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
    return None


def image_size(facts: Facts) -> tuple[int, int]:
    """The config's image_size, else what the image processor crops or resizes to, else 224."""
    for value in (facts.config.get("image_size"), facts.preprocessor.get("crop_size"), facts.preprocessor.get("size")):
        if (size := _square(value)) is not None:
            return size
    return DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE


def _image_spec(outputs: list[str]) -> Callable[[Facts], dict[str, Any]]:
    def spec(facts: Facts) -> dict[str, Any]:
        height, width = image_size(facts)
        channels = int(facts.config.get("num_channels", 3))
        return {
            "dims": {"batch": dict(DEFAULT_BATCH)},
            "inputs": [{"name": "pixel_values", "shape": ["batch", channels, height, width]}],
            "outputs": [{"name": name} for name in outputs],
        }

    return spec


def _need(config: dict[str, Any], key: str, why: str) -> Any:
    if key not in config:
        raise ConfigProblem(f"config.json has no {key!r}, which {why}")
    return config[key]


def _text_spec(with_mask: bool, output: str) -> Callable[[Facts], dict[str, Any]]:
    def spec(facts: Facts) -> dict[str, Any]:
        vocab = int(_need(facts.config, "vocab_size", "a text task needs: the token ids' range (is it a text model?)"))
        ids = {"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64", "low": 0, "high": vocab}
        mask = {"name": "attention_mask", "shape": ["batch", "sequence"], "dtype": "int64", "low": 0, "high": 2}
        # within the config's position table and on one side of its sliding window (hf_limits.py)
        return {
            "dims": {"batch": dict(DEFAULT_BATCH), "sequence": sequence_dim(facts.config)},
            "inputs": [ids, mask] if with_mask else [ids],
            "outputs": [{"name": output}],
        }

    return spec


def _unet_spec(facts: Facts) -> dict[str, Any]:
    config = facts.config
    if config.get("addition_embed_type") or config.get("encoder_hid_dim_type"):
        raise ConfigProblem(
            f"the UNet takes extra conditioning (addition_embed_type {config.get('addition_embed_type')!r}, "
            f"encoder_hid_dim_type {config.get('encoder_hid_dim_type')!r}; SDXL's text_time, say), which the "
            "denoising task does not pass"
        )
    size = _square(_need(config, "sample_size", "gives the latent's height and width"))
    context = _need(config, "cross_attention_dim", "gives the text states' width")
    if size is None or not isinstance(context, int):
        raise ConfigProblem(
            f"sample_size {config['sample_size']!r} or cross_attention_dim {context!r} is not one "
            "size (per-block sizes are not supported)"
        )
    length = int(facts.text_config.get("max_position_embeddings", DEFAULT_TEXT_LENGTH))
    steps = int(facts.scheduler.get("num_train_timesteps", 1000))
    return {
        "dims": {"batch": dict(DEFAULT_BATCH)},
        "inputs": [
            {"name": "sample", "shape": ["batch", int(config.get("in_channels", 4)), *size]},
            {"name": "timestep", "shape": ["batch"], "dtype": "int64", "low": 0, "high": steps},
            {"name": "encoder_hidden_states", "shape": ["batch", length, context]},
        ],
        # atol 1e-3 (of outputs near 1): verify's all-zero case feeds GroupNorm a constant latent,
        # whose near-zero variance magnifies rounding differences to ~1e-4 (diffs elsewhere ~1e-6).
        "outputs": [{"name": "noise_pred", "atol": 1e-3}],
    }


def _unconditional_unet_spec(facts: Facts) -> dict[str, Any]:
    config = facts.config
    if config.get("num_class_embeds") or config.get("class_embed_type"):
        raise ConfigProblem(
            f"the UNet is class-conditional (num_class_embeds {config.get('num_class_embeds')!r}, "
            f"class_embed_type {config.get('class_embed_type')!r}), which the denoising task does not pass"
        )
    size = _square(_need(config, "sample_size", "gives the sample's height and width"))
    if size is None:
        raise ConfigProblem(f"sample_size {config['sample_size']!r} is not one size")
    steps = int(facts.scheduler.get("num_train_timesteps", 1000))
    return {
        "dims": {"batch": dict(DEFAULT_BATCH)},
        "inputs": [
            {"name": "sample", "shape": ["batch", int(config.get("in_channels", 3)), *size]},
            {"name": "timestep", "shape": ["batch"], "dtype": "int64", "low": 0, "high": steps},
        ],
        "outputs": [{"name": "noise_pred", "atol": 1e-3}],
    }  # atol: as the conditional UNet's (GroupNorm)


DENOISING_SUMMARY = (
    "sample, timestep[, encoder_hidden_states] -> noise_pred (diffusers UNet2DConditionModel, "
    "or an unconditional UNet2DModel)"
)
# The denoising task per saved class: the conditional UNet's, and the unconditional one's.
UNCONDITIONAL_DENOISING = Task(
    "denoising",
    "diffusers",
    "UNet2DModel",
    "UnconditionalDenoiser",
    _unconditional_unet_spec,
    DENOISING_SUMMARY,
    classes=("UNet2DModel",),
)

TASKS = {
    task.name: task
    for task in (
        Task(
            "image-classification",
            "transformers",
            "AutoModelForImageClassification",
            "ImageLogits",
            _image_spec(["logits"]),
            "pixel_values -> logits (ViT, DeiT, ResNet, ConvNeXt, …)",
        ),
        Task(
            "object-detection",
            "transformers",
            "AutoModelForObjectDetection",
            "Detector",
            _image_spec(["logits", "pred_boxes"]),
            "pixel_values -> logits, pred_boxes (DETR-style)",
        ),
        Task(
            "semantic-segmentation",
            "transformers",
            "AutoModelForSemanticSegmentation",
            "ImageLogits",
            _image_spec(["logits"]),
            "pixel_values -> per-pixel logits (SegFormer, …)",
        ),
        Task(
            "feature-extraction",
            "transformers",
            "AutoModel",
            "TextEncoder",
            _text_spec(True, "last_hidden_state"),
            "input_ids, attention_mask -> last_hidden_state (BERT-style text encoders)",
            unused=("pooler.",),
        ),
        Task(
            "text-generation",
            "transformers",
            "AutoModelForCausalLM",
            "CausalLM",
            _text_spec(False, "logits"),
            "input_ids -> logits, one forward, no KV cache (Llama, GPT-2, …)",
        ),
        Task(
            "denoising",
            "diffusers",
            "UNet2DConditionModel",
            "Denoiser",
            _unet_spec,
            DENOISING_SUMMARY,
            classes=("UNet2DConditionModel", "UNet2DModel"),
        ),
    )
}
VARIANTS = {("denoising", "UNet2DModel"): UNCONDITIONAL_DENOISING}
# Other names for the same tasks (Optimum's and common usage).
ALIASES = {
    "causal-lm": "text-generation",
    "text-encoder": "feature-extraction",
    "image-segmentation": "semantic-segmentation",
    "unet": "denoising",
}


def find_task(name: str) -> Task | None:
    return TASKS.get(ALIASES.get(name, name))


def for_class(task: Task, class_name: str) -> Task:
    """The task as it builds the saved class: the unconditional UNet's denoising, say."""
    return VARIANTS.get((task.name, class_name), task)


def close_task(name: str) -> str | None:
    """The task or alias a typo most likely meant ("image-classifcation")."""
    found = difflib.get_close_matches(name.lower().replace("_", "-"), [*TASKS, *ALIASES], n=1, cutoff=0.9)
    return found[0] if found else None


def supported() -> str:
    """The task table as a user reads it in a refusal."""
    aliases = ", ".join(f"{alias} = {name}" for alias, name in ALIASES.items())
    return "\n".join(f"  {name:<22} {task.summary}" for name, task in TASKS.items()) + f"\n  (also: {aliases})"
