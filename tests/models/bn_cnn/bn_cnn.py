"""A tiny CNN with BatchNorm (its int64 num_batches_tracked buffer is what item 1 of issue 13 is about)."""

import torch
from torch import nn


class BatchNormCNN(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )
        self.head = nn.Linear(channels, classes)
        # Running statistics other than the initial 0 and 1, as a trained model has.
        for norm in (m for m in self.modules() if isinstance(m, nn.BatchNorm2d)):
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.num_batches_tracked.fill_(100)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).mean(dim=(2, 3)))


def build(channels: int = 8) -> BatchNormCNN:
    return BatchNormCNN(channels)
