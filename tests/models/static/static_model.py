"""Models for the static-batch-size tests: a tiny conv net, and one that mixes samples across the batch."""

import torch
from torch import nn


class Small(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.time = nn.Linear(1, channels)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor):
        h = nn.functional.silu(self.conv(x)) + self.time(t[:, None] / 1000)[:, :, None, None]
        return h, self.head(h.mean(dim=(2, 3)))


class Mixing(Small):
    """Each sample's output depends on the others (centred on the batch mean): padding the batch
    changes the results, so ``pad = true`` must be refused."""

    def forward(self, x: torch.Tensor, t: torch.Tensor):
        h, logits = super().forward(x, t)
        return h - h.mean(dim=0, keepdim=True), logits


def build(channels: int = 8) -> Small:
    return Small(channels)


def build_mixing(channels: int = 8) -> Mixing:
    return Mixing(channels)
