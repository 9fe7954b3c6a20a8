"""The bench's own arithmetic: rounds summarised with their spread, fresh starts and the
load_numpy()/load() target (the bench itself runs in `make bench`, not in the tests)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench")
import bench_report  # noqa: E402  (bench put benchmarks/ on the path)

from .conftest import one_input_spec  # noqa: E402


def test_rounds_rotate_so_no_variant_always_runs_first():
    orders = [bench.rotated(["a", "b", "c"], i) for i in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert {order[0] for order in orders} == {"a", "b", "c"}


def test_a_noisy_round_shows_as_spread_not_as_the_figure():
    runs = [{"median_ms": 40.0, "p90_ms": 41.0, "runs": 50, "first_call_s": 9.0, "page_faults_per_call": 3.0},
            {"median_ms": 400.0, "p90_ms": 900.0, "runs": 10, "first_call_s": 0.1, "page_faults_per_call": 900.0},
            {"median_ms": 42.0, "p90_ms": 44.0, "runs": 48, "first_call_s": 0.1, "page_faults_per_call": 4.0}]
    summary = bench.summarize(runs)
    assert summary["median_ms"] == 42.0 and summary["spread_ms"] == [40.0, 400.0]
    assert summary["first_call_s"] == 9.0  # the first round's: torch.compile's cold first call
    assert summary["rounds"] == 3 and summary["runs"] == 108
    assert summary["page_faults_per_call"] == 4.0


def _results(numpy_ms: float) -> dict:
    latency = {v: {b: {"median_ms": 10.0, "p90_ms": 11.0, "spread_ms": [9.5, 12.0], "rounds": 3, "runs": 30,
                       "first_call_s": 1.0} for b in ("1", "8")} for v in bench.VARIANTS}
    latency["wheel-numpy"]["8"]["median_ms"] = numpy_ms
    starts = {v: 1.0 for v in bench.VARIANTS}
    return {"batches": [1, 8], "latency_ms": latency, "cold_start_s": starts, "import_torch_s": 0.9,
            "cold_start_spread_s": {**{v: [0.9, 1.2] for v in bench.VARIANTS}, "import-torch": [0.8, 1.0]},
            "build": {"cold_s": 100.0, "cached_s": 2.0}}


def test_load_numpy_is_held_to_load_at_every_batch_size_either_way_round():
    checks = {t["target"]: t for t in bench.targets(_results(numpy_ms=11.0))}
    assert checks["load_numpy() and load() within 1.05x of each other (batch 1)"]["met"]
    slow = checks["load_numpy() and load() within 1.05x of each other (batch 8)"]
    assert slow["ratio"] == 1.1 and not slow["met"]
    fast = {t["target"]: t for t in bench.targets(_results(numpy_ms=9.0))}["load_numpy() and load() within 1.05x of each other (batch 8)"]
    assert fast["ratio"] == 1.111 and not fast["met"], "a load() 11% slower is as far from equal"


def test_the_table_carries_each_figures_spread():
    lines = bench_report.latency_table(_results(numpy_ms=10.0), bench.VARIANTS, bench.LABELS)
    wheel_row = next(line for line in lines if line.startswith("| this wheel, load() |"))
    assert wheel_row == "| this wheel, load() | 10.0 / 11.0 [9.5–12.0] | 10.0 / 11.0 [9.5–12.0] | 1.00 [0.90–1.20] |"


def test_perf_report_lines_are_summed_per_group():
    import sampling

    report = "    76.54%  libgomp.so.1   \n     5.90%  [JIT] tid 8820\n     3.45%  libtorch_cpu.so\n" \
             "     0.62%  model.so\n     0.30%  libcrypto.so.3\n     0.20%  libc10.so\n# comment\n"
    groups = sampling.grouped(report)["groups"]
    assert list(groups)[0] == "OpenMP runtime: barriers and waiting (libgomp)"
    assert groups["the model's generated kernels (model.so)"] == pytest.approx(0.0062)
    assert groups["other libraries"] == pytest.approx(0.005)


def test_a_real_sampling_profile_sees_where_a_process_spends_its_time(tmp_path):
    import sampling

    if not sampling.available():
        pytest.skip("perf is not installed")
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.5:\n    sum(range(1000))\n"
    groups = sampling.profile([sys.executable, "-c", spin], tmp_path, skip_s=0.3)["groups"]
    assert list(groups)[0] == "Python interpreter", groups


def test_onnx_runtime_profile_counts_only_the_timed_runs_per_group():
    import ort_profile

    def node(op, ts, dur):
        return {"cat": "Node", "name": f"{op}_1_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 99_000}, node("Conv", 10, 50_000),  # warm-up
        {"cat": "Session", "name": "model_run", "ts": 100_000, "dur": 10_000},
        node("Conv", 100_010, 4_000), node("FusedMatMul", 104_010, 2_000), node("Softmax", 106_010, 1_000),
        {"cat": "Session", "name": "model_run", "ts": 200_000, "dur": 12_000},
        node("NchwcConv", 200_010, 6_000), node("MatMul", 206_010, 2_000), node("Add", 208_010, 1_000),
    ]
    summary = ort_profile.summarize(events, calls=2)
    assert summary["run_ms"] == 11.0
    assert summary["groups_ms"] == {"convolution": 5.0, "linear / matmul": 2.0, ort_profile.OTHER: 1.0}
    assert list(summary["ops_ms"])[0] == "NchwcConv"


def test_the_gap_to_onnx_runtime_is_named_by_operation_group():
    import ort_profile

    wheel = {"convolution": 17.0, "linear / matmul": 5.5, "generated C++ kernels": 3.0, "other library calls": 0.5,
             "attention": 2.0}
    onnx = {"run_ms": 21.0, "groups_ms": {"convolution": 11.0, "linear / matmul": 6.0, ort_profile.OTHER: 3.0},
            "ops_ms": {"Conv": 11.0, "MatMul": 6.0}}
    lines = bench_report.versus_onnx(wheel, onnx)
    assert "| convolution | 17.00 | 11.00 | +6.00 |" in lines
    assert f"| {ort_profile.OTHER} | 3.50 | 3.00 | +0.50 |" in lines
    assert "| attention | 2.00 | 0.00 | +2.00 |" in lines
    assert lines[-1] == "| all | 28.00 | 20.00 | +8.00 |"


def test_the_benchs_own_compiles_use_the_wheels_graph_passes():
    """The .pt2, the profiled and the bf16 builds must compile as the wheel does (packed
    convolution weights included), or the bench compares against a different model."""
    from types import SimpleNamespace

    program, options = bench.program_for(SimpleNamespace(program="exported"),
                                         {"freezing": True, "aot_inductor.package_constants_in_so": False})
    assert program == "exported"
    assert options["freezing"] is True and "aot_inductor.package_constants_in_so" not in options
    assert type(options["post_grad_custom_pre_pass"]).__name__ == "PrepackDynamicConvWeights"


def test_layers_alone_finds_each_layer_and_times_the_kernel_the_wheel_calls():
    """The layers' sizes come from a real forward; the timed call is oneDNN's on packed weights,
    as the compiled model runs it, and its verbose log yields a time."""
    import layers_alone
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1),
                                torch.nn.Conv2d(8, 8, 1), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    seen = layers_alone.layers(model, (torch.randn(1, 3, 6, 6),))
    conv_1x1 = (layers_alone.CONV, ((1, 8, 6, 6), 8, (1, 1), (1, 1), (0, 0), (1, 1), 1))
    assert seen[conv_1x1] == 2 and seen[(layers_alone.LINEAR, (1, 288, 4))] == 1 and len(seen) == 3
    assert layers_alone.describe(*conv_1x1[:2]) == "8->8 1x1/1 at 6x6"
    assert layers_alone.onednn_ms(layers_alone.torch_call(*conv_1x1)) > 0


def test_layers_alone_says_whether_the_gap_is_in_the_kernels_or_around_them():
    import layers_alone

    alone = {"totals": {"convolution": {"torch_ms": 8.5, "onnxruntime_ms": 9.8, "count": 73},
                        "linear / matmul": {"torch_ms": 3.0, "onnxruntime_ms": 4.1, "count": 129}},
             "in_model_onednn_ms": {"convolution": 10.0, "linear / matmul": 4.5}}
    wheel, onnx = {"convolution": 12.19, "linear / matmul": 5.5}, {"convolution": 10.4, "linear / matmul": 5.2}
    lines = layers_alone.table(alone, wheel, onnx)
    assert "| convolution | 73 | 8.50 | 9.80 | 10.00 | 12.19 | 10.40 |" in lines
    assert lines[-1] == ("Alone, the wheel's convolution kernels are faster than ONNX Runtime's (8.50 against 9.80 ms); "
                         "inside the model they take +3.69 ms more than alone, ONNX Runtime's +0.60 ms. Of the wheel's, "
                         "+1.50 ms is in the kernels themselves (the same kernels, slower among the other layers' data: "
                         "weights and activations from memory rather than cache) and +2.19 ms around them: 30 µs a call "
                         "on the way from the compiled model through ATen and ideep to oneDNN.")
    del alone["in_model_onednn_ms"]  # an older results.json: the sentence stops before the split
    assert layers_alone.table(alone, wheel, onnx)[-1].endswith("ONNX Runtime's +0.60 ms.")


def test_heap_ab_table_shows_both_settings_and_the_ratios():
    import malloc_ab

    def entry(ms, faults):
        return {"median_ms": ms, "spread_ms": [ms - 0.5, ms + 0.5], "page_faults_per_call": faults}

    results = {"rounds": 3, "wheel": {"kept": entry(20.0, 2), "glibc": entry(22.0, 700)},
               "wheel-numpy": {"kept": entry(20.4, 3), "glibc": entry(26.4, 990)}}
    lines = malloc_ab.table(results)
    assert lines[2] == "| load() | 20.0 ms [19.5–20.5]; page faults a call: 2 | 22.0 ms [21.5–22.5]; page faults a call: 700 |"
    assert "load_numpy() / load(): 1.02x with the heap kept, 1.20x with glibc's defaults" in lines[-1]
    assert "load() 1.10x, load_numpy() 1.29x" in lines[-1] and "of 3 fresh processes" in lines[-1]


def test_heap_ab_runs_every_loader_and_setting_each_round_in_rotated_order():
    import malloc_ab

    calls = []

    def run_json(cmd, env):
        calls.append((cmd[0], env.get("MODELWHEEL_MALLOC", "kept")))
        return {"median_ms": 10.0, "p90_ms": 11.0, "runs": 20, "first_call_s": 0.1,
                "page_faults_per_call": 1.0 if not env else 500.0}

    results = malloc_ab.measure(run_json, lambda variant: [variant], rounds=2)
    assert len(calls) == 8 and set(calls) == {(v, s) for v in ("wheel", "wheel-numpy") for s in ("kept", "default")}
    assert calls[0] != calls[4], "the second round starts elsewhere"
    assert results["wheel-numpy"]["glibc"]["page_faults_per_call"] == 500.0 and results["rounds"] == 2


def test_the_kernels_own_time_in_the_shipped_model_is_set_against_the_call_and_the_target():
    import layers_alone

    alone = {"in_model_onednn_ms": {"convolution": 9.0, "linear / matmul": 4.0, "weight reorders": 0.5},
             "in_model_attention": {"attention_ms": 2.5, "attention_calls": 22.0, "call_ms": 19.0}}
    wheel = {"convolution": 11.0, "linear / matmul": 5.0, "attention": 2.9, "generated C++ kernels": 1.5}
    within = layers_alone.kernels_only(alone, wheel, wheel_ms=20.0, onnx_ms=19.0, target=0.9)
    assert "weight reorders 0.50 ms" in within and "attention 2.50 ms (22 calls" in within
    assert "make 16.0 ms a call, measured; the model's whole call took 19.0 ms in that process and 20.0 ms" in within
    assert within.endswith("0.9x ONNX Runtime is 17.1 ms: these kernels alone are within it: the rest of the call is "
                           "what misses the target.")
    over = layers_alone.kernels_only(alone, wheel, wheel_ms=20.0, onnx_ms=17.0, target=0.9)
    assert over.endswith("0.9x ONNX Runtime is 15.3 ms: these kernels alone are over it before the generated kernels "
                         "or any time between kernels is counted.")
    del alone["in_model_attention"]  # no C compiler, or an older results.json: no floor claimed
    assert layers_alone.kernels_only(alone, wheel, 20.0, 18.0, 0.9) == ""


ATTENTION_MODEL = """
import torch
from torch import nn


class TwoAttentions(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(x.shape[0], 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        once = nn.functional.scaled_dot_product_attention(q, k, v)
        return nn.functional.scaled_dot_product_attention(once, k, v).sum(1)


def build():
    return TwoAttentions()
"""


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler to build the attention timer")
def test_the_attention_timer_times_every_attention_call_of_a_compiled_model_in_place(tmp_path):
    """A real .so (frozen, as the wheel's: its linear layer runs on oneDNN) calling torch's
    attention twice a call: the preloaded timer sees both calls and a time that fits inside the
    model's call, and oneDNN's log its linear layer."""
    import layers_alone
    import torch

    (tmp_path / "model.py").write_text(ATTENTION_MODEL)
    (tmp_path / "spec.toml").write_text(one_input_spec("two_attentions", '["batch", 16, 32]', "tokens", "hidden"))
    namespace: dict = {}
    exec(ATTENTION_MODEL, namespace)
    torch.manual_seed(0)
    model, example = namespace["build"]().eval(), (torch.randn(2, 16, 32),)
    program = torch.export.export(model, example, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4)},))
    library = tmp_path / "model.so"
    with torch.no_grad():
        torch._inductor.aot_compile(program.module(), example, options={"freezing": True, "aot_inductor.output_path": str(library)})
    assert "scaled_dot_product_flash_attention_for_cpu" in library.read_bytes().decode("latin-1")

    inside = layers_alone.in_model_in_child(library, str(tmp_path / "spec.toml"))
    timed = inside["in_model_attention"]
    assert timed["attention_calls"] == 2.0
    assert inside["in_model_onednn_ms"]["linear / matmul"] > 0  # the qkv projection, oneDNN's own time
    assert 0 < timed["attention_ms"] < timed["call_ms"]
