"""The CPU target packs convolution weights at compile time for a dynamic batch too
(pipeline/conv_prepack.py): the compiled model must give eager's results at every batch size,
including sizes other than the one the weights were packed for."""

from __future__ import annotations

import torch
import torch.nn as nn

from pipeline import conv_prepack, targets


class Convs(nn.Module):
    """A plain, a depthwise, a strided 1x1 convolution and a residual add: the shapes the pass meets."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1, stride=2)
        self.head = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = self.pointwise(h + self.depthwise(h))
        return h + self.head(h)


def _compile(tmp_path, options: dict) -> torch._C._aoti.AOTIModelContainerRunnerCpu:
    torch.manual_seed(0)
    model = Convs().eval()
    example = (torch.randn(2, 3, 12, 12),)
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},), strict=False)
    library = tmp_path / "model.so"
    with torch.no_grad():
        torch._inductor.aot_compile(program.module(), example, options={
            **options, "fx_graph_cache": False, "aot_inductor.output_path": str(library)})
    return model, targets.get("cpu").open_runner(library)


def test_dynamic_batch_convolutions_get_packed_weights_and_match_eager(tmp_path):
    options = {"freezing": True, "force_layout_optimization": True}
    passes = targets.get("cpu").graph_passes(options)
    model, runner = _compile(tmp_path, {**options, **passes})
    packed = [name for name in runner.get_constant_names_to_original_fqns() if name.endswith(conv_prepack.PACKED_SUFFIX)]
    assert len(packed) == 4, packed
    for size in (1, 2, 3, 4):
        x = torch.randn(size, 3, 12, 12, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(runner.run([x])[0], expected, rtol=1e-4, atol=1e-5)


def test_only_frozen_cpu_compiles_get_the_pass():
    assert targets.get("cpu").graph_passes({"freezing": False}) == {}
    assert targets.get("cuda").graph_passes({"freezing": True}) == {}
    assert conv_prepack.VERSION in targets.get("cpu").key_facts(None)
