"""transformers SegFormer: a hierarchical transformer encoder, per-pixel class logits."""

from torch import nn
from transformers import SegformerConfig, SegformerForSemanticSegmentation

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import ImageLogits as Segmenter


def build() -> nn.Module:
    config = SegformerConfig(
        num_channels=3,
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=4,
        initializer_range=0.2,
    )  # logits near 1, not 1e-3 (default 0.02)
    return Segmenter(SegformerForSemanticSegmentation(config))
