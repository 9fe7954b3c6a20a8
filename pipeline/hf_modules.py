"""The tasks' wrappers (pipeline/hf_tasks.py names one per task): each turns a library model's
keyword options and output objects into tensors in, tensors out, as a user would write it
(docs/library-models.md#the-wrapper); the zoo's specs use them too. A module of its own because
it imports torch, which the task table (and every refusal made from it) does not need.
"""

from __future__ import annotations

import torch
from torch import nn

from .hf_tasks import Task


class ImageLogits(nn.Module):
    """Image classification and semantic segmentation: pixels in, `.logits` out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model  # state_dict names: "model.…"

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(pixel_values=pixel_values).logits
        return logits


class Detector(nn.Module):
    """Object detection (DETR-style): class logits and boxes per query; the box selection after
    it (thresholds, NMS) has data-dependent sizes and stays outside the compiled model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


class TextEncoder(nn.Module):
    """Feature extraction: token ids and a mask in, the last hidden states out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden


class CausalLM(nn.Module):
    """One forward of a decoder over a prompt: logits, no KV cache (a cache is state carried
    between calls, which a compiled forward does not keep)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=input_ids, use_cache=False).logits
        return logits


class Denoiser(nn.Module):
    """One denoising step of a conditional UNet; the scheduler loop stays in Python."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> torch.Tensor:
        noise: torch.Tensor = self.model(
            sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False
        )[0]
        return noise


class UnconditionalDenoiser(nn.Module):
    """One denoising step of an unconditional UNet (diffusers' UNet2DModel, as DDPM pipelines keep it)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        noise: torch.Tensor = self.model(sample, timestep, return_dict=False)[0]
        return noise


def wrapper_of(task: Task) -> type[nn.Module]:
    """The class that wraps the model ``task`` loads."""
    wrapper: type[nn.Module] = globals()[task.wrapper]
    return wrapper
