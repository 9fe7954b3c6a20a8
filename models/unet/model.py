"""A conditional diffusion UNet (Stable-Diffusion style), written to compile well.

forward(sample, timestep, context) -> noise prediction, shaped like sample.

Written for torch.export: every argument is a tensor, none is optional, all structure is fixed
in __init__ (the forward never branches on a flag or a tensor value) and forward writes nothing
to self.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(timestep: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of (batch,) float timesteps into (batch, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half)
    angles = timestep.float()[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, time_dim: int, groups: int = 32) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.time = nn.Linear(time_dim, out_ch)
        self.norm2 = nn.GroupNorm(groups, out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        # Decided here, not in forward: a 1x1 projection only when the channel count changes.
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Attention(nn.Module):
    """Multi-head attention; cross-attention when context_dim differs from the query's dim."""

    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(context_dim, dim, bias=False)
        self.v = nn.Linear(context_dim, dim, bias=False)
        self.out = nn.Linear(dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(context)), self._split(self.v(context))
        h = F.scaled_dot_product_attention(q, k, v)
        b, _, n, _ = h.shape
        return self.out(h.transpose(1, 2).reshape(b, n, -1))


class TransformerBlock(nn.Module):
    """Self-attention, cross-attention on the context, and a GELU feed-forward, each pre-norm."""

    def __init__(self, ch: int, context_dim: int, heads: int, groups: int = 32) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch)
        self.proj_in = nn.Conv2d(ch, ch, 1)
        self.ln1, self.self_attn = nn.LayerNorm(ch), Attention(ch, ch, heads)
        self.ln2, self.cross_attn = nn.LayerNorm(ch), Attention(ch, context_dim, heads)
        self.ln3 = nn.LayerNorm(ch)
        self.ff = nn.Sequential(nn.Linear(ch, 4 * ch), nn.GELU(), nn.Linear(4 * ch, ch))
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        h = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)  # (b, hw, c)
        h = h + self.self_attn(self.ln1(h), self.ln1(h))
        h = h + self.cross_attn(self.ln2(h), context)
        h = h + self.ff(self.ln3(h))
        h = h.transpose(1, 2).reshape(b, c, height, width)
        return x + self.proj_out(h)


class NoAttention(nn.Module):
    """Stands in for a TransformerBlock at levels without attention, so forward never branches."""

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return x


class Level(nn.Module):
    """Residual blocks at one resolution, each followed by a transformer block when attention is on."""

    def __init__(self, in_chs: list[int], out_ch: int, time_dim: int, context_dim: int, heads: int, attention: bool):
        super().__init__()
        self.res = nn.ModuleList(ResBlock(c, out_ch, time_dim) for c in in_chs)
        self.attn = nn.ModuleList(
            TransformerBlock(out_ch, context_dim, heads) if attention else NoAttention() for _ in in_chs
        )


class UNet(nn.Module):
    def __init__(
        self,
        in_channels: int = 4,
        base_channels: int = 64,
        channel_mults: tuple[int, ...] = (1, 2, 4),
        attention_levels: tuple[bool, ...] = (False, True, True),
        blocks_per_level: int = 2,
        context_dim: int = 256,
        heads: int = 8,
    ) -> None:
        super().__init__()
        chs = [base_channels * m for m in channel_mults]
        time_dim = 4 * base_channels
        self.time_dim = base_channels
        self.time_mlp = nn.Sequential(nn.Linear(base_channels, time_dim), nn.SiLU(), nn.Linear(time_dim, time_dim))
        self.conv_in = nn.Conv2d(in_channels, chs[0], 3, padding=1)

        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        skip_chs = [chs[0]]
        ch = chs[0]
        for i, (out_ch, attn) in enumerate(zip(chs, attention_levels)):
            self.down.append(
                Level([ch] + [out_ch] * (blocks_per_level - 1), out_ch, time_dim, context_dim, heads, attn)
            )
            skip_chs += [out_ch] * blocks_per_level
            ch = out_ch
            last = i == len(chs) - 1
            self.downsample.append(nn.Identity() if last else nn.Conv2d(ch, ch, 3, stride=2, padding=1))
            if not last:
                skip_chs.append(ch)

        self.mid_res1 = ResBlock(ch, ch, time_dim)
        self.mid_attn = TransformerBlock(ch, context_dim, heads)
        self.mid_res2 = ResBlock(ch, ch, time_dim)

        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        for i, (out_ch, attn) in reversed(list(enumerate(zip(chs, attention_levels)))):
            in_chs = []
            for _ in range(blocks_per_level + 1):
                in_chs.append(ch + skip_chs.pop())
                ch = out_ch
            self.up.append(Level(in_chs, out_ch, time_dim, context_dim, heads, attn))
            self.upsample.append(nn.Conv2d(ch, ch, 3, padding=1) if i > 0 else nn.Identity())
        self.upsample_flags = [i > 0 for i in reversed(range(len(chs)))]

        self.norm_out = nn.GroupNorm(32, ch)
        self.conv_out = nn.Conv2d(ch, in_channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        temb = self.time_mlp(timestep_embedding(timestep, self.time_dim))
        h = self.conv_in(sample)
        skips = [h]
        for level, down in zip(self.down, self.downsample):
            for res, attn in zip(level.res, level.attn):
                h = res(h, temb)
                h = attn(h, context)
                skips.append(h)
            if not isinstance(down, nn.Identity):
                h = down(h)
                skips.append(h)

        h = self.mid_res2(self.mid_attn(self.mid_res1(h, temb), context), temb)

        for level, up, upsampled in zip(self.up, self.upsample, self.upsample_flags):
            for res, attn in zip(level.res, level.attn):
                h = res(torch.cat([h, skips.pop()], dim=1), temb)
                h = attn(h, context)
            if upsampled:
                h = up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))


def build_unet(**kwargs) -> UNet:
    """Factory named by spec.toml; keyword arguments come from [model.kwargs]."""
    if "channel_mults" in kwargs:
        kwargs["channel_mults"] = tuple(kwargs["channel_mults"])
    return UNet(**kwargs)
