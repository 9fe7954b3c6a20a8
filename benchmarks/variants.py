"""One measurement of one way to run a model, in a fresh process (benchmarks/bench.py runs this,
from the repository root, with whichever python the variant needs).

    python -m benchmarks.variants VARIANT --spec SPEC --mode latency --batch N [--artifact PATH]
    python -m benchmarks.variants VARIANT --spec SPEC --mode cold --start EPOCH [--artifact PATH]

    python -m benchmarks.variants so --spec SPEC --mode kernels --batch N --artifact MODEL.so

VARIANT: eager | compile | compile-ro | pt2 | onnx | wheel | wheel-graphs | wheel-numpy | import-torch (compile-ro is
torch.compile's ``reduce-overhead`` mode, CUDA graphs on a GPU). ``--device cuda`` runs the torch
variants on the current GPU, synchronizing around every timed call. `wheel` and `wheel-numpy` run in
the virtualenv the wheel is installed in (their --artifact is the import name): `wheel` uses
load() and torch tensors (on a GPU without CUDA graphs, `wheel-graphs` with them), `wheel-numpy`
load_numpy() and numpy arrays, never importing torch;
`onnx` in cold mode imports only onnxruntime and numpy; `import-torch` (cold mode only) imports
torch and nothing else. `so` with `--mode kernels` profiles a
.so compiled with cpp.enable_kernel_profile; `onnx` with `--mode ort-profile` runs ONNX Runtime's
profiler (ort_profile.py). Prints one JSON object. The wheel's variants import nothing of the
repository but this package (their virtualenv has only torch and the wheel).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

MIN_RUNS, MIN_SECONDS, WARMUP = 10, 2.0, 3


# torch's device the variant runs on (--device: the target's TORCH_DEVICE, as the bench asked the
# registry), and the target a bare .so is opened for (--target; the wheel's variants need none:
# they run where the checkout's packages are not installed, with the wheel's own load()).
DEVICE = "cpu"
TARGET: str | None = None


def synchronize() -> None:
    if torch_device().type != "cpu":  # queued kernels of an accelerator: wait for them
        import torch

        torch.accelerator.synchronize()


def torch_device():
    import torch

    return torch.device(DEVICE)


def spec_inputs(spec_path: str, batch: int | None):
    from pipeline.spec import load_spec
    from pipeline.stages.export import export_sizes
    from pipeline.stages.export import spec_inputs as inputs_of
    from pipeline.wheel_template.runtime import _inputs as wheel_inputs

    spec_file = load_spec(spec_path)
    sizes = export_sizes(spec_file)
    if batch is not None:
        sizes = {name: batch for name in sizes}
    tensors = wheel_inputs.make_inputs(inputs_of(spec_file), sizes, seed=0)
    return spec_file, [t.to(DEVICE) for t in tensors]


def open_so(path: Path) -> Any:
    """A bare .so with torch's runner for the target, after what the wheel's load() does first
    (libstdc++ made global; on a CPU, freed buffers kept in the heap): pipeline/targets/."""
    from pipeline import targets

    return targets.open_runner(targets.get(TARGET or targets.DEFAULT), path)


def eager_module(spec_file):
    from pipeline.stages.loader import load_model

    return load_model(spec_file).module.to(DEVICE)


def numpy_inputs(inputs: list[dict], sizes: dict[str, int]) -> list:
    """Arrays of the declared shapes and dtypes, made without torch."""
    import numpy as np

    rng, arrays = np.random.default_rng(0), []
    for spec in inputs:
        shape = [sizes[axis] if isinstance(axis, str) else axis for axis in spec["shape"]]
        values: Any
        if spec.get("low") is None:  # a float input without a range (an integer one always has one)
            values = rng.standard_normal(shape)
        elif spec["dtype"].startswith("float"):
            values = rng.uniform(float(spec["low"]), float(spec["high"]), shape)
        else:
            values = rng.integers(int(spec["low"]), int(spec["high"]), shape)
        arrays.append(values.astype(spec["dtype"]))
    return arrays


def needed(artifact: str | None, variant: str) -> str:
    if artifact is None:
        raise SystemExit(f"variants: {variant} needs --artifact")
    return artifact


def make_runner(variant: str, spec_path: str, batch: int | None, artifact: str | None):
    """A callable taking no arguments that runs the variant once at this batch size."""
    if variant == "import-torch":  # the floor every torch-importing variant's fresh start stands on
        import torch  # noqa: F401

        return lambda: None
    if variant == "wheel-numpy":
        import importlib

        package = importlib.import_module(needed(artifact, variant))
        m = package.manifest()
        model = package.load_numpy()
        args = numpy_inputs(m["inputs"], {name: batch or dim["example"] for name, dim in m["dims"].items()})
        return lambda: model(*args)
    if variant in ("wheel", "wheel-graphs"):
        import importlib

        import torch

        package = importlib.import_module(needed(artifact, variant))
        m = package.manifest()
        # the very arrays wheel-numpy gets, as tensors sharing their memory: the A/B differs only in the loader
        arrays = numpy_inputs(m["inputs"], {name: batch or dim["example"] for name, dim in m["dims"].items()})
        # on a GPU, "wheel" is torch's runner and "wheel-graphs" load()'s default, CUDA graphs
        model = package.load(cuda_graphs=True) if variant == "wheel-graphs" else package.load(cuda_graphs=False)
        args = [torch.from_numpy(a).to(DEVICE) for a in arrays]  # on the cpu: no copy
        if variant == "wheel-graphs":
            return graphs_checked(model, args)
        return lambda: model(*args)
    if variant == "onnx":
        import numpy as np

        from benchmarks import ort_profile

        session = ort_profile.session(needed(artifact, variant))
        if spec_path and batch is not None:
            _, tensors = spec_inputs(spec_path, batch)
            feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
        else:  # cold start: no torch in this process, inputs of the right shape from numpy
            feeds = {
                i.name: np.random.default_rng(0)
                .standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
                .astype(np.float32)
                for i in session.get_inputs()
            }
        return lambda: session.run(None, feeds)
    import torch

    spec_file, args = spec_inputs(spec_path, batch)
    if variant == "so":  # a bare .so, opened as the wheel's load() opens it
        runner = open_so(Path(needed(artifact, variant)))
        return lambda: runner.run(list(args))
    if variant == "pt2":
        model = torch._inductor.aoti_load_package(needed(artifact, variant))
    else:
        model = eager_module(spec_file)
        if variant == "compile":
            model = torch.compile(model)
        elif variant == "compile-ro":
            model = torch.compile(model, mode="reduce-overhead")

    def call():
        with torch.no_grad():
            return model(*args)

    return call


def graphs_checked(model, args: list):
    """Calls of ``model`` whose first (the first call's time: warm-ups and the capture of this
    batch's graph) checks that it replays CUDA graphs: a row that says graphs must have run them."""
    checked = False

    def call():
        nonlocal checked
        outputs = model(*args)
        if not checked:
            if model.info()["path"] != "CUDA graphs":
                raise SystemExit(f"wheel-graphs: the wheel runs without CUDA graphs: {model.info()}")
            checked = True
        return outputs

    return call


def latency(call, min_seconds: float = MIN_SECONDS) -> dict:
    synchronize()
    first_started = time.perf_counter()
    call()
    synchronize()
    first_s = time.perf_counter() - first_started
    for _ in range(WARMUP - 1):
        call()
    synchronize()
    times: list[float] = []
    started, faults_before = time.perf_counter(), page_faults()
    while len(times) < MIN_RUNS or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        call()
        synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    faults = page_faults() - faults_before
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p90_ms": times[int(0.9 * (len(times) - 1))],
        "runs": len(times),
        "first_call_s": first_s,
        "page_faults_per_call": faults / len(times),
    }


def page_faults() -> int:
    """The process's minor page faults so far: a call that maps fresh memory for its buffers pays
    one per 4 KiB page (the kernel zeroes each), a call that reuses freed memory none."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def kernel_profile(so_path: str, spec_path: str, batch: int, top: int = 12) -> dict:
    """Where the compiled model's time goes: a .so built with cpp.enable_kernel_profile records
    each generated kernel and each library call (convolution, linear, attention) it makes."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    spec_file, args = spec_inputs(spec_path, batch)
    runner = open_so(Path(so_path))
    for _ in range(3):
        runner.run(list(args))
    calls = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            runner.run(list(args))
    events = [e for e in prof.key_averages() if not e.key.startswith("aten::")]
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    groups: dict[str, float] = {}
    for event in rows:
        groups[kernel_group(event.key)] = (
            groups.get(kernel_group(event.key), 0.0) + event.self_cpu_time_total / calls / 1000
        )
    with FlopCounterMode(display=False) as counter:
        with torch.no_grad():
            eager_module(spec_file)(*args)
    flops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return {
        "groups_ms": groups,
        "group_gflop": {
            "convolution": flops.get("aten.convolution", 0) / 1e9,
            "linear / matmul": (flops.get("aten.addmm", 0) + flops.get("aten.mm", 0) + flops.get("aten.bmm", 0)) / 1e9,
        },
        "kernels": [
            {"kernel": e.key, "ms_per_call": e.self_cpu_time_total / calls / 1000, "calls": e.count // calls}
            for e in rows[:top]
        ],
        "gflop": counter.get_total_flops() / 1e9,
        "matmul_peak_gflops": matmul_peak(),
    }


def gpu_busy(call, calls: int = 20) -> dict:
    """How much of a call's wall time the GPU spends in kernels: well below 1, the time goes to
    launching them from the CPU (what CUDA graphs remove)."""
    import torch

    for _ in range(WARMUP):
        call()
    synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize()
        wall_ms = (time.perf_counter() - started) * 1000 / calls
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_ms = sum(e.time_range.elapsed_us() for e in events) / 1000 / calls
    return {
        "wall_ms": wall_ms,
        "kernel_ms": kernel_ms,
        "kernels_per_call": len(events) / calls,
        "busy": kernel_ms / wall_ms if wall_ms else 0.0,
    }


def kernel_group(name: str) -> str:
    if "convolution" in name:
        return "convolution"
    if any(part in name for part in ("linear", "_mm", "addmm", "bmm", "gemm")):
        return "linear / matmul"
    if "scaled_dot_product" in name:
        return "attention"
    if name.startswith("graph_"):
        return "generated C++ kernels"
    return "other library calls"


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
    """fp32 GFLOP/s of a large square matmul on this machine: a practical compute ceiling."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "variant",
        choices=[
            "eager",
            "compile",
            "compile-ro",
            "pt2",
            "onnx",
            "wheel",
            "wheel-graphs",
            "wheel-numpy",
            "so",
            "import-torch",
        ],
    )
    parser.add_argument("--spec", default="")
    parser.add_argument("--mode", choices=["latency", "cold", "kernels", "gpu-busy", "ort-profile"], required=True)
    parser.add_argument("--device", default="cpu", help="torch's device: the target's (cpu; cuda for the current GPU)")
    parser.add_argument(
        "--target", default=None, help="the target a bare .so (so) is opened for (default: the registry's default)"
    )
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--artifact", default=None)
    parser.add_argument("--start", type=float, default=None, help="time.time() when the parent started this process")
    parser.add_argument(
        "--min-seconds", type=float, default=MIN_SECONDS, help="latency mode: time calls for at least this long"
    )
    args = parser.parse_args()
    global DEVICE, TARGET
    DEVICE, TARGET = args.device, args.target
    if args.mode == "cold":
        call = make_runner(args.variant, args.spec if args.variant != "onnx" else "", args.batch, args.artifact)
        call()
        synchronize()
        print(json.dumps({"first_result_s": time.time() - args.start}))
        return
    if args.mode == "gpu-busy":
        print(json.dumps(gpu_busy(make_runner(args.variant, args.spec, args.batch, args.artifact))))
        return
    if args.mode == "kernels":
        print(json.dumps(kernel_profile(args.artifact, args.spec, args.batch)))
        return
    if args.mode == "ort-profile":  # ONNX Runtime's own profile, grouped as kernel_profile's
        from benchmarks import ort_profile

        _, tensors = spec_inputs(args.spec, args.batch)
        print(json.dumps(ort_profile.profile(args.artifact, [t.numpy() for t in tensors])))
        return
    print(json.dumps(latency(make_runner(args.variant, args.spec, args.batch, args.artifact), args.min_seconds)))


if __name__ == "__main__":
    main()
