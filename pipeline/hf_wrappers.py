"""The wrapper a refusal shows for a checkpoint no task covers (issue 44): written for the class
the folder's config.json names and that class's inputs, not one fixed example.

transformers classes say their main input (`main_input_name`: input_ids, pixel_values,
input_values, input_features); a diffusers model's inputs are its forward's required parameters.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

TEMPLATE = """\
    # model.py, beside your spec.toml: forward takes tensors and returns tensors
    import torch
    from {library} import {cls}

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = {cls}.from_pretrained("{folder}", local_files_only=True)

        def forward(self, {params}) -> {returns}:
            {body}

  with [model] factory = "model:Wrapped", [weights] seed = 0 (the weights it loads are the ones
  that ship), one [[inputs]] table per forward parameter ({names}), and the spec's [dims] and
  [[outputs]] (docs/library-models.md#a-wrapper-of-your-own)"""
# Where the folder's class cannot be read: a token classifier, the commonest task without a table row.
FALLBACK = (
    "transformers",
    "AutoModelForTokenClassification",
    ["input_ids", "attention_mask"],
    "torch.Tensor",
    "return self.model(input_ids=input_ids, attention_mask=attention_mask).logits",
)
QUERY_SEGMENTERS = ("MaskFormer", "Mask2Former", "OneFormer", "UniversalSegmentation", "InstanceSegmentation")


def saved_config(folder: Path | str) -> tuple[str, str, dict[str, Any]] | None:
    """(library, class name, its config) that config.json (or a diffusers pipeline's unet/config.json)
    names, or None."""
    folder = Path(folder)
    for config_file in (folder / "config.json", folder / "unet" / "config.json"):
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and isinstance(config.get("_class_name"), str):
            return "diffusers", config["_class_name"], config
        architectures = config.get("architectures") if isinstance(config, dict) else None
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
            return "transformers", architectures[0], config
    return None


def saved_class(folder: Path | str) -> tuple[str, str] | None:
    """(library, class name) that config.json (or a diffusers pipeline's unet/config.json) names, or None."""
    found = saved_config(folder)
    return (found[0], found[1]) if found else None


def _library_class(library: str, name: str) -> Any:
    """The class the checkpoint names in its library (None where either is missing); Any, as its
    attributes (main_input_name, forward) are read by name."""
    try:
        return getattr(__import__(library), name, None)
    except ImportError:
        return None


def _transformers_forward(name: str) -> tuple[list[str], str, str]:
    cls = _library_class("transformers", name)
    main = getattr(cls, "main_input_name", None) or "input_ids"
    params = [main, "attention_mask"] if main == "input_ids" else [main]
    call = ", ".join(f"{p}={p}" for p in params)
    if any(fragment in name for fragment in QUERY_SEGMENTERS):
        return (
            params,
            "tuple[torch.Tensor, torch.Tensor]",
            f"out = self.model({call})\n            return out.class_queries_logits, out.masks_queries_logits",
        )
    if name.endswith("Model"):
        return params, "torch.Tensor", f"return self.model({call}).last_hidden_state"
    if "Classification" in name or name.endswith("LM") or "ForMaskedLM" in name:
        return params, "torch.Tensor", f"return self.model({call}).logits"
    return params, "torch.Tensor", f"return self.model({call}, return_dict=False)[0]  # its first output"


def _diffusers_forward(name: str) -> tuple[list[str], str, str]:
    cls = _library_class("diffusers", name)
    params = ["sample"]
    if cls is not None:
        signature = inspect.signature(cls.forward).parameters.values()
        params = [
            p.name
            for p in signature
            if p.name != "self" and p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ] or params
    return params, "torch.Tensor", f"return self.model({', '.join(params)}, return_dict=False)[0]"


def wrapper_example(folder: Path | str) -> str:
    """The wrapper to write for the folder's saved class (a token classifier where none can be read)."""
    saved = saved_class(folder)
    if saved is None:
        library, cls, params, returns, body = FALLBACK
    else:
        library, cls = saved
        params, returns, body = (_diffusers_forward if library == "diffusers" else _transformers_forward)(cls)
    return TEMPLATE.format(
        library=library,
        cls=cls,
        folder=folder,
        returns=returns,
        body=body,
        params=", ".join(f"{p}: torch.Tensor" for p in params),
        names=", ".join(params),
    )
