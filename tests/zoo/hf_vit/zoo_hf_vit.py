"""transformers ViT: patch embedding and self-attention, a small config."""

from torch import nn
from transformers import ViTConfig, ViTForImageClassification

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import ImageLogits as Classifier


def build() -> nn.Module:
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
    )
    return Classifier(ViTForImageClassification(config))
