"""`make bench MODEL=unet`: the built wheel against eager, torch.compile, the .pt2 loader and
ONNX Runtime, measured side by side in one run. Writes results.json, results.md and chart.png
under build/bench/<model>/.

Every measurement runs in a fresh process (benchmarks/variants.py); the wheel runs from a fresh
virtualenv it was pip-installed into, as a service would run it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.export import dynamic_shapes, export_program, prepare  # noqa: E402
from pipeline.export import example_inputs as spec_example_inputs  # noqa: E402
from pipeline.loader import load_model  # noqa: E402
from pipeline.spec import load_spec  # noqa: E402

VARIANTS = ["eager", "compile", "pt2", "onnx", "wheel"]
LABELS = {"eager": "eager PyTorch", "compile": "torch.compile", "pt2": ".pt2 (aoti_load_package)",
          "onnx": "ONNX Runtime", "wheel": "this wheel"}
COLD_REPEATS = 3


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# A private Inductor cache, emptied at the start: "cold" build and first torch.compile call
# numbers then include Inductor's own compile work, not just a read of its on-disk cache.
INDUCTOR_ENV: dict[str, str] = {}


def run_json(cmd: list[str], cwd: Path = REPO) -> dict:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env={**os.environ, **INDUCTOR_ENV})
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(map(str, cmd))} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=REPO, env={**os.environ, **INDUCTOR_ENV})
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(map(str, cmd))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def build_times(spec: Path, out: Path, root: str | None) -> tuple[dict, Path]:
    args = [sys.executable, "-m", "pipeline", "build", "--spec", spec, "--build-dir", out / "build", "--dist", out / "dist"]
    args += ["--root", root] if root else []
    shutil.rmtree(out / "build", ignore_errors=True)
    say("==> build, cold (--no-cache)")
    cold = timed(args + ["--no-cache"])
    say(f"    {cold:.1f}s\n==> build again, unchanged (cached)")
    cached = timed(args)
    say(f"    {cached:.1f}s")
    return {"cold_s": cold, "cached_s": cached}, next((out / "dist").glob("*.whl"))


def wheel_venv(wheel: Path, out: Path) -> Path:
    say("==> installing the wheel into a fresh virtualenv")
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}", wheel],
                   check=True, capture_output=True)
    return venv / "bin" / "python"


def make_pt2(spec_file, manifest: dict, out: Path) -> Path:
    say("==> compiling the same model to a .pt2 (aoti_compile_and_package, the wheel's options)")
    loaded = load_model(spec_file)
    program = export_program(prepare(spec_file, loaded), loaded.source_files).program
    options = {k: v for k, v in manifest["compile_options"].items() if not k.startswith("aot_inductor.package")}
    path = out / "model.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return path


def make_onnx(spec_file, out: Path) -> Path:
    say("==> exporting to ONNX (torch.onnx.export, dynamo)")
    loaded = load_model(spec_file)
    path = out / "model.onnx"
    torch.onnx.export(loaded.module, spec_example_inputs(spec_file), dynamo=True,
                      dynamic_shapes=dynamic_shapes(spec_file)).save(str(path))
    return path


def variant_cmd(variant: str, spec: Path, artifacts: dict, venv_python: Path) -> list:
    python = venv_python if variant == "wheel" else sys.executable
    cmd = [python, REPO / "benchmarks" / "variants.py", variant, "--spec", spec]
    return cmd + (["--artifact", artifacts[variant]] if variant in artifacts else [])


def measure(spec: Path, batches: list[int], artifacts: dict, venv_python: Path) -> tuple[dict, dict]:
    latency: dict = {v: {} for v in VARIANTS}
    cold: dict = {}
    for variant in VARIANTS:
        for batch in batches:
            say(f"==> latency: {LABELS[variant]}, batch {batch}")
            latency[variant][batch] = run_json(variant_cmd(variant, spec, artifacts, venv_python) + ["--mode", "latency", "--batch", batch])
    for variant in VARIANTS:
        say(f"==> fresh process to first result: {LABELS[variant]}")
        runs = [run_json(variant_cmd(variant, spec, artifacts, venv_python) + ["--mode", "cold", "--batch", 1, "--start", time.time()])
                ["first_result_s"] for _ in range(COLD_REPEATS)]
        cold[variant] = statistics.median(runs)
    return latency, cold


def import_torch_s(venv_python: Path) -> float:
    runs = []
    for _ in range(COLD_REPEATS):
        start = time.time()
        subprocess.run([venv_python, "-c", "import torch"], check=True, capture_output=True)
        runs.append(time.time() - start)
    return statistics.median(runs)


def targets(results: dict) -> list[dict]:
    lat, cold = results["latency_ms"], results["cold_start_s"]
    wheel1 = lat["wheel"]["1"]["median_ms"]
    baseline = results["import_torch_s"] + wheel1 / 1000
    checks = [
        ("wheel latency <= 0.9x ONNX Runtime (batch 1)", wheel1 / lat["onnx"]["1"]["median_ms"], 0.9),
        ("wheel latency <= 0.75x eager (batch 1)", wheel1 / lat["eager"]["1"]["median_ms"], 0.75),
        ("cold start <= 1.2x (import torch + one inference)", cold["wheel"] / baseline, 1.2),
        ("cold start >= 2x faster than the .pt2 loader", cold["wheel"] / cold["pt2"], 0.5),
        ("cold start >= 10x faster than torch.compile (warm cache)", cold["wheel"] / cold["compile"], 0.1),
        ("unchanged rebuild <= 5 s", results["build"]["cached_s"] / 5.0, 1.0),
    ]
    return [{"target": name, "ratio": round(ratio, 3), "limit": limit, "met": ratio <= limit} for name, ratio, limit in checks]


def markdown(results: dict) -> str:
    batches = results["batches"]
    lines = [f"# {results['model']} on {results['machine']}", "",
             f"torch {results['torch']}, {results['cores']} cores; wheel compile options: {results['chosen']}", "",
             "| | " + " | ".join(f"batch {b} median / p90 (ms)" for b in batches) + " | fresh process to first result (s) |",
             "|---|" + "---|" * (len(batches) + 1)]
    for variant in VARIANTS:
        cells = [f"{results['latency_ms'][variant][str(b)]['median_ms']:.1f} / {results['latency_ms'][variant][str(b)]['p90_ms']:.1f}"
                 for b in batches]
        lines.append(f"| {LABELS[variant]} | " + " | ".join(cells) + f" | {results['cold_start_s'][variant]:.2f} |")
    build = results["build"]
    lines += ["", f"`import torch` alone: {results['import_torch_s']:.2f} s. torch.compile first call (empty Inductor cache): "
              f"{results['latency_ms']['compile']['1']['first_call_s']:.1f} s.",
              f"Build (compile-option search, {results['candidates']} candidates): cold (no pipeline cache, empty Inductor "
              f"cache) {build['cold_s']:.1f} s, unchanged rebuild {build['cached_s']:.1f} s.", "",
              "| target | measured | limit | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['ratio']:.3f} | {t['limit']} | {'yes' if t['met'] else 'no'} |" for t in results["targets"]]
    if results.get("profile"):
        prof = results["profile"]
        floor_ms = prof["gflop"] / prof["matmul_peak_gflops"] * 1000
        wheel1 = results["latency_ms"]["wheel"]["1"]["median_ms"]
        lines += ["", "## What limits it", "",
                  f"Batch 1 is {prof['gflop']:.2f} GFLOP; a large fp32 matmul runs at {prof['matmul_peak_gflops']:.0f} GFLOP/s "
                  f"here, so the compute floor is about {floor_ms:.1f} ms: the wheel's {wheel1:.1f} ms is "
                  f"{floor_ms / wheel1:.0%} of that peak. Fresh-process start is bounded below by `import torch` "
                  f"({results['import_torch_s']:.2f} s of the wheel's {results['cold_start_s']['wheel']:.2f} s).", "",
                  "Time by operator in eager at batch 1 (torch.profiler, self time; the compiled `.so`'s kernels do not "
                  "pass through the dispatcher, so eager shows which computations dominate):", "",
                  "| op | ms per call | share |", "|---|---|---|"]
        lines += [f"| `{p['op']}` | {p['self_ms_per_call']:.2f} | {p['share']:.0%} |" for p in prof["ops"]]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = results["batches"]
    fig, axes = plt.subplots(1, len(batches) + 1, figsize=(5 * (len(batches) + 1), 4))
    names = [LABELS[v] for v in VARIANTS]
    colors = ["#999999", "#6a9fd4", "#d4a56a", "#8fbf6a", "#c0392b"]
    for axis, batch in zip(axes, batches):
        values = [results["latency_ms"][v][str(batch)]["median_ms"] for v in VARIANTS]
        axis.barh(names, values, color=colors)
        axis.set_title(f"latency, batch {batch} (ms, median)")
    axes[-1].barh(names, [results["cold_start_s"][v] for v in VARIANTS], color=colors)
    axes[-1].set_title("fresh process to first result (s)")
    fig.suptitle(f"{results['model']} — torch {results['torch']}, {results['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--root", default=None, help="artifact root for the build (default: the pipeline's)")
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    spec_file = load_spec(spec)
    name = spec_file.spec.model.name
    out = REPO / "build" / "bench" / name
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "inductor-cache", ignore_errors=True)
    INDUCTOR_ENV["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
    build, wheel = build_times(spec, out, args.root)
    venv_python = wheel_venv(wheel, out)
    manifest = json.loads(subprocess.run([venv_python, "-c", f"import json, model_{name} as m; print(json.dumps(m.manifest()))"],
                                         capture_output=True, text=True, check=True).stdout)
    artifacts = {"pt2": make_pt2(spec_file, manifest, out), "onnx": make_onnx(spec_file, out), "wheel": f"model_{name}"}
    batches = sorted({1, spec_file.spec.dims["batch"].max}) if "batch" in spec_file.spec.dims else [1]
    latency, cold = measure(spec, batches, artifacts, venv_python)
    results = {
        "model": f"{manifest['dist_name']} {manifest['full_version']}", "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__, "cores": torch.get_num_threads(), "chosen": manifest["compile_search"]["chosen"],
        "candidates": len(manifest["compile_search"]["candidates"]),
        "batches": batches, "latency_ms": {v: {str(b): r for b, r in d.items()} for v, d in latency.items()},
        "cold_start_s": cold, "import_torch_s": import_torch_s(venv_python), "build": build,
    }
    results["targets"] = targets(results)
    if not all(t["met"] for t in results["targets"]):
        say("==> profiling (a target was not met)")
        results["profile"] = run_json(variant_cmd("eager", spec, artifacts, venv_python) + ["--mode", "profile", "--batch", 1])
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    chart(results, out / "chart.png")
    print(markdown(results))
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'chart.png'}")


if __name__ == "__main__":
    main()
