"""transformers MobileNetV2: inverted residuals, depthwise convolutions, BatchNorm, ReLU6."""

import torch
from torch import nn
from transformers import MobileNetV2Config, MobileNetV2ForImageClassification


class Classifier(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # return_dict=False: a tuple, the logits first
        return self.model(pixel_values, return_dict=False)[0]


def build() -> nn.Module:
    # initializer_range: with the default 0.02, activations shrink through the 17 blocks to logits
    # of 1e-26, which any compiled model would match; 0.25 keeps them near 1.
    config = MobileNetV2Config(
        num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=5, initializer_range=0.25
    )
    return Classifier(MobileNetV2ForImageClassification(config))
