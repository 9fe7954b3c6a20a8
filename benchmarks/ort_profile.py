"""Where ONNX Runtime's time goes, per kind of operation, grouped as the wheel's kernel profile is
(variants.kernel_group): the side-by-side the bench's "what limits it" puts next to the wheel's
own profile, so a gap to ONNX Runtime is named by the operations it lies in, measured.

ONNX Runtime's profiler (``SessionOptions.enable_profiling``) records every node's kernel time
and every ``run()``; the groups are per call, averaged over the timed calls.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

# ONNX op types, by the group the wheel's profile puts the same work in (first match wins).
OP_GROUPS = [
    ("convolution", ("Conv", "FusedConv", "NchwcConv", "ConvTranspose")),
    ("linear / matmul", ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits")),
    ("attention", ("Attention", "MultiHeadAttention", "GroupQueryAttention")),
]
OTHER = "everything else (elementwise, norms, softmax, layout)"


def op_group(op_type: str) -> str:
    for group, types in OP_GROUPS:
        if op_type in types:
            return group
    return OTHER


def session(model: Path | str, **settings: object):
    """An ONNX Runtime session as the bench times it: the CPU provider on all cores, plus
    ``settings`` on its SessionOptions."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    for name, value in settings.items():
        setattr(options, name, value)
    return onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def profile(model: Path | str, arrays: list, calls: int = 10, warmup: int = 3) -> dict:
    """{"run_ms": wall ms per run() under the profiler, "groups_ms": {group: ms per call},
    "ops_ms": {op type: ms per call}} for ``model`` on ``arrays`` (numpy, in the model's input
    order), with the session options the bench times ONNX Runtime with (session())."""
    return summarize(profiled_events(model, arrays, calls + warmup), calls)


def node_times(model: Path | str, arrays: list, calls: int, warmup: int) -> dict[str, list[float]]:
    """{op type: [kernel ms of each of its nodes in each of the last ``calls`` runs]}."""
    events = profiled_events(model, arrays, calls + warmup)
    begin = _last_runs(events, calls)[0]["ts"]
    times: dict[str, list[float]] = defaultdict(list)
    for event in _node_events(events, begin):
        times[event["args"]["op_name"]].append(event["dur"] / 1000)
    return dict(times)


def profiled_events(model: Path | str, arrays: list, runs: int) -> list[dict]:
    """ONNX Runtime's profiler events over ``runs`` runs of ``model`` on ``arrays``."""
    with tempfile.TemporaryDirectory() as scratch:
        profiled = session(model, enable_profiling=True, profile_file_prefix=str(Path(scratch) / "ort"))
        feeds = {i.name: array for i, array in zip(profiled.get_inputs(), arrays)}
        for _ in range(runs):
            profiled.run(None, feeds)
        events: list[dict] = json.loads(Path(profiled.end_profiling()).read_text())
        return events


def _last_runs(events: list[dict], calls: int) -> list[dict]:
    return sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )[-calls:]


def _node_events(events: list[dict], begin: float) -> list[dict]:
    return [
        e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= begin
    ]


def summarize(events: list[dict], calls: int) -> dict:
    """The profile's last ``calls`` runs: the nodes that ran inside them, by op type and group."""
    runs = _last_runs(events, calls)
    if not runs:
        return {"run_ms": 0.0, "groups_ms": {}, "ops_ms": {}}
    ops: dict[str, float] = defaultdict(float)
    for event in _node_events(events, runs[0]["ts"]):
        ops[event["args"]["op_name"]] += event["dur"] / calls / 1000
    groups: dict[str, float] = defaultdict(float)
    for op_type, ms in ops.items():
        groups[op_group(op_type)] += ms
    return {
        "run_ms": sum(e["dur"] for e in runs) / len(runs) / 1000,
        "groups_ms": dict(groups),
        "ops_ms": dict(sorted(ops.items(), key=lambda item: -item[1])),
    }
