"""The model's convolutions and linear layers one at a time, at batch 1: torch's oneDNN kernel
(what the wheel's compiled model calls: packed weights, channels-last activations) against ONNX
Runtime's kernel for the same layer, each engine's own kernel time.

    python benchmarks/layers_alone.py --spec models/unet/spec.toml

Measured evidence for the bench's "what limits it": whether the wheel trails ONNX Runtime in
the kernels themselves (torch's, which no graph-level change in the pipeline replaces) or around
them. Both sides are timed the same way: the kernel's execution only (oneDNN's verbose
exec_time; ONNX Runtime's profiler node time, its layout reorders left out), the median of
CALLS calls after WARMUP, weights warm in cache (so the totals are each engine's best case).
With ``--library`` (the wheel's own model.so), the same oneDNN kernels are timed inside the
whole model too, which splits the wheel's time in the model into its kernels' own and each
call's way to them, and the model's attention calls are timed in place (attention_timer.c,
preloaded), both in a fresh process: together a floor under the wheel's call, measured in the
shipped model itself, not in a profiled build. Convolutions with string padding ("same") or a
padding mode other than zeros are left out.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ort_profile  # noqa: E402  (this folder is on sys.path)
import variants  # noqa: E402

WARMUP, CALLS = 5, 30
CONV, LINEAR, REORDER = "convolution", "linear / matmul", "weight reorders"


def layers(module: torch.nn.Module, args: tuple) -> Counter:
    """(kind, sizes) of every Conv2d and Linear call in one forward, with how often each ran."""
    seen: Counter = Counter()

    def conv(layer, inputs, _output):
        x = inputs[0]
        if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
            return
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


def onednn_exec(call, calls: int = CALLS) -> list[tuple[str, float]]:
    """(primitive kind, exec ms) of every oneDNN primitive ``call`` runs, over ``calls`` calls after
    WARMUP: oneDNN's verbose log, read from the process's stdout, where oneDNN writes it."""
    for _ in range(WARMUP):
        call()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile("w+") as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                for _ in range(calls):
                    call()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        # onednn_verbose,v1,primitive,exec,cpu,<kind>,<implementation>,...,<exec ms>
        found = [(fields[5], float(fields[-1])) for fields in (line.split(",") for line in log) if fields[3:5] == ["exec", "cpu"]]
    if not found:
        raise RuntimeError("oneDNN wrote no verbose exec lines (a torch built without oneDNN verbose?)")
    return found


def onednn_ms(call) -> float:
    """Median exec time of the one oneDNN primitive ``call`` runs."""
    return statistics.median(ms for _, ms in onednn_exec(call))


def in_model_ms(run_once) -> dict[str, float]:
    """The compiled model's oneDNN kernels, their execution only, per call and group: the same
    kernels as alone, now inside the model (caches holding other layers' data), without the
    dispatch a call makes to reach them. Weight reorders (the weights not packed ahead of time)
    are a group of their own."""
    groups = {"convolution": CONV, "inner_product": LINEAR, "matmul": LINEAR, "reorder": REORDER}
    calls, totals = 10, {}
    for kind, ms in onednn_exec(run_once, calls):
        if kind in groups:
            totals[groups[kind]] = totals.get(groups[kind], 0.0) + ms / calls
    return totals


def attention_timer(scratch: Path) -> Path | None:
    """benchmarks/attention_timer.c built for LD_PRELOAD, or None where no C compiler is found."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    built = scratch / "attention_timer.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(Path(__file__).with_name("attention_timer.c")),
                    "-ldl"], check=True, capture_output=True)
    return built


def in_model_attention(run_once, totals, calls: int = 20) -> dict[str, float]:
    """The shipped model's attention calls timed in place by the preloaded attention timer (its
    ``totals`` function; no oneDNN verbose on), with the model's whole call timed over the same
    calls: {"attention_ms", "attention_calls", "call_ms"}, per call of the model."""
    for _ in range(WARMUP):
        run_once()
    attention_ms, attention_calls = ctypes.c_double(), ctypes.c_long()
    totals(ctypes.byref(attention_ms), ctypes.byref(attention_calls), 1)
    started = time.perf_counter()
    for _ in range(calls):
        run_once()
    call_ms = (time.perf_counter() - started) * 1000 / calls
    totals(ctypes.byref(attention_ms), ctypes.byref(attention_calls), 1)
    return {"attention_ms": attention_ms.value / calls, "attention_calls": attention_calls.value / calls, "call_ms": call_ms}


def in_model_in_child(library: Path, spec: str) -> dict:
    """in_model_ms() and, with the attention timer preloaded (it has to be there before torch and
    the model are opened), in_model_attention(), in a fresh process: run after the layers alone in
    this one, the same model's linear layers measured twice as slow as in a fresh process.
    {"in_model_onednn_ms", "in_model_attention"}, the latter None where no C compiler is found."""
    with tempfile.TemporaryDirectory() as scratch:
        timer = attention_timer(Path(scratch))
        preload = {"LD_PRELOAD": str(timer)} if timer else {}
        done = subprocess.run([sys.executable, __file__, "--spec", spec, "--library", str(library), "--in-model-only"],
                              capture_output=True, text=True, env={**os.environ, **preload})
    if done.returncode != 0:
        raise RuntimeError(f"timing the kernels inside the model failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_model_only(library: Path, spec: str) -> dict:
    """The child's side of in_model_in_child(), on one opening of the model at batch 1 (the bench's
    .so runner): attention first, with oneDNN's verbose log off."""
    run_once = variants.make_runner("so", spec, 1, str(library))
    totals = getattr(ctypes.CDLL(None), "attention_timer_totals", None)  # None: the timer is not preloaded
    timed = in_model_attention(run_once, totals) if totals else None
    return {"in_model_onednn_ms": in_model_ms(run_once), "in_model_attention": timed}


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
    group inside the whole model (the wheel's oneDNN kernels alone and with their dispatch,
    ONNX Runtime's nodes)."""
    inside = alone.get("in_model_onednn_ms", {})
    lines = ["The same layers one at a time, at batch 1 (`benchmarks/layers_alone.py`: each engine's kernel time only, "
             "weights warm in cache), beside the same groups inside the whole model (the profiles above, the wheel's "
             "from its kernel-profile build; and oneDNN's own kernel time inside the shipped model.so, without each "
             "call's dispatch):", "",
             "| operations | layers | alone: torch's oneDNN (the wheel's kernels) | alone: ONNX Runtime "
             "| in the shipped model: wheel's oneDNN kernels only | in the model: wheel (profiled build) "
             "| in the model: ONNX Runtime |",
             "|---|---|---|---|---|---|---|"]
    for group, total in alone["totals"].items():
        kernels = f"{inside[group]:.2f}" if group in inside else "-"
        lines.append(f"| {group} | {total['count']} | {total['torch_ms']:.2f} | {total['onnxruntime_ms']:.2f} "
                     f"| {kernels} | {wheel_groups.get(group, 0.0):.2f} | {onnx_groups.get(group, 0.0):.2f} |")
    lines += ["", "(In the model, ONNX Runtime's linear / matmul group also holds attention's two matmuls, "
              "which the wheel counts under attention.)"]
    conv = alone["totals"].get(CONV)
    if conv and CONV in wheel_groups and CONV in onnx_groups:
        lines += ["", _conv_sentence(conv, inside.get(CONV), wheel_groups[CONV], onnx_groups[CONV])]
    return lines


def _conv_sentence(conv: dict, kernels_ms: float | None, wheel_ms: float, onnx_ms: float) -> str:
    faster = "faster" if conv["torch_ms"] < conv["onnxruntime_ms"] else "slower"
    text = (f"Alone, the wheel's convolution kernels are {faster} than ONNX Runtime's ({conv['torch_ms']:.2f} against "
            f"{conv['onnxruntime_ms']:.2f} ms); inside the model they take {wheel_ms - conv['torch_ms']:+.2f} ms more "
            f"than alone, ONNX Runtime's {onnx_ms - conv['onnxruntime_ms']:+.2f} ms.")
    if kernels_ms is None:
        return text
    per_call = (wheel_ms - kernels_ms) / conv["count"] * 1000
    return text + (f" Of the wheel's, {kernels_ms - conv['torch_ms']:+.2f} ms is in the kernels themselves (the same "
                   f"kernels, slower among the other layers' data: weights and activations from memory rather than cache) "
                   f"and {wheel_ms - kernels_ms:+.2f} ms around them: {per_call:.0f} µs a call on the way from the "
                   "compiled model through ATen and ideep to oneDNN.")


def kernels_only(alone: dict, wheel_groups: dict, wheel_ms: float, onnx_ms: float, target: float) -> str:
    """The kernels' own time inside the shipped model, added up, against the wheel's call and the
    target: a floor under the call, since the kernels run one after another; what is left of the
    call is spent between them and in the generated kernels."""
    inside, attention = alone.get("in_model_onednn_ms", {}), alone.get("in_model_attention")
    if CONV not in inside or LINEAR not in inside or attention is None:
        return ""
    onednn = inside[CONV] + inside[LINEAR] + inside.get(REORDER, 0.0)
    floor = onednn + attention["attention_ms"]
    verdict = ("within it: the rest of the call is what misses the target" if floor <= target * onnx_ms
               else "over it before the generated kernels or any time between kernels is counted")
    return (f"Kernels timed inside the shipped model (the wheel's own model.so, batch 1): oneDNN's convolutions "
            f"{inside[CONV]:.2f}, linear layers {inside[LINEAR]:.2f} and weight reorders {inside.get(REORDER, 0.0):.2f} ms "
            f"(oneDNN's own execution times), and attention {attention['attention_ms']:.2f} ms "
            f"({attention['attention_calls']:.0f} calls, each timed around torch's attention function by "
            f"`benchmarks/attention_timer.c`, preloaded), make {floor:.1f} ms a call, measured; the model's whole call took "
            f"{attention['call_ms']:.1f} ms in that process and {wheel_ms:.1f} ms through the wheel. The rest is the "
            f"generated kernels ({wheel_groups.get('generated C++ kernels', 0.0):.2f} ms in the kernel profile above) "
            f"and the way between kernels. {target}x ONNX Runtime is {target * onnx_ms:.1f} ms: these kernels alone are "
            f"{verdict}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--library", type=Path, help="the wheel's own model.so: its oneDNN kernels and attention calls timed in place too")
    parser.add_argument("--in-model-only", action="store_true",
                        help="with --library: only time the kernels inside the model (run by --library in a fresh process)")
    args = parser.parse_args()
    if args.in_model_only:
        print(json.dumps(in_model_only(args.library, args.spec)))
        return
    spec_file, inputs = variants.spec_inputs(args.spec, 1)
    module = variants.eager_module(spec_file).eval()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for (kind, sizes), count in layers(module, tuple(inputs)).most_common():
            rows.append({"kind": kind, "layer": describe(kind, sizes), "count": count,
                         "torch_ms": onednn_ms(torch_call(kind, sizes)),
                         "onnxruntime_ms": onnxruntime_ms(kind, sizes, Path(scratch))})
    totals = {}
    for kind in (CONV, LINEAR):
        of_kind = [row for row in rows if row["kind"] == kind]
        if of_kind:
            totals[kind] = {engine: sum(row[engine] * row["count"] for row in of_kind) for engine in ("torch_ms", "onnxruntime_ms")}
            totals[kind]["count"] = sum(row["count"] for row in of_kind)
    result = {"batch": 1, "threads": torch.get_num_threads(), "layers": rows, "totals": totals}
    if args.library:
        result.update(in_model_in_child(args.library, args.spec))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
