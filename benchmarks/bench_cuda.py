"""`make bench MODEL=unet TARGET=cuda`: the CUDA wheel against eager, torch.compile (default and
reduce-overhead) and the .pt2 loader on the current GPU, measured side by side in one run.
Writes results.json and results.md under build/bench/<model>-cuda/.

Every measurement runs in a fresh process (`python -m benchmarks.variants --device cuda`) and synchronizes
the GPU around every timed call. Runs with the interpreter's own CUDA torch and no network: the
wheel goes into a virtualenv that sees that torch (benchmarks/torch_venv.py).

    python -m benchmarks.bench_cuda --spec models/unet/spec.toml      # what `make bench TARGET=cuda` runs

`--wheel dist/model_unet-….whl --lease` fits a short loan of a GPU: it measures a wheel already
built (no cold and cached rebuilds), leaves out the .pt2 variant (another full compile), and
times fresh-process starts 3 times for eager and the wheel only (with and without CUDA graphs).
The wheel has two rows: load() as it runs by default, replaying CUDA graphs, and
load(cuda_graphs=False), torch's runner; the targets hold the first to eager and reduce-overhead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import torch_venv
from benchmarks.artifacts import export_once, make_pt2
from benchmarks.bench import (
    COLD_REPEATS,
    INDUCTOR_ENV,
    REPO,
    VARIANTS_MODULE,
    build_times,
    import_torch_s,
    judged,
    run_json,
    say,
)
from benchmarks.bench_report import latency_table, targets_table
from pipeline.spec import load_spec

VARIANTS = ["eager", "compile", "compile-ro", "pt2", "wheel", "wheel-graphs"]
LABELS = {
    "eager": "eager PyTorch",
    "compile": "torch.compile",
    "compile-ro": "torch.compile reduce-overhead",
    "pt2": ".pt2 (aoti_load_package)",
    "wheel": "the wheel, without CUDA graphs (load(cuda_graphs=False))",
    "wheel-graphs": "the wheel, CUDA graphs (load())",
}


def wheel_venv(wheel: Path, out: Path) -> Path:
    """The wheel installed beside the interpreter's CUDA torch: GPU images have no network to
    fetch another, and the wheel's torch pin is checked by pip against the one that is there."""
    say("==> installing the wheel into a virtualenv that sees this interpreter's torch")
    python = torch_venv.create(out / "venv")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheel], check=True, capture_output=True
    )
    # pip check, for the wheel alone: the image's own packages may disagree among themselves
    # (pypiserver wants a newer pip than the image's), which is not this wheel's concern.
    checked = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    problems = [
        line
        for line in checked.stdout.splitlines()
        if line.lower().startswith(wheel.name.split("-")[0].replace("_", "-"))
    ]
    if problems:
        raise SystemExit("bench: the wheel's requirements are not met here:\n" + "\n".join(problems))
    return python


def variant_cmd(variant: str, spec: Path, artifacts: dict, venv_python: Path, *mode: object) -> list:
    python = venv_python if variant.startswith("wheel") else sys.executable
    cmd = [python, *VARIANTS_MODULE, variant, "--spec", spec, "--device", "cuda", *mode]
    return cmd + (["--artifact", artifacts[variant]] if variant in artifacts else [])


def latency_order(variants: list[str], batch: int, batches: list[int], lease: bool) -> list[str]:
    """The rows a batch measures, in order. A short loan (--lease) measures every row at batch 1,
    and at a larger batch the two its target compares first, then the wheel without graphs and
    eager; torch.compile's default mode, no target's, is left out there (a first call of 36 s on
    an H200: a loan of 2026-11-28 ended in that batch's rows, with the target's unmeasured)."""
    if not lease or batch == batches[0]:
        return variants
    return ["compile-ro", "wheel-graphs", "wheel", "eager"]


def measure(
    spec: Path,
    batches: list[int],
    artifacts: dict,
    venv_python: Path,
    lease: bool = False,
    measured: Callable[[dict], None] = lambda results: None,
) -> dict:
    """Latency first, then fresh starts, then the profiler's view; ``measured`` is handed the
    results once the first batch's rows are in and after each later row, so the table and the
    targets are on disk should a short loan end early."""
    variants = [v for v in VARIANTS if v != "pt2" or "pt2" in artifacts]  # --lease builds no .pt2
    results: dict = {"variants": variants, "latency_ms": {v: {} for v in variants}, "cold_start_s": {}, "gpu_busy": {}}
    for batch in batches:  # batch 1 first: two targets are there, should a short loan end early
        for variant in latency_order(variants, batch, batches, lease):
            say(f"==> latency: {LABELS[variant]}, batch {batch}")
            timed = run_json(variant_cmd(variant, spec, artifacts, venv_python, "--mode", "latency", "--batch", batch))
            results["latency_ms"][variant][str(batch)] = timed
            say(f"    median {timed['median_ms']:.2f} ms, first call {timed['first_call_s']:.1f} s")
            if batch != batches[0] or variant == variants[-1]:
                measured(results)  # from the first batch's last row on, each row reaches the table at once
    # A torch.compile variant's fresh start is its first call, compile included (measured above).
    for variant in ["eager", "wheel", "wheel-graphs"] if lease else variants:
        say(f"==> fresh process to first result: {LABELS[variant]}")
        runs = [
            run_json(
                variant_cmd(
                    variant, spec, artifacts, venv_python, "--mode", "cold", "--batch", 1, "--start", time.time()
                )
            )["first_result_s"]
            for _ in range(3 if lease else COLD_REPEATS)
        ]
        results["cold_start_s"][variant] = statistics.median(runs)
    for variant in ("wheel", "eager") if lease else ("wheel", "compile-ro", "eager"):
        say(f"==> GPU busy share at batch 1 (torch.profiler): {LABELS[variant]}")
        results["gpu_busy"][variant] = run_json(
            variant_cmd(variant, spec, artifacts, venv_python, "--mode", "gpu-busy", "--batch", 1)
        )
    return results


def check_targets(results: dict) -> list[dict]:
    """Issue 42's targets for the wheel with CUDA graphs, each a ratio of two rows of this run."""
    lat, largest = results["latency_ms"], str(results["batches"][-1])
    graphs = lat["wheel-graphs"]

    def ratio(batch: str, other: str) -> float:
        return float(graphs[batch]["median_ms"] / lat[other][batch]["median_ms"])

    checks = [
        ("the wheel with CUDA graphs >= 4x faster than eager (batch 1)", ratio("1", "eager"), 0.25),
        ("the wheel with CUDA graphs <= 0.8x torch.compile reduce-overhead (batch 1)", ratio("1", "compile-ro"), 0.8),
    ]
    if largest != "1" and all(largest in lat[row] for row in ("wheel-graphs", "compile-ro")):
        checks.append(
            (
                f"the wheel with CUDA graphs <= 0.95x torch.compile reduce-overhead (batch {largest})",
                ratio(largest, "compile-ro"),
                0.95,
            )
        )
    cold = results["cold_start_s"]
    if "pt2" in cold:  # a lease-sized run (--lease) has no .pt2 variant
        checks.append(
            ("cold start, load(), >= 2x faster than the .pt2 loader", cold["wheel-graphs"] / cold["pt2"], 0.5)
        )
    return judged(checks)


def not_measured(results: dict) -> str:
    """What a table written during the run (each latency as it comes) says of what is still to come."""
    lat, batches = results["latency_ms"], results["batches"]
    notes = []
    if any(str(b) not in lat[v] for v in results["variants"] for b in batches):
        notes.append(
            "— in a latency column: not measured (a short loan, --lease, leaves torch.compile's default mode out "
            "above batch 1; any other row there, the run ended before it)"
            + (
                f"; the target at batch {batches[-1]} waits for its two rows."
                if any(str(batches[-1]) not in lat[row] for row in ("wheel-graphs", "compile-ro"))
                else "."
            )
        )
    missing = [
        what for what, key in (("fresh starts", "cold_start_s"), ("GPU busy share", "gpu_busy")) if not results[key]
    ]
    said = " and ".join(missing)
    if said:
        notes.append(
            f"{said[0].upper()}{said[1:]}: not measured (this table is written as the latencies come in; "
            "the run ended before its last phases, or is still in them)."
        )
    return "\n\n".join(notes)


def markdown(results: dict) -> str:
    lines = [
        f"# {results['model']} on {results['gpu']}",
        "",
        f"torch {results['torch']} (CUDA {results['cuda']}); wheel compile options: {results['chosen']}",
        "",
        *latency_table(results, results["variants"], LABELS, digits=2),
    ]
    build = results["build"]
    built = (
        f"Build: cold {build['cold_s']:.1f} s, unchanged rebuild {build['cached_s']:.1f} s."
        if build
        else "The wheel was built before the run (--wheel); "
        "fresh starts of the torch.compile variants are their first calls."
    )
    lines += [
        "",
        f"`import torch` alone: {results['import_torch_s']:.2f} s. torch.compile first call (empty Inductor "
        f"cache): {results['latency_ms']['compile']['1']['first_call_s']:.1f} s, reduce-overhead "
        f"{results['latency_ms']['compile-ro']['1']['first_call_s']:.1f} s. {built}",
        "",
        *targets_table(results),
    ]
    if not_measured(results):
        lines += ["", not_measured(results)]
    if not results["gpu_busy"]:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "## What limits it",
        "",
        "GPU time in kernels against wall time per call at batch 1 (torch.profiler): a share well below 1 means the "
        "call waits on the CPU launching kernels one by one, which CUDA graphs (reduce-overhead) replay in one launch.",
        "",
        "| | wall ms | kernel ms | kernels per call | GPU busy |",
        "|---|---|---|---|---|",
    ]
    for variant, busy in results["gpu_busy"].items():
        lines.append(
            f"| {LABELS[variant]} | {busy['wall_ms']:.2f} | {busy['kernel_ms']:.2f} | {busy['kernels_per_call']:.0f} "
            f"| {busy['busy']:.0%} |"
        )
    lines += [
        "",
        "The wheel with CUDA graphs replays one graph per batch size through the .so's single-threaded entry "
        "point (docs/cuda.md); its kernels are not profiled above.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--root", default=None, help="artifact root for the build (default: the pipeline's)")
    parser.add_argument("--wheel", type=Path, help="measure this wheel, already built, instead of building one")
    parser.add_argument(
        "--lease",
        action="store_true",
        help="fit a short GPU loan: no .pt2 variant, fresh starts 3 times for eager and the wheel's two rows only",
    )
    args = parser.parse_args()
    if torch.version.cuda is None or not torch.cuda.is_available():
        raise SystemExit(
            f"bench: TARGET=cuda needs a CUDA torch and a GPU; torch {torch.__version__} here "
            f"(CUDA {torch.version.cuda}), GPU visible: {torch.cuda.is_available()}"
        )
    spec = Path(args.spec).resolve()
    spec_file = load_spec(spec)
    name = spec_file.spec.model.name
    out = REPO / "build" / "bench" / f"{name}-cuda"
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "inductor-cache", ignore_errors=True)
    INDUCTOR_ENV["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
    build, wheel = (None, args.wheel.resolve()) if args.wheel else build_times(spec, out, args.root, target="cuda")
    venv_python = wheel_venv(wheel, out)
    manifest = json.loads(
        subprocess.run(
            [venv_python, "-c", f"import json, model_{name} as m; print(json.dumps(m.manifest()))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    artifacts: dict[str, str | Path] = {"wheel": f"model_{name}", "wheel-graphs": f"model_{name}"}
    if not args.lease:
        artifacts["pt2"] = make_pt2(export_once(spec_file, "cuda"), manifest, out)
    batches = sorted({1, spec_file.spec.dims["batch"].max}) if "batch" in spec_file.spec.dims else [1]
    results = {
        "model": f"{manifest['dist_name']} {manifest['full_version']}",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "chosen": manifest["compile_search"]["chosen"],
        "batches": batches,
        "build": build,
        "import_torch_s": import_torch_s(venv_python),
    }

    def write(measured: dict) -> None:
        results.update(measured, targets=check_targets({**results, **measured}))
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (out / "results.md").write_text(markdown(results))

    def latencies_in(measured: dict) -> None:
        write(measured)
        say(f"==> the table and targets so far, written (a short loan may end before the rest): {out / 'results.md'}")
        print(*targets_table(results), sep="\n")

    write(measure(spec, batches, artifacts, venv_python, args.lease, latencies_in))
    print(markdown(results))
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}")


if __name__ == "__main__":
    main()
