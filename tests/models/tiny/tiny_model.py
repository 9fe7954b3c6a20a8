"""A tiny two-input, two-output model for end-to-end tests: compiles in seconds."""

import math

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = nn.GroupNorm(2, channels)
        self.time = nn.Linear(16, channels)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor):
        half = 8
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        angles = t[:, None] * freqs[None, :]
        emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
        h = nn.functional.silu(self.norm(self.conv(x))) + self.time(emb)[:, :, None, None]
        return h, self.head(h.mean(dim=(2, 3)))


def build(channels: int = 8) -> Tiny:
    return Tiny(channels)
