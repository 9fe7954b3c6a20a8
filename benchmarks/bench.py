"""`make bench MODEL=unet`: the built wheel against eager, torch.compile, the .pt2 loader and
ONNX Runtime, measured side by side in one run. Writes results.json, results.md and chart.png
under build/bench/<model>/.

Every measurement runs in a fresh process (`python -m benchmarks.variants`, from the repository
root); the wheel runs from a fresh virtualenv it was pip-installed into, as a service would run it.

    python -m benchmarks.bench --spec models/unet/spec.toml      # what `make bench` runs
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
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import sampling, say, step, write_results
from benchmarks.artifacts import compile_so, export_once, make_onnx, make_pt2
from benchmarks.bench_report import LABELS, ONNX_TARGET, VARIANTS, chart, markdown
from benchmarks.rounds import summarize
from pipeline import targets as build_targets
from pipeline.features.rounds import rotated
from pipeline.spec import load_spec
from pipeline.stages import precision
from pipeline.stages.export import spec_inputs
from pipeline.wheel_template.runtime import _inputs as wheel_inputs

REPO = Path(__file__).resolve().parent.parent
# A variants process: `python -m` with the repository root as its working directory, so a fresh
# virtualenv's python (the wheel's) imports the benchmarks package from the checkout.
VARIANTS_MODULE = ["-m", "benchmarks.variants"]

WHEEL_VARIANTS = {"wheel": "load()", "wheel-numpy": "load_numpy()"}
COLD_REPEATS = 5
ROUNDS = 3
# `import torch` alone, timed as the variants' fresh processes are (in the wheel's virtualenv)
COLD_VARIANTS = VARIANTS + ["import-torch"]
COLD_LABELS = {**LABELS, "import-torch": "`import torch` alone"}


# A private Inductor cache, emptied at the start: "cold" build and first torch.compile call
# numbers then include Inductor's own compile work, not just a read of its on-disk cache.
INDUCTOR_ENV: dict[str, str] = {}


def run_json(cmd: Sequence[object], cwd: Path = REPO, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **INDUCTOR_ENV, **(env or {})},
    )
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(map(str, cmd))} failed:\n{done.stderr[-3000:]}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def timed(cmd: Sequence[object]) -> float:
    """A build's seconds; its own lines are shown as it prints them (the cold one takes minutes)."""
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in cmd], stdout=sys.stderr, cwd=REPO, env={**os.environ, **INDUCTOR_ENV})
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(map(str, cmd))} failed (exit {done.returncode}: its error is above)")
    return time.perf_counter() - started


def build_times(spec: Path, out: Path, root: str | None, target: str = build_targets.DEFAULT) -> tuple[dict, Path]:
    args = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--spec",
        spec,
        "--build-dir",
        out / "build",
        "--dist",
        out / "dist",
        "--target",
        target,
    ]
    args += ["--root", root] if root else []
    # The bench's own folders: an earlier bench's wheel of the same name (built on another CPU
    # kind, or before the checkout changed) has other contents, which the build refuses to
    # replace, and the wheel benchmarked is the only one in dist/.
    for folder in ("build", "dist"):
        shutil.rmtree(out / folder, ignore_errors=True)
    say("==> build, cold (--no-cache)")
    cold = timed(args + ["--no-cache"])
    say(f"    {cold:.1f}s\n==> build again, unchanged (cached)")
    # --overwrite: a checkout edited between the two builds misses the build cache (its key holds
    # pipeline/'s hash), and a search the noise stopped locks nothing, so the second searches again
    # and may ship another manifest: its wheel is benchmarked, not refused.
    cached = timed(args + ["--overwrite"])
    say(f"    {cached:.1f}s")
    return {"cold_s": cold, "cached_s": cached}, next((out / "dist").glob("*.whl"))


def wheel_venv(wheel: Path, out: Path) -> Path:
    say("==> installing the wheel into a fresh virtualenv")
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"torch=={torch.__version__}", wheel],
        check=True,
        capture_output=True,
    )
    return venv / "bin" / "python"


def so_latency(
    spec: Path, library: Path, min_seconds: float | None = None, target: str = build_targets.DEFAULT
) -> dict:
    """A bare .so's batch-1 latency, in a fresh process (`benchmarks.variants so`)."""
    more = ["--min-seconds", min_seconds] if min_seconds is not None else []
    return run_json(
        [
            sys.executable,
            *VARIANTS_MODULE,
            "so",
            "--spec",
            spec,
            "--mode",
            "latency",
            "--batch",
            1,
            "--artifact",
            library,
            "--target",
            target,
            *more,
        ]
    )


def bf16_comparison(exported, spec: Path, manifest: dict, out: Path) -> dict | None:
    """What bfloat16 autocast would give this model (latency, difference from float32 eager), when
    the search did not ship it: the speed the spec's tolerances leave on the table."""
    if precision.AUTOCAST_OPTION in manifest["compile_options"] or not exported.target.bf16_native():
        return None
    options = {**manifest["compile_options"], "freezing": True, precision.AUTOCAST_OPTION: precision.AUTOCAST_DTYPE}
    with step("bf16", "compiling the model under bfloat16 autocast, for comparison (not what the wheel ships)"):
        library = compile_so(exported, options, out / "bf16" / "model.so")
    timing = so_latency(spec, library, target=exported.target.NAME)
    runner = build_targets.open_runner(exported.target, library)
    spec_file, diffs = exported.spec_file, dict[str, float]()
    for seed in range(3):
        args = wheel_inputs.make_inputs(spec_inputs(spec_file), {n: 1 for n in spec_file.spec.dims}, seed)
        with torch.no_grad():
            want = exported.module(*args)
        for output, got, expected in zip(
            manifest["outputs"], runner.run(args), want if isinstance(want, (tuple, list)) else [want]
        ):
            diffs[output["name"]] = max(diffs.get(output["name"], 0.0), float((got - expected).abs().max()))
    return {
        "median_ms": timing["median_ms"],
        "max_abs_diff": diffs,
        "tolerances": {o["name"]: {"rtol": o["rtol"], "atol": o["atol"]} for o in manifest["outputs"]},
    }


def variant_cmd(variant: str, spec: Path, artifacts: dict, venv_python: Path) -> list:
    python = venv_python if variant in WHEEL_VARIANTS or variant == "import-torch" else sys.executable
    cmd = [python, *VARIANTS_MODULE, variant, "--spec", spec]
    return cmd + (["--artifact", artifacts[variant]] if variant in artifacts else [])


def measure(
    spec: Path, batches: list[int], artifacts: dict, venv_python: Path, rounds: int = ROUNDS
) -> tuple[dict, dict]:
    """Every variant and batch size once per round, each in a fresh process, the order rotated
    from round to round: a noisy neighbour or a warming machine shows as spread, not as one
    variant's figure. Fresh-process starts are interleaved the same way, `import torch` alone
    among them. Returns the latencies and {"median": ..., "spread": ...} of the starts."""
    per_round: dict = {v: {b: [] for b in batches} for v in VARIANTS}
    for index in range(rounds):
        for variant in rotated(VARIANTS, index):
            for batch in batches:
                say(f"==> latency, round {index + 1}/{rounds}: {LABELS[variant]}, batch {batch}")
                cmd = variant_cmd(variant, spec, artifacts, venv_python) + ["--mode", "latency", "--batch", batch]
                per_round[variant][batch].append(run_json(cmd))
    latency = {v: {b: summarize(runs) for b, runs in by_batch.items()} for v, by_batch in per_round.items()}
    starts: dict = {v: [] for v in COLD_VARIANTS}
    for index in range(COLD_REPEATS):
        for variant in rotated(COLD_VARIANTS, index):
            say(f"==> fresh process to first result, {index + 1}/{COLD_REPEATS}: {COLD_LABELS[variant]}")
            starts[variant].append(cold_start_s(variant_cmd(variant, spec, artifacts, venv_python)))
    return latency, {
        "median": {v: statistics.median(runs) for v, runs in starts.items()},
        "spread": {v: [min(runs), max(runs)] for v, runs in starts.items()},
    }


def cold_start_s(variant_cmd: list) -> float:
    """From the parent's spawn to the child's own clock after its first result (or, for
    `import-torch`, after the import): the child's exit is not counted, for any variant."""
    return float(run_json(variant_cmd + ["--mode", "cold", "--batch", 1, "--start", time.time()])["first_result_s"])


def import_torch_s(venv_python: Path) -> float:
    """`import torch` alone in a fresh process, timed as cold_start_s() times the variants."""
    return statistics.median(cold_start_s([venv_python, *VARIANTS_MODULE, "import-torch"]) for _ in range(COLD_REPEATS))


def targets(results: dict) -> list[dict]:
    lat, cold = results["latency_ms"], results["cold_start_s"]
    wheel1 = lat["wheel"]["1"]["median_ms"]
    checks = [
        (
            f"wheel latency <= {ONNX_TARGET}x ONNX Runtime (batch 1)",
            wheel1 / lat["onnx"]["1"]["median_ms"],
            ONNX_TARGET,
        ),
        ("wheel latency <= 0.75x eager (batch 1)", wheel1 / lat["eager"]["1"]["median_ms"], 0.75),
    ]
    for variant, loader in WHEEL_VARIANTS.items():
        baseline = results["import_torch_s"] + lat[variant]["1"]["median_ms"] / 1000
        checks += [
            (f"cold start, {loader}, <= 1.2x (import torch + one inference)", cold[variant] / baseline, 1.2),
            (f"cold start, {loader}, >= 2x faster than the .pt2 loader", cold[variant] / cold["pt2"], 0.5),
            (
                f"cold start, {loader}, >= 10x faster than torch.compile (warm cache)",
                cold[variant] / cold["compile"],
                0.1,
            ),
        ]
    for batch in results["batches"]:
        numpy_ms, torch_ms = (lat[v][str(batch)]["median_ms"] for v in ("wheel-numpy", "wheel"))
        # either way round: the two paths are to be equal, and a noisy load() must not pass as a fast load_numpy()
        checks.append(
            (
                f"load_numpy() and load() within 1.05x of each other (batch {batch})",
                max(numpy_ms / torch_ms, torch_ms / numpy_ms),
                1.05,
            )
        )
    checks.append(("unchanged rebuild <= 5 s", results["build"]["cached_s"] / 5.0, 1.0))
    return judged(checks)


def judged(checks: list[tuple[str, float, float]]) -> list[dict]:
    """(name, measured ratio, limit) -> the results' "targets" records."""
    return [
        {"target": name, "ratio": round(ratio, 3), "limit": limit, "met": ratio <= limit}
        for name, ratio, limit in checks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--root", default=None, help="artifact root for the build (default: the pipeline's)")
    parser.add_argument(
        "--target",
        choices=build_targets.names(),
        default=build_targets.DEFAULT,
        help="the target to build and measure on this machine (default: the registry's default)",
    )
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    spec_file = load_spec(spec)
    name = spec_file.spec.model.name
    out = REPO / "build" / "bench" / name
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "inductor-cache", ignore_errors=True)
    INDUCTOR_ENV["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
    build, wheel = build_times(spec, out, args.root, args.target)
    venv_python = wheel_venv(wheel, out)
    manifest = json.loads(
        subprocess.run(
            [venv_python, "-c", f"import json, model_{name} as m; print(json.dumps(m.manifest()))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    exported = export_once(spec_file, args.target)
    artifacts = {
        "pt2": make_pt2(exported, manifest, out),
        "onnx": make_onnx(exported, out),
        "wheel": f"model_{name}",
        "wheel-numpy": f"model_{name}",
    }
    batches = sorted({1, spec_file.spec.dims["batch"].max}) if "batch" in spec_file.spec.dims else [1]
    latency, cold = measure(spec, batches, artifacts, venv_python)
    results = {
        "model": f"{manifest['dist_name']} {manifest['full_version']}",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cores": torch.get_num_threads(),
        "chosen": manifest["compile_search"]["chosen"],
        "candidates": len(manifest["compile_search"]["candidates"]),
        "batches": batches,
        "latency_ms": {v: {str(b): r for b, r in d.items()} for v, d in latency.items()},
        "cold_start_s": {v: cold["median"][v] for v in VARIANTS},
        "cold_start_spread_s": cold["spread"],
        "import_torch_s": cold["median"]["import-torch"],
        "cold_repeats": COLD_REPEATS,
        "build": build,
        "search": json.loads(next((out / "dist").glob("*.report.json")).read_text())["compile_search"],
    }
    results["targets"] = targets(results)
    if not all(t["met"] for t in results["targets"]):
        say("==> profiling the compiled kernels (a target was not met)")
        with step("profile", "compiling the wheel's model again with kernel profiling on (cpp.enable_kernel_profile)"):
            profiled = compile_so(
                exported,
                {**manifest["compile_options"], "cpp.enable_kernel_profile": True},
                out / "profile" / "model.so",
            )
        results["profile"] = run_json(
            [
                sys.executable,
                *VARIANTS_MODULE,
                "so",
                "--spec",
                spec,
                "--mode",
                "kernels",
                "--batch",
                1,
                "--artifact",
                profiled,
                "--target",
                exported.target.NAME,
            ]
        )
        say("==> profiling ONNX Runtime at batch 1 (its own profiler), for the side-by-side")
        results["onnx_profile"] = run_json(
            [
                sys.executable,
                *VARIANTS_MODULE,
                "onnx",
                "--spec",
                spec,
                "--mode",
                "ort-profile",
                "--batch",
                1,
                "--artifact",
                artifacts["onnx"],
            ]
        )
        if sampling.available():
            say("==> sampling the wheel's process with perf (batch 1, start-up not sampled)")
            cmd = variant_cmd("wheel", spec, artifacts, venv_python) + [
                "--mode",
                "latency",
                "--batch",
                1,
                "--min-seconds",
                8,
            ]
            results["sampling"] = sampling.profile(cmd, out, skip_s=results["cold_start_s"]["wheel"] + 1.0, cwd=REPO)
        results["bf16"] = bf16_comparison(exported, spec, manifest, out)
    write_results(out, results, markdown, chart)


if __name__ == "__main__":
    main()
