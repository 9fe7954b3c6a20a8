"""diffusers UNet2DConditionModel: a conditional diffusion UNet (cross-attention on text states)."""

import torch
from diffusers import UNet2DConditionModel
from torch import nn


class Denoiser(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


def build() -> nn.Module:
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8,
    )
    return Denoiser(unet)
