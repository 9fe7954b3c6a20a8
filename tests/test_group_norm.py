"""The CPU target writes group norm its own way (pipeline/group_norm.py, statistics per channel
first): eager's results for every shape a group norm takes, compiled with a dynamic batch too."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline import group_norm, targets

CASES = [  # (input shape, groups, affine, memory format)
    ((2, 64, 8, 8), 32, True, torch.channels_last),  # 2 channels a group: the case it is for
    ((3, 32, 5, 7), 4, True, torch.contiguous_format),
    ((1, 12, 9), 3, False, torch.contiguous_format),  # 1-d pixels, no weight or bias
    ((2, 8, 2, 3, 4), 2, True, torch.contiguous_format),
    ((4, 6), 3, True, torch.contiguous_format),  # no pixels: left to torch's own
]


@pytest.mark.parametrize("shape, groups, affine, memory_format", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_torchs_group_norm(shape, groups, affine, memory_format, dtype):
    generator = torch.Generator().manual_seed(len(shape) * groups)
    x = (torch.randn(shape, generator=generator) * 3 + 5).to(dtype)  # an offset mean: variance taken around it
    if memory_format is torch.channels_last:
        x = x.contiguous(memory_format=memory_format)
    weight = torch.randn(shape[1], generator=generator).to(dtype) if affine else None
    bias = torch.randn(shape[1], generator=generator).to(dtype) if affine else None
    got = group_norm.group_norm_by_channel(x, groups, weight, bias, 1e-5)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype is torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    assert got.dtype == dtype
    torch.testing.assert_close(got, F.group_norm(x, groups, weight, bias, 1e-5), **tolerance)


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3, padding=1)
        self.norm = nn.GroupNorm(32, 64)
        self.plain = nn.GroupNorm(8, 64, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.norm(self.conv(x)))
        return self.plain(h) + h.mean(dim=(2, 3), keepdim=True)


def test_the_compiled_model_matches_eager_at_every_batch(tmp_path):
    torch.manual_seed(0)
    model = Norms().eval()
    example = (torch.randn(2, 3, 10, 10),)
    batch = torch.export.Dim("batch", min=1, max=4)
    cpu = targets.get("cpu")
    program = cpu.lower(torch.export.export(model, example, dynamic_shapes=({0: batch},), strict=False))
    assert not any(node.target is torch.ops.aten.group_norm.default for node in program.graph.nodes)
    options = {"freezing": True, "fx_graph_cache": False, "aot_inductor.output_path": str(tmp_path / "model.so")}
    with torch.no_grad():
        torch._inductor.aot_compile(program.module(), example, options={**options, **cpu.graph_passes(options)})
    runner = cpu.open_runner(tmp_path / "model.so")
    for size in (1, 3, 4):
        x = torch.randn(size, 3, 10, 10, generator=torch.Generator().manual_seed(size)) + 2
        with torch.no_grad():
            torch.testing.assert_close(runner.run([x])[0], model(x), rtol=1e-4, atol=1e-5)


def test_a_program_without_group_norm_is_left_as_it_is():
    program = torch.export.export(nn.Linear(3, 2), (torch.randn(1, 3),))
    assert group_norm.decompose(program) is program
    assert targets.get("cuda").lower(program) is program


def test_the_rewrite_is_part_of_the_cpu_compile_cache_key():
    assert group_norm.VERSION in targets.get("cpu").key_facts(None)
