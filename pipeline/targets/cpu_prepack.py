"""Pre-packed convolution weights for CPU models whose input sizes are dynamic.

With freezing, Inductor reorders each convolution's weight once, at compile time, into the
blocked layout oneDNN computes with, but only where every input size is fixed: with a dynamic
batch it leaves the plain weight, and oneDNN reorders it on every call (a fast JIT reorder;
measured for the unet's 8x8 convolutions at batch 1 on AVX-512, it made a convolution 2.5x
slower).

This pass does what Inductor's own weight-pack pass does for fixed sizes (the same
``mkldnn._reorder_convolution_weight``), for the convolutions it left unpacked, but only where
the layout oneDNN picks is the same at every size the dims allow. That layout depends on the
machine's ISA and, on some, on the input's size: with AVX2 (an AMD EPYC without AVX-512) the
unet's 128-channel 3x3 convolutions want 16-channel blocks at batch 1 and 24-channel blocks at
batch 2. A weight packed for one size and called at another is reordered from one blocked
layout to the other on every call, and oneDNN has only its reference (scalar) code for that:
packed at the example batch, the unet ran at batch 1 in 162 ms against 62 ms with plain
weights. So each weight's layout is asked of oneDNN at the example sizes and at the bounds and
powers of two of every dynamic size (every value where the range is small), and the weight is
packed only if all agree; otherwise it stays plain and gets the fast reorder.

It runs first among the post-grad passes, so the fusions that follow (a convolution with its
add, its activation) carry the packed weight along.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass  # every torch the package admits (>= 2.11) has it

# Part of every CPU compile's cache key: a change to what this pass does must change it.
VERSION = "conv-prepack-2"
# A dynamic size whose range holds at most this many values is probed at every one of them.
EVERY_VALUE_UP_TO = 64
PACKED_SUFFIX = "_packed"


def _probe_sizes(shape: Sequence[int | torch.SymInt]) -> list[list[int]] | None:
    """The input sizes to ask oneDNN's layout at: the example sizes, then each dynamic symbol
    alone at the values _probe_values gives, then all of them at their lower and at their upper
    bounds. None where a size has no example or its range cannot be read."""
    try:
        exprs = [size.node.expr if isinstance(size, torch.SymInt) else int(size) for size in shape]
        symbolic = [size for size in shape if isinstance(size, torch.SymInt)]
        shape_env = symbolic[0].node.shape_env
        symbols = sorted({symbol for size in symbolic for symbol in size.node.expr.free_symbols}, key=str)
        examples = (
            getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
        )  # the newer name, where torch has it
        hints = {symbol: int(examples[symbol]) for symbol in symbols}
        values = {symbol: _probe_values(shape_env.var_to_range[symbol], hints[symbol]) for symbol in symbols}
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None
    choices = [hints] + [{**hints, symbol: value} for symbol in symbols for value in values[symbol]]
    choices += [{symbol: values[symbol][0] for symbol in symbols}, {symbol: values[symbol][-1] for symbol in symbols}]
    probes: list[list[int]] = []
    for choice in choices:
        try:
            sizes = [expr if isinstance(expr, int) else int(expr.subs(choice)) for expr in exprs]
        except TypeError:  # a size over a symbol with no example (data-dependent): left plain
            return None
        if sizes not in probes and all(size > 0 for size in sizes):
            probes.append(sizes)
    return probes


def _probe_values(value_range: Any, hint: int) -> list[int]:
    """Every value of a small range; of a large or unbounded one its bounds, the example and the
    powers of two between (an unbounded range up to 8x the example, at least 64), ascending."""
    # The trace assumes every dynamic size is at least 2 (export specialises 0 and 1), while the
    # compiled model runs at 1 wherever the spec's dim allows it.
    low = _finite(value_range.lower) or 1
    low = 1 if low <= 2 else low
    high = _finite(value_range.upper) or max(8 * hint, 64)
    if high - low < EVERY_VALUE_UP_TO:
        return list(range(low, high + 1))
    powers = {2**k for k in range(high.bit_length()) if low < 2**k < high}
    return sorted({low, hint, high} | powers)


def _finite(bound: Any) -> int | None:
    try:  # sympy's and torch's infinities refuse int() in different ways
        return int(bound)
    except (AttributeError, OverflowError, TypeError, ValueError):
        return None


def _one_layout(
    weight: torch.Tensor,
    padding: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    probes: list[list[int]],
) -> torch.Tensor | None:
    """The weight packed for the first probe, if oneDNN wants that very layout at every probe."""
    layout_of = getattr(torch.ops.mkldnn, "_get_mkldnn_serialized_md", None)
    if layout_of is None:  # a torch that cannot tell a packed weight's layout: none is packed
        return None
    packed, layouts = None, set()
    with torch.no_grad():
        for sizes in probes:
            at_size = torch.ops.mkldnn._reorder_convolution_weight(
                weight, list(padding), list(stride), list(dilation), groups, sizes
            )
            layouts.add(bytes(layout_of(at_size).numpy()))
            packed = at_size if packed is None else packed
            if len(layouts) > 1:
                return None
    return packed


def _attribute(module: torch.nn.Module, qualified_name: str) -> object:
    found: object = module
    for part in qualified_name.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


class PrepackDynamicConvWeights(CustomGraphPass):
    # Inductor deep-copies its config, so an instance's own attributes never see a compile: the
    # packed weights show in the compiled model's constant names (``<weight>_packed``).
    def __call__(self, graph: torch.fx.Graph) -> None:
        module = graph.owning_module
        convolution = getattr(torch.ops.mkldnn, "_convolution_pointwise", None)
        if module is None or convolution is None:
            return
        packed: dict[tuple, torch.fx.Node | None] = {}  # None: left plain
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is convolution.default:
                self._pack(module, graph, node, packed)

    def _pack(self, module: torch.fx.GraphModule, graph: torch.fx.Graph, node: torch.fx.Node, packed: dict) -> None:
        source, weight_node = node.args[0], node.args[1]
        if (
            not isinstance(source, torch.fx.Node)
            or not isinstance(weight_node, torch.fx.Node)
            or weight_node.op != "get_attr"
        ):
            return
        weight = _attribute(module, str(weight_node.target))
        value = source.meta.get("val")
        if not isinstance(weight, torch.Tensor) or weight.is_mkldnn or weight.dim() != 4 or value is None:
            return
        if all(not isinstance(size, torch.SymInt) for size in value.shape):
            return  # Inductor packs this one itself
        padding, stride, dilation, groups = cast(
            tuple[Sequence[int], Sequence[int], Sequence[int], int], node.args[3:7]
        )
        key = (weight_node.target, tuple(padding), tuple(stride), tuple(dilation), groups, tuple(map(str, value.shape)))
        if key not in packed:
            probes = _probe_sizes(value.shape)
            weight_packed = _one_layout(weight, padding, stride, dilation, groups, probes) if probes else None
            packed[key] = None if weight_packed is None else _register(module, graph, node, weight_node, weight_packed)
        if packed[key] is None:
            return  # its layout depends on the size, or cannot be told: left plain
        node.replace_input_with(weight_node, packed[key])
        if not weight_node.users:
            graph.erase_node(weight_node)

    def uuid(self) -> str:
        return VERSION


def _register(
    module: torch.fx.GraphModule,
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    weight_node: torch.fx.Node,
    weight_packed: torch.Tensor,
) -> torch.fx.Node:
    """The packed weight as a buffer of the module, read by a node placed before ``node``."""
    name = _free_name(module, f"{str(weight_node.target).replace('.', '_')}{PACKED_SUFFIX}")
    module.register_buffer(name, weight_packed)
    with graph.inserting_before(node):
        read = graph.get_attr(name)
    read.meta["val"] = weight_node.meta.get("val")
    return read


def _free_name(module: torch.nn.Module, base: str) -> str:
    name, count = base, 0
    while hasattr(module, name):
        count += 1
        name = f"{base}{count}"
    return name


def inductor_options() -> dict[str, object]:
    """What the CPU target adds to a compile's torch._inductor.config settings."""
    return {"post_grad_custom_pre_pass": PrepackDynamicConvWeights()}
