"""transformers ConvNeXt: depthwise convolutions, LayerNorm, a small config."""

from torch import nn
from transformers import ConvNextConfig, ConvNextForImageClassification

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import ImageLogits as Classifier


def build() -> nn.Module:
    config = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    return Classifier(ConvNextForImageClassification(config))
