"""The CPU target packs convolution weights at compile time for a dynamic batch too
(pipeline/targets/cpu_prepack.py), each only where oneDNN wants the same layout at every batch size:
the compiled model must give eager's results at every size, and never reorder a packed weight
into another blocked layout (oneDNN's reference code: 2.6x slower on the unet with AVX2)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from pipeline import targets
from pipeline.targets import cpu_prepack as conv_prepack


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


class WideConvs(nn.Module):
    """128-channel 3x3 convolutions at 16x16: with AVX2 oneDNN blocks their weights by 16
    channels at batch 1 and by 24 at batch 2 (on AVX-512 the same at every batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(8, 128, 3, padding=1)
        self.second = nn.Conv2d(128, 128, 3, padding=1)
        self.third = nn.Conv2d(128, 128, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.third(torch.relu(self.second(torch.relu(self.first(x)))))


def _compile(tmp_path, options: dict, model: nn.Module | None = None, example_size=(3, 12, 12)):
    torch.manual_seed(0)
    model = (model or Convs()).eval()
    example = (torch.randn(2, *example_size),)
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},), strict=False)
    library = tmp_path / "model.so"
    with torch.no_grad():
        torch._inductor.aot_compile(
            program.module(),
            example,
            options={**options, "fx_graph_cache": False, "aot_inductor.output_path": str(library)},
        )
    return model, targets.open_runner(targets.get("cpu"), library)


def test_dynamic_batch_convolutions_get_packed_weights_and_match_eager(tmp_path):
    options = {"freezing": True, "force_layout_optimization": True}
    passes = targets.get("cpu").graph_passes(options)
    model, runner = _compile(tmp_path, {**options, **passes})
    packed = [
        name for name in runner.get_constant_names_to_original_fqns() if name.endswith(conv_prepack.PACKED_SUFFIX)
    ]
    # Packed: exactly the weights oneDNN lays out one way at every batch size the dim allows.
    convs = {"conv": (1, 3, 12, 12), "depthwise": (1, 8, 12, 12), "pointwise": (1, 8, 12, 12), "head": (1, 16, 6, 6)}
    one_layout = {name for name, sizes in convs.items() if len(_layouts(getattr(model, name), sizes, range(1, 5))) == 1}
    assert len(packed) == len(one_layout), (packed, one_layout)
    for size in (1, 2, 3, 4):
        x = torch.randn(size, 3, 12, 12, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(runner.run([x])[0], expected, rtol=1e-4, atol=1e-5)


def test_only_frozen_cpu_compiles_get_the_pass():
    assert targets.get("cpu").graph_passes({"freezing": False}) == {}
    assert targets.get("cuda").graph_passes({"freezing": True}) == {}
    assert conv_prepack.VERSION in targets.get("cpu").key_facts(None)


def _compile_wide(tmp_path, model: WideConvs):
    """The model compiled as a frozen CPU build is, with the target's graph passes, batch 1 to 4."""
    options = {"freezing": True}
    return _compile(tmp_path, {**options, **targets.get("cpu").graph_passes(options)}, model, (8, 16, 16))


def _layouts(conv: nn.Conv2d, sizes: tuple[int, ...], batches) -> set[bytes]:
    """The weight layouts oneDNN picks for this convolution at these batch sizes."""
    layouts = set()
    with torch.no_grad():
        for batch in batches:
            packed = torch.ops.mkldnn._reorder_convolution_weight(
                conv.weight,
                list(conv.padding),
                list(conv.stride),
                list(conv.dilation),
                conv.groups,
                [batch, *sizes[1:]],
            )
            layouts.add(bytes(torch.ops.mkldnn._get_mkldnn_serialized_md(packed).numpy()))
    return layouts


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """WideConvs compiled once for the file's two tests of it, which only run it and read its constants."""
    return _compile_wide(tmp_path_factory.mktemp("wide"), WideConvs())


def test_no_packed_weight_is_reordered_at_any_batch_size(wide, capfd):
    model, runner = wide
    for size in (1, 2, 3, 4):
        x = torch.randn(size, 8, 16, 16)
        runner.run([x])  # oneDNN picks its primitives at the first call of a size
        capfd.readouterr()
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            got = runner.run([x])[0]
        reorders = [line for line in capfd.readouterr().out.splitlines() if ",reorder," in line and ",exec," in line]
        # A plain layout's tag is letters alone (abcd, acdb); a blocked one's carries its block size.
        blocked_to_blocked = [line for line in reorders if re.search(r"src:\w+:\w*:blocked:[A-Za-z]*\d", line)]
        assert not blocked_to_blocked, f"batch {size}: a packed weight reordered on every call:\n" + "\n".join(
            blocked_to_blocked
        )
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


def test_a_weight_whose_layout_depends_on_the_batch_is_left_plain(request):
    sizes = {"first": (1, 8, 16, 16), "second": (1, 128, 16, 16), "third": (1, 128, 16, 16)}
    model = WideConvs()  # the layouts oneDNN picks depend on the shapes alone: no compile before the skip
    one_layout = [name for name, size in sizes.items() if len(_layouts(getattr(model, name), size, range(1, 5))) == 1]
    if len(one_layout) == len(sizes):
        pytest.skip("this machine's oneDNN lays every weight out one way at every batch (AVX-512 does)")
    model, runner = request.getfixturevalue("wide")
    assert one_layout == [
        name for name, size in sizes.items() if len(_layouts(getattr(model, name), size, range(1, 5))) == 1
    ]
    packed = [
        name for name in runner.get_constant_names_to_original_fqns() if name.endswith(conv_prepack.PACKED_SUFFIX)
    ]
    assert len(packed) == len(one_layout), (packed, one_layout)


def test_probes_cover_the_dims_range():
    from torch.utils._sympy.value_ranges import ValueRanges

    assert conv_prepack._probe_values(ValueRanges(2, 8), 2) == list(
        range(1, 9)
    )  # the trace's 2 stands for the spec's 1
    assert conv_prepack._probe_values(ValueRanges(4, 1000), 16) == [4, 8, 16, 32, 64, 128, 256, 512, 1000]
