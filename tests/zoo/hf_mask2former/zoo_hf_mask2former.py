"""transformers Mask2Former: a Swin backbone, a pixel decoder and a masked-attention decoder.

Mask2FormerModel, not ...ForUniversalSegmentation: the latter builds its training loss, whose
Hungarian matcher needs scipy (transformers' requires_backends refuses to build it without),
and the compiled forward uses neither. Its pixel decoder keeps submodules in plain lists.
"""

import torch
from torch import nn
from transformers import Mask2FormerConfig, Mask2FormerModel, SwinConfig


class Segmenter(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(pixel_values=pixel_values)
        return out.pixel_decoder_last_hidden_state, out.transformer_decoder_last_hidden_state


def build() -> nn.Module:
    backbone = SwinConfig(
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=2,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=32,
        dim_feedforward=32,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        num_queries=8,
        num_labels=3,
    )
    return Segmenter(Mask2FormerModel(config))
