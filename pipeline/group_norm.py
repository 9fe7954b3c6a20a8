"""Group norm for CPU compiles, its statistics taken per channel first.

Inductor's own decomposition reduces each group in one loop over the group's channels and
pixels. In the channels-last layout the convolutions around a group norm leave, a group's
channels are a few floats of every pixel's row: with 2 channels a group (the unet's 64 channels
in 32 groups) that loop fills 2 of a vector's 16 lanes at a time. Per channel the same
statistics are a reduction over pixels with the channels side by side, whole vectors, and a
group's statistics follow from its channels' exactly (the mean of their means; the mean of
their variances plus the spread of their means). Each channel's scale and shift are then stored
once, so the pass over the whole tensor reads them as vectors too.

The compiled model's results stay within float32 rounding of eager's (verification checks every
build); the variance is taken around each channel's mean, two passes, as eager's is.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

# Part of every CPU compile's cache key: a change to what this rewrite does must change it.
VERSION = "group-norm-by-channel-1"


def group_norm_by_channel(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None, eps: float = 1e-5, cudnn_enabled: bool = True) -> torch.Tensor:
    n, channels = x.shape[0], x.shape[1]
    if x.dim() < 3:  # no pixels to reduce per channel: the group's channels are the whole reduction
        return aten.native_group_norm.default(x, weight, bias, n, channels, 1, num_groups, eps)[0]
    per_group = channels // num_groups
    pixels = list(range(2, x.dim()))
    values = x.to(torch.promote_types(x.dtype, torch.float32))
    channel_var, channel_mean = torch.var_mean(values, dim=pixels, correction=0)
    channel_mean = channel_mean.view(n, num_groups, per_group)
    mean = channel_mean.mean(-1, keepdim=True)
    var = (channel_var.view(n, num_groups, per_group) + (channel_mean - mean) ** 2).mean(-1, keepdim=True)
    scale = torch.rsqrt(var + eps)
    scale = scale.expand(n, num_groups, per_group) if weight is None else scale * weight.view(1, num_groups, per_group)
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias.view(1, num_groups, per_group)
    # as_strided needs storage, so Inductor stores each channel's scale and shift rather than
    # computing them again, from the group's statistics, for every element (as Inductor's own does).
    broadcast = [n, channels] + [1] * len(pixels)
    scale = scale.contiguous().as_strided([n, channels], [channels, 1]).view(broadcast)
    shift = shift.contiguous().as_strided([n, channels], [channels, 1]).view(broadcast)
    return (values * scale + shift).to(x.dtype)


def decompose(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The program with each group norm written as above; unchanged if it has none."""
    if not any(node.target is aten.group_norm.default for node in program.graph.nodes):
        return program
    return program.run_decompositions({aten.group_norm.default: group_norm_by_channel})
