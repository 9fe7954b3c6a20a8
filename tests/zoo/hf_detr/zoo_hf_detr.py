"""transformers DETR: transformers' own ResNet backbone (not timm's), a transformer encoder and
decoder over object queries; class logits and boxes out."""

from torch import nn
from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import Detector


def build() -> nn.Module:
    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage4"]
    )
    config = DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_queries=10,
        num_labels=5,
    )
    return Detector(DetrForObjectDetection(config))
