"""The model's convolutions and linear layers one at a time, at batch 1: torch's oneDNN kernel
(what the wheel's compiled model calls: packed weights, channels-last activations) against ONNX
Runtime's kernel for the same layer, each engine's own kernel time.

    python benchmarks/layers_alone.py --spec models/unet/spec.toml

Measured evidence for the bench's "what limits it": where the wheel trails ONNX Runtime in
these kernels, no graph-level change in the pipeline can close the gap, as the kernels are
torch's. Both sides are timed the same way: the kernel's execution only (oneDNN's verbose
exec_time; ONNX Runtime's profiler node time, its layout reorders left out), the median of
CALLS calls after WARMUP, weights warm in cache (so the totals are each engine's best case).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ort_profile  # noqa: E402  (this folder is on sys.path)
from pipeline.export import spec_inputs  # noqa: E402
from pipeline.loader import load_model  # noqa: E402
from pipeline.spec import load_spec  # noqa: E402
from pipeline.templates import wheel_inputs  # noqa: E402

WARMUP, CALLS = 5, 30
CONV, LINEAR = "convolution", "linear / matmul"


def layers(module: torch.nn.Module, args: tuple) -> Counter:
    """(kind, sizes) of every Conv2d and Linear call in one forward, with how often each ran."""
    seen: Counter = Counter()

    def conv(layer, inputs, _output):
        x = inputs[0]
        seen[(CONV, (tuple(x.shape), layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                     layer.dilation, layer.groups))] += 1

    def linear(layer, inputs, _output):
        rows = inputs[0].numel() // layer.in_features
        seen[(LINEAR, (rows, layer.in_features, layer.out_features))] += 1

    hooks = [m.register_forward_hook(conv) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks += [m.register_forward_hook(linear) for m in module.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        module(*args)
    for hook in hooks:
        hook.remove()
    return seen


def torch_call(kind: str, sizes: tuple):
    """The layer as the compiled model runs it: oneDNN's op on weights packed ahead of time."""
    if kind == CONV:
        shape, out_ch, kernel, stride, padding, dilation, groups = sizes
        weight = torch.randn(out_ch, shape[1] // groups, *kernel) * 0.05
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
        packed = torch.ops.mkldnn._reorder_convolution_weight(weight, list(padding), list(stride), list(dilation),
                                                              groups, list(shape))
        bias = torch.randn(out_ch)
        return lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, bias, list(padding), list(stride),
                                                               list(dilation), groups, "none", [], "")
    rows, in_features, out_features = sizes
    weight, bias, x = torch.randn(out_features, in_features) * 0.05, torch.randn(out_features), torch.randn(rows, in_features)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    return lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def onednn_ms(call) -> float:
    """Median oneDNN exec_time of ``call``'s primitive over CALLS calls (its verbose log, read
    from the process's stdout, where oneDNN writes it)."""
    for _ in range(WARMUP):
        call()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile("w+") as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                for _ in range(CALLS):
                    call()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        times = [float(line.rsplit(",", 1)[1]) for line in log if ",exec,cpu," in line]
    if not times:
        raise RuntimeError("oneDNN wrote no verbose exec lines (a torch built without oneDNN verbose?)")
    return statistics.median(times)


def onnx_model(kind: str, sizes: tuple, path: Path) -> list[np.ndarray]:
    """A one-node ONNX model of the layer, saved at ``path``; returns its input arrays."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if kind == CONV:
        shape, out_ch, kernel, stride, padding, dilation, groups = sizes
        weight = (rng.standard_normal((out_ch, shape[1] // groups, *kernel)) * 0.05).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(kernel), strides=list(stride),
                                pads=[*padding, *padding], dilations=list(dilation), group=groups)
    else:
        shape, out_ch = (sizes[0], sizes[1]), sizes[2]
        weight = (rng.standard_normal((sizes[1], out_ch)) * 0.05).astype(np.float32)
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"])
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"),
                               numpy_helper.from_array(rng.standard_normal(out_ch).astype(np.float32), "b")])
    # IR 9 / opset 17: what every ONNX Runtime the bench may meet reads
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return [rng.standard_normal(shape).astype(np.float32)]


def onnxruntime_ms(kind: str, sizes: tuple, scratch: Path) -> float:
    """Median kernel time of the layer's own node (Conv, Gemm or their NCHWc/fused forms) over CALLS runs."""
    path = scratch / "layer.onnx"
    arrays = onnx_model(kind, sizes, path)
    nodes = ort_profile.node_times(path, arrays, calls=CALLS, warmup=WARMUP)
    kernels = [ms for op, times in nodes.items() if ort_profile.op_group(op) == kind for ms in times]
    if len(kernels) != CALLS:
        raise RuntimeError(f"expected one {kind} node per run in ONNX Runtime's profile, got {sorted(nodes)}")
    return statistics.median(kernels)


def describe(kind: str, sizes: tuple) -> str:
    if kind == CONV:
        shape, out_ch, kernel, stride = sizes[:4]
        return f"{shape[1]}->{out_ch} {kernel[0]}x{kernel[1]}/{stride[0]} at {shape[2]}x{shape[3]}"
    return f"{sizes[0]}x{sizes[1]} @ {sizes[1]}x{sizes[2]}"


def table(alone: dict, wheel_groups: dict, onnx_groups: dict) -> list[str]:
    """The bench's lines: each group's layers alone (both engines' kernels) beside the same
    group inside the whole model (the wheel's kernel profile, ONNX Runtime's profiler)."""
    lines = ["The same layers one at a time, at batch 1 (`benchmarks/layers_alone.py`: each engine's kernel time only, "
             "weights warm in cache), beside the same groups inside the whole model (the profiles above):", "",
             "| operations | layers | alone: torch's oneDNN (the wheel's kernels) | alone: ONNX Runtime "
             "| in the model: wheel | in the model: ONNX Runtime |", "|---|---|---|---|---|---|"]
    for group, total in alone["totals"].items():
        lines.append(f"| {group} | {total['count']} | {total['torch_ms']:.2f} | {total['onnxruntime_ms']:.2f} "
                     f"| {wheel_groups.get(group, 0.0):.2f} | {onnx_groups.get(group, 0.0):.2f} |")
    lines += ["", "(In the model, ONNX Runtime's linear / matmul group also holds attention's two matmuls, "
              "which the wheel counts under attention.)"]
    conv = alone["totals"].get(CONV)
    if conv and CONV in wheel_groups and CONV in onnx_groups:
        wheel_extra, onnx_extra = wheel_groups[CONV] - conv["torch_ms"], onnx_groups[CONV] - conv["onnxruntime_ms"]
        faster = "faster" if conv["torch_ms"] < conv["onnxruntime_ms"] else "slower"
        lines += ["", f"Alone, the wheel's convolution kernels are {faster} than ONNX Runtime's ({conv['torch_ms']:.2f} "
                  f"against {conv['onnxruntime_ms']:.2f} ms); inside the model they take {wheel_extra:+.2f} ms more than "
                  f"alone, ONNX Runtime's {onnx_extra:+.2f} ms: what the wheel loses there is around its kernels "
                  "(each call's dispatch through ATen and oneDNN, weights arriving from memory rather than cache), "
                  "not in them."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    spec_file = load_spec(args.spec)
    module = load_model(spec_file).module.eval()
    inputs = tuple(wheel_inputs.make_inputs(spec_inputs(spec_file), {name: 1 for name in spec_file.spec.dims}, seed=0))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for (kind, sizes), count in layers(module, inputs).most_common():
            rows.append({"kind": kind, "layer": describe(kind, sizes), "count": count,
                         "torch_ms": onednn_ms(torch_call(kind, sizes)),
                         "onnxruntime_ms": onnxruntime_ms(kind, sizes, Path(scratch))})
    totals = {kind: {engine: sum(r[engine] * r["count"] for r in rows if r["kind"] == kind)
                     for engine in ("torch_ms", "onnxruntime_ms")} | {"count": sum(r["count"] for r in rows if r["kind"] == kind)}
              for kind in (CONV, LINEAR) if any(r["kind"] == kind for r in rows)}
    print(json.dumps({"batch": 1, "threads": torch.get_num_threads(), "layers": rows, "totals": totals}))


if __name__ == "__main__":
    main()
