"""Pre-packed convolution weights for CPU models whose input sizes are dynamic.

With freezing, Inductor reorders each convolution's weight once, at compile time, into the
blocked layout oneDNN computes with, but only where every input size is fixed: with a dynamic
batch it leaves the plain weight, and oneDNN reorders it on every call. Measured here for the
unet's 8x8 convolutions at batch 1, that reorder makes a convolution 2.5x slower. The layout
oneDNN picks depends on the channels, kernel and strides, not on the batch: a weight packed for
the example batch runs at the packed speed at batch 1 and batch 8 alike (and where oneDNN does
want another layout for some size, it reorders it as it does the plain weight today; results
are the same either way, and verification checks them at every declared size).

This pass does what Inductor's own weight-pack pass does for fixed sizes (the same
``mkldnn._reorder_convolution_weight``), for the convolutions it left unpacked, taking each
dynamic size at its example value. It runs first among the post-grad passes, so the fusions
that follow (a convolution with its add, its activation) carry the packed weight along.
"""

from __future__ import annotations

import torch

try:
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # a torch without custom graph passes compiles as Inductor alone would
    CustomGraphPass = None

# Part of every CPU compile's cache key: a change to what this pass does must change it.
VERSION = "conv-prepack-1"
PACKED_SUFFIX = "_packed"


def _example_sizes(sizes) -> list[int] | None:
    """Each size as an int, a dynamic one at its example value; None if one has no example."""
    found = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            hint = getattr(size.node, "hint", None)
            if hint is None:
                return None
            found.append(int(hint))
        else:
            found.append(int(size))
    return found


def _attribute(module: torch.nn.Module, qualified_name: str):
    for part in qualified_name.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


class PrepackDynamicConvWeights(CustomGraphPass or object):
    # Inductor deep-copies its config, so an instance's own attributes never see a compile: the
    # packed weights show in the compiled model's constant names (``<weight>_packed``).
    def __call__(self, graph: torch.fx.Graph) -> None:
        module = graph.owning_module
        convolution = getattr(torch.ops.mkldnn, "_convolution_pointwise", None)
        if module is None or convolution is None:
            return
        packed: dict[tuple, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is convolution.default:
                self._pack(module, graph, node, packed)

    def _pack(self, module, graph, node: torch.fx.Node, packed: dict) -> None:
        source, weight_node = node.args[0], node.args[1]
        if not isinstance(source, torch.fx.Node) or not isinstance(weight_node, torch.fx.Node) or weight_node.op != "get_attr":
            return
        weight = _attribute(module, weight_node.target)
        value = source.meta.get("val")
        if not isinstance(weight, torch.Tensor) or weight.is_mkldnn or weight.dim() != 4 or value is None:
            return
        if all(not isinstance(size, torch.SymInt) for size in value.shape):
            return  # Inductor packs this one itself
        sizes = _example_sizes(value.shape)
        if sizes is None:
            return
        padding, stride, dilation, groups = node.args[3:7]
        key = (weight_node.target, tuple(padding), tuple(stride), tuple(dilation), groups, tuple(sizes))
        if key not in packed:
            with torch.no_grad():
                weight_packed = torch.ops.mkldnn._reorder_convolution_weight(
                    weight, list(padding), list(stride), list(dilation), groups, sizes)
            name = _free_name(module, f"{weight_node.target.replace('.', '_')}{PACKED_SUFFIX}")
            module.register_buffer(name, weight_packed)
            with graph.inserting_before(node):
                packed[key] = graph.get_attr(name)
            packed[key].meta["val"] = weight_node.meta.get("val")
        node.replace_input_with(weight_node, packed[key])
        if not weight_node.users:
            graph.erase_node(weight_node)

    def uuid(self) -> str:
        return VERSION


def _free_name(module: torch.nn.Module, base: str) -> str:
    name, count = base, 0
    while hasattr(module, name):
        count += 1
        name = f"{base}{count}"
    return name


def inductor_options() -> dict[str, object]:
    """What the CPU target adds to a compile's torch._inductor.config settings."""
    return {"post_grad_custom_pre_pass": PrepackDynamicConvWeights()} if CustomGraphPass else {}
