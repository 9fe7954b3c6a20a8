"""The CUDA-graph path's CPU side (issue 42), on the tiny CPU wheel in its own venv.

The .so's single-threaded entry point (``_direct.DirectRunner``, ctypes) runs for real on the CPU
.so; only the graph itself, which needs a GPU, is stood in for by a fake with the same interface
(``_graphs.GraphBackend``): its "capture" runs the model once into tensors it keeps, and its
"replay" runs the model again on the captured inputs and writes into those tensors, as a CUDA
graph does. tests/test_cuda_gpu.py runs the real graphs on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from pipeline.wheel_template.runtime import _target_cuda as wheel_cuda

# Runs in the installed venv; prints one JSON object of what each check saw.
SCRIPT = r"""
import json, threading, warnings
import torch
import model_tiny as t
from model_tiny._direct import DirectRunner
from model_tiny._graphs import GraphCaptureWarning, GraphRunner
from model_tiny._weights import load_into


class FakeGraph:
    def __init__(self, run):
        self.run, self.outputs = run, run()

    def replay(self):
        for mine, new in zip(self.outputs, self.run()):
            mine.copy_(new)


class Fake:
    def capture(self, run, warmups):
        for _ in range(warmups):
            run()
        graph = FakeGraph(run)
        return graph, graph.outputs


class Refusing:
    def capture(self, run, warmups):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


model = t.load()
seen = {"info": model.info()}
inputs = {b: list(t.example_inputs(seed=b, batch=b)) for b in (1, 2, 3, 4)}
expected = {b: list(model(*x)) for b, x in inputs.items()}
direct = DirectRunner(model.library, "cpu", None, lambda: None)
seen["direct_equals_run"] = [same(direct.run(inputs[b]), expected[b]) for b in (1, 3, 4)]

graphs = GraphRunner(direct, Fake(), "model_tiny", max_graphs=2)
seen["cache_outputs"] = [same(graphs.run(inputs[b]), expected[b]) for b in (1, 2, 1, 3)]
seen["cache_captures"] = graphs.captures
seen["cache_held"] = graphs.info()["graphs"]

first = graphs.run(inputs[1])
second = graphs.run(inputs[2])
graphs.run(list(t.example_inputs(seed=9, batch=1)))
seen["copied_kept"] = same(first, expected[1]) and same(second, expected[2])
graphs.copy_outputs = False
first = graphs.run(inputs[1])
graphs.run(list(t.example_inputs(seed=9, batch=1)))
seen["own_overwritten"] = not same(first, expected[1]) and same(first, list(model(*t.example_inputs(seed=9, batch=1))))
graphs.copy_outputs = True

threaded = GraphRunner(direct, Fake(), "model_tiny", max_graphs=2)
cases = [list(t.example_inputs(seed=10 + seed, batch=b)) for b in (1, 2) for seed in range(4)]
answers = [list(model(*x)) for x in cases]
wrong = []
def caller(index):
    for round in range(50):  # four threads, two shapes: each graph is wanted by two threads at once
        case = (index + 3 * round) % len(cases)
        if not same(threaded.run(cases[case]), answers[case]):
            wrong.append((index, round, case))
workers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
[w.start() for w in workers]
[w.join() for w in workers]
seen["threads_wrong"] = wrong

swapping = GraphRunner(DirectRunner(model.library, "cpu", None, lambda: None), Fake(), "model_tiny")
before = swapping.run(inputs[2])
doubled = {name: 2 * tensor if tensor.is_floating_point() else tensor
           for name, tensor in model._runner.extract_constants_map(False).items()}
load_into(swapping, doubled, inactive=True)
seen["swap_inactive_untouched"] = same(swapping.run(inputs[2]), before)
swapping.swap_constant_buffer()
seen["swap_graphs_left"] = swapping.info()["graphs"]
after = swapping.run(inputs[2])
load_into(model._runner, doubled, inactive=True)
model._runner.swap_constant_buffer()
seen["swap_new_weights"] = same(after, list(model(*inputs[2]))) and not same(after, before)
seen["swap_captures"] = swapping.captures

class Settled(Fake):  # as the CUDA backend's TF32 flags: a capture bakes them in
    value = "tf32 on"
    def settings(self):
        return self.value
settled_backend = Settled()
settled = GraphRunner(direct, settled_backend, "model_tiny")
for value in ("tf32 on", "tf32 off", "tf32 on", "tf32 off"):
    settled_backend.value = value
    settled.run(inputs[1])
seen["settings_captures"] = settled.captures

refusing = GraphRunner(direct, Refusing(), "model_tiny 0.1")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    seen["fallback_outputs"] = [same(refusing.run(inputs[b]), expected[b]) for b in (1, 2, 1)]
seen["fallback_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
seen["fallback_info"] = refusing.info()
serving = t.load()  # as a CUDA wheel with copy_outputs=False is, the fake standing in for its graphs
serving._runner = GraphRunner(DirectRunner(serving.library, "cpu", None, lambda: None), Fake(), "model_tiny",
                              copy_outputs=False)
requests = [inputs[1], inputs[2], list(t.example_inputs(seed=5, batch=1))]
first = t.run_batch(serving, requests[:2], limit=2)  # two calls: batch 1, then batch 2
t.run_batch(serving, requests[2:], limit=2)  # the batch-1 graph again, on other inputs
seen["serving_info"] = {k: v for k, v in serving.info().items() if k != "static"}
seen["serving_owned"] = same(list(first[0]), expected[1]) and same(list(first[1]), expected[2])
from model_tiny import _target_cpu  # load()'s own wiring, as on a CUDA wheel: the target hands out the fake
own_graphs_off = _target_cpu.graphs_off
_target_cpu.stream, _target_cpu.graphs_off, _target_cpu.graph_backend = (
    lambda device: lambda: None), (lambda asked: None), (lambda device: Fake())
loaded = t.load(copy_outputs=False)
seen["load_outputs"] = [same(list(loaded(*inputs[b])), expected[b]) for b in (3, 1)]
seen["load_info"] = {k: v for k, v in loaded.info().items() if k != "static"}
seen["load_verify"] = all(result.passed for result in t.verify(loaded))
seen["load_copy_outputs"] = loaded.copy_outputs
# a static batch size (as [dims.batch] static = [2] gives): its graph is captured at load, then replayed
from model_tiny import _load
static = GraphRunner(DirectRunner(loaded.library, "cpu", None, lambda: None), Fake(), "model_tiny")
loaded._static = {2: (static, loaded.library)}
loaded._manifest = {**loaded._manifest, "static": {"dim": "batch", "pad": False, "sizes": {"2": {}}}}
_load._capture_static(loaded)
seen["static_at_load"] = static.info()["graphs"]
seen["static_call"] = same(list(loaded(*inputs[2])), expected[2]) and static.captures == 1
del _target_cpu.stream, _target_cpu.graph_backend
_target_cpu.graphs_off = own_graphs_off
try:
    t.load(cuda_graphs=True)
except ValueError as exc:
    seen["cpu_asked_for_graphs"] = str(exc)
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen(installed) -> dict:
    ran = subprocess.run(
        [str(installed), "-c", SCRIPT],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def test_the_single_threaded_entry_point_gives_the_runners_outputs(seen):
    assert seen["direct_equals_run"] == [True, True, True]
    assert seen["info"] == {"target": "cpu", "device": "cpu", "path": "AOTInductor runner", "graphs_off": "a CPU build"}


def test_one_graph_per_shape_and_at_most_max_graphs_least_recently_used_dropped(seen):
    assert seen["cache_outputs"] == [True, True, True, True]
    assert seen["cache_captures"] == 3  # batch 1, 2, then 3 (the second batch-1 call replays)
    assert seen["cache_held"] == [[[1, 3, 8, 8], [1]], [[3, 3, 8, 8], [3]]]  # batch 2 was used least recently


def test_a_graph_is_kept_per_shapes_and_the_settings_it_was_captured_under(seen):
    assert seen["settings_captures"] == 2  # verify() turns TF32 off: it never replays a TF32 graph


def test_outputs_are_the_callers_unless_copy_outputs_is_false(seen):
    assert seen["copied_kept"] is True
    assert seen["own_overwritten"] is True  # the graph's own tensors now hold the next call's outputs


def test_calls_from_several_threads_get_their_own_results(seen):
    assert seen["threads_wrong"] == []


def test_a_weight_swap_drops_the_graphs_that_read_the_old_weights(seen):
    assert seen["swap_inactive_untouched"] is True  # loading into the inactive buffer changes nothing yet
    assert seen["swap_graphs_left"] == []
    assert seen["swap_new_weights"] is True
    assert seen["swap_captures"] == 2


def test_a_failed_capture_warns_once_saying_why_and_runs_without_graphs(seen):
    assert seen["fallback_outputs"] == [True, True, True]
    assert seen["fallback_warnings"] == [
        "GraphCaptureWarning: model_tiny 0.1: capturing the model in a CUDA graph failed (RuntimeError: operation not "
        "permitted when stream is capturing); it runs without CUDA graphs from now on (load(cuda_graphs=False) skips "
        "the attempt)"
    ]
    assert seen["fallback_info"] == {
        "path": "single-threaded entry point, without CUDA graphs",
        "refused": "RuntimeError: operation not permitted when stream is capturing",
    }


def test_serving_gives_each_request_outputs_no_later_batch_overwrites(seen):
    assert seen["serving_info"] == {
        "target": "cpu",
        "device": "cpu",
        "path": "CUDA graphs",
        "max_graphs": 8,
        "copy_outputs": False,
        "graphs": [[[2, 3, 8, 8], [2]], [[1, 3, 8, 8], [1]]],
    }
    assert seen["serving_owned"] is True


def test_load_opens_the_single_threaded_entry_point_and_replays_graphs_where_the_target_has_them(seen):
    assert seen["load_info"] == {
        "target": "cpu",
        "device": "cpu",
        "path": "CUDA graphs",
        "max_graphs": 8,
        "copy_outputs": False,
        "graphs": [[[3, 3, 8, 8], [3]], [[1, 3, 8, 8], [1]]],
    }
    assert seen["load_outputs"] == [True, True] and seen["load_verify"] is True
    assert seen["load_copy_outputs"] is False
    assert seen["static_at_load"] == [[[2, 3, 8, 8], [2]]]  # a static size's graph, captured by load()
    assert seen["static_call"] is True  # a call of that size replays it


def test_a_cpu_wheel_refuses_cuda_graphs(seen):
    assert (
        seen["cpu_asked_for_graphs"] == "cuda_graphs=True: this wheel is a CPU build; CUDA graphs need its CUDA wheel"
    )


def test_graphs_are_on_by_default_for_cuda_and_off_by_argument_or_environment(monkeypatch):
    monkeypatch.delenv(wheel_cuda.GRAPHS_VARIABLE, raising=False)
    assert wheel_cuda.graphs_off(None) is None and wheel_cuda.graphs_off(True) is None
    assert wheel_cuda.graphs_off(False) == "load(cuda_graphs=False)"
    monkeypatch.setenv(wheel_cuda.GRAPHS_VARIABLE, "0")
    assert wheel_cuda.graphs_off(None) == "MODELWHEEL_CUDA_GRAPHS=0"
    assert wheel_cuda.graphs_off(True) is None  # the argument wins over the server's setting
