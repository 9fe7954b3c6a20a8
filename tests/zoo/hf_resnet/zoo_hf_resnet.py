"""transformers ResNet (a BatchNorm CNN), a small config, seeded random weights."""

from torch import nn
from transformers import ResNetConfig, ResNetForImageClassification

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import ImageLogits as Classifier


def build() -> nn.Module:
    config = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5
    )
    return Classifier(ResNetForImageClassification(config))
