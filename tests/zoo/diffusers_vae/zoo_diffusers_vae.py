"""diffusers AutoencoderKL: the VAE decoder of a latent diffusion model, latents in, image out."""

import torch
from diffusers import AutoencoderKL
from torch import nn


class Decoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.model.decode(latents, return_dict=False)[0]


def build() -> nn.Module:
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=32,
    )
    return Decoder(vae)
