"""diffusers UNet2DConditionModel: a conditional diffusion UNet (cross-attention on text states)."""

from diffusers import UNet2DConditionModel
from torch import nn

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import Denoiser


def build() -> nn.Module:
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    return Denoiser(unet)
