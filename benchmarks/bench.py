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

import layers_alone  # noqa: E402
import ort_profile  # noqa: E402
import sampling  # noqa: E402
from pipeline import precision  # noqa: E402
from pipeline import targets as build_targets  # noqa: E402
from pipeline.export import dynamic_shapes, export_program, prepare, spec_inputs  # noqa: E402
from pipeline.loader import load_model  # noqa: E402
from pipeline.spec import load_spec  # noqa: E402
from pipeline.templates import wheel_inputs  # noqa: E402

VARIANTS = ["eager", "compile", "pt2", "onnx", "wheel", "wheel-numpy"]
LABELS = {"eager": "eager PyTorch", "compile": "torch.compile", "pt2": ".pt2 (aoti_load_package)",
          "onnx": "ONNX Runtime", "wheel": "this wheel, load()", "wheel-numpy": "this wheel, load_numpy()"}
WHEEL_VARIANTS = {"wheel": "load()", "wheel-numpy": "load_numpy()"}
COLD_REPEATS = 5
ROUNDS = 3
# `import torch` alone, timed as the variants' fresh processes are (in the wheel's virtualenv)
COLD_VARIANTS = VARIANTS + ["import-torch"]
COLD_LABELS = {**LABELS, "import-torch": "`import torch` alone"}


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


def build_times(spec: Path, out: Path, root: str | None, target: str = "cpu") -> tuple[dict, Path]:
    args = [sys.executable, "-m", "pipeline", "build", "--spec", spec, "--build-dir", out / "build", "--dist", out / "dist",
            "--target", target]
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


def export_once(spec_file, target: str = "cpu"):
    """The model exported as the build exports it: every compile below starts from this."""
    loaded = load_model(spec_file)
    return export_program(prepare(spec_file, loaded, target), loaded.source_files)


def program_for(exported, compile_options: dict) -> tuple:
    """The exported program for these compile options (under autocast if they say so), and the
    Inductor options among them."""
    autocast, options = precision.split_options(compile_options)
    program = precision.export_autocast(exported, autocast) if autocast else exported.program
    options = {k: v for k, v in options.items() if not k.startswith("aot_inductor.package")}
    return program, {**options, **build_targets.get("cpu").graph_passes(options)}


def make_pt2(exported, manifest: dict, out: Path) -> Path:
    say("==> compiling the same model to a .pt2 (aoti_compile_and_package, the wheel's options)")
    program, options = program_for(exported, manifest["compile_options"])
    path = out / "model.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return path


def compile_so(exported, compile_options: dict, path: Path) -> Path:
    program, options = program_for(exported, compile_options)
    shutil.rmtree(path.parent, ignore_errors=True)
    path.parent.mkdir(parents=True)
    with torch.no_grad():
        torch._inductor.aot_compile(program.module(), exported.example_inputs,
                                    options={**options, "aot_inductor.output_path": str(path)})
    return path


def bf16_comparison(exported, spec: Path, manifest: dict, out: Path) -> dict | None:
    """What bfloat16 autocast would give this model (latency, difference from float32 eager), when
    the search did not ship it: the speed the spec's tolerances leave on the table."""
    if precision.AUTOCAST_OPTION in manifest["compile_options"] or not precision.bf16_is_native():
        return None
    say("==> compiling the model under bfloat16 autocast, for comparison (not what the wheel ships)")
    options = {**manifest["compile_options"], "freezing": True, precision.AUTOCAST_OPTION: precision.AUTOCAST_DTYPE}
    library = compile_so(exported, options, out / "bf16" / "model.so")
    timing = run_json([sys.executable, REPO / "benchmarks" / "variants.py", "so", "--spec", spec, "--mode", "latency",
                       "--batch", 1, "--artifact", library])
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
    spec_file, diffs = exported.spec_file, {}
    for seed in range(3):
        args = wheel_inputs.make_inputs(spec_inputs(spec_file), {n: 1 for n in spec_file.spec.dims}, seed)
        with torch.no_grad():
            want = exported.module(*args)
        for output, got, expected in zip(manifest["outputs"], runner.run(args), want if isinstance(want, (tuple, list)) else [want]):
            diffs[output["name"]] = max(diffs.get(output["name"], 0.0), float((got - expected).abs().max()))
    return {"median_ms": timing["median_ms"], "max_abs_diff": diffs,
            "tolerances": {o["name"]: {"rtol": o["rtol"], "atol": o["atol"]} for o in manifest["outputs"]}}


def make_onnx(exported, out: Path) -> Path:
    say("==> exporting to ONNX (torch.onnx.export, dynamo)")
    path = out / "model.onnx"
    torch.onnx.export(exported.module, exported.example_inputs, dynamo=True,
                      dynamic_shapes=dynamic_shapes(exported.spec_file)).save(str(path))
    return path


def variant_cmd(variant: str, spec: Path, artifacts: dict, venv_python: Path) -> list:
    python = venv_python if variant in WHEEL_VARIANTS or variant == "import-torch" else sys.executable
    cmd = [python, REPO / "benchmarks" / "variants.py", variant, "--spec", spec]
    return cmd + (["--artifact", artifacts[variant]] if variant in artifacts else [])


def measure(spec: Path, batches: list[int], artifacts: dict, venv_python: Path, rounds: int = ROUNDS) -> tuple[dict, dict]:
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
    return latency, {"median": {v: statistics.median(runs) for v, runs in starts.items()},
                     "spread": {v: [min(runs), max(runs)] for v, runs in starts.items()}}


def cold_start_s(variant_cmd: list) -> float:
    """From the parent's spawn to the child's own clock after its first result (or, for
    `import-torch`, after the import): the child's exit is not counted, for any variant."""
    return run_json(variant_cmd + ["--mode", "cold", "--batch", 1, "--start", time.time()])["first_result_s"]


def rotated(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


def summarize(runs: list[dict]) -> dict:
    """One figure per variant and batch from its rounds: the median of the per-process medians,
    their range as the spread; the first call is the first round's (torch.compile's then ran on
    an empty Inductor cache)."""
    medians = [r["median_ms"] for r in runs]
    return {"median_ms": statistics.median(medians), "p90_ms": statistics.median(r["p90_ms"] for r in runs),
            "spread_ms": [min(medians), max(medians)], "rounds": len(runs), "runs": sum(r["runs"] for r in runs),
            "first_call_s": runs[0]["first_call_s"]}


def import_torch_s(venv_python: Path) -> float:
    """`import torch` alone in a fresh process, timed as cold_start_s() times the variants."""
    return statistics.median(cold_start_s([venv_python, REPO / "benchmarks" / "variants.py", "import-torch"])
                             for _ in range(COLD_REPEATS))


def targets(results: dict) -> list[dict]:
    lat, cold = results["latency_ms"], results["cold_start_s"]
    wheel1 = lat["wheel"]["1"]["median_ms"]
    checks = [
        ("wheel latency <= 0.9x ONNX Runtime (batch 1)", wheel1 / lat["onnx"]["1"]["median_ms"], 0.9),
        ("wheel latency <= 0.75x eager (batch 1)", wheel1 / lat["eager"]["1"]["median_ms"], 0.75),
    ]
    for variant, loader in WHEEL_VARIANTS.items():
        baseline = results["import_torch_s"] + lat[variant]["1"]["median_ms"] / 1000
        checks += [
            (f"cold start, {loader}, <= 1.2x (import torch + one inference)", cold[variant] / baseline, 1.2),
            (f"cold start, {loader}, >= 2x faster than the .pt2 loader", cold[variant] / cold["pt2"], 0.5),
            (f"cold start, {loader}, >= 10x faster than torch.compile (warm cache)", cold[variant] / cold["compile"], 0.1),
        ]
    for batch in results["batches"]:
        numpy_ms, torch_ms = (lat[v][str(batch)]["median_ms"] for v in ("wheel-numpy", "wheel"))
        checks.append((f"load_numpy() within 1.05x of load() (batch {batch})", numpy_ms / torch_ms, 1.05))
    checks.append(("unchanged rebuild <= 5 s", results["build"]["cached_s"] / 5.0, 1.0))
    return judged(checks)


def judged(checks: list[tuple[str, float, float]]) -> list[dict]:
    """(name, measured ratio, limit) -> the results' "targets" records."""
    return [{"target": name, "ratio": round(ratio, 3), "limit": limit, "met": ratio <= limit} for name, ratio, limit in checks]


def latency_table(results: dict, variants: list[str], labels: dict[str, str], digits: int = 1) -> list[str]:
    """Median / p90 per batch size and the fresh-process time, one row per variant; where the run
    measured in rounds, [the range of the rounds' medians] after each figure."""
    batches, spreads = results["batches"], results.get("cold_start_spread_s", {})
    lines = ["| | " + " | ".join(f"batch {b} median / p90 (ms)" for b in batches) + " | fresh process to first result (s) |",
             "|---|" + "---|" * (len(batches) + 1)]
    for variant in variants:
        runs = results["latency_ms"][variant]
        cells = [f"{runs[str(b)]['median_ms']:.{digits}f} / {runs[str(b)]['p90_ms']:.{digits}f}"
                 + (" [{:.{d}f}–{:.{d}f}]".format(*runs[str(b)]["spread_ms"], d=digits) if "spread_ms" in runs[str(b)] else "")
                 for b in batches]
        start = f"{results['cold_start_s'][variant]:.2f}"
        start += " [{:.2f}–{:.2f}]".format(*spreads[variant]) if variant in spreads else ""
        lines.append(f"| {labels[variant]} | " + " | ".join(cells) + f" | {start} |")
    return lines


def targets_table(results: dict) -> list[str]:
    return ["| target | measured | limit | met |", "|---|---|---|---|"] + [
        f"| {t['target']} | {t['ratio']:.3f} | {t['limit']} | {'yes' if t['met'] else 'no'} |" for t in results["targets"]]


def markdown(results: dict) -> str:
    lines = [f"# {results['model']} on {results['machine']}", "",
             f"torch {results['torch']}, {results['cores']} cores; wheel compile options: {results['chosen']}", "",
             *latency_table(results, VARIANTS, LABELS)]
    build = results["build"]
    rounds = results["latency_ms"]["wheel"][str(results["batches"][0])].get("rounds", 1)
    lines += ["", f"Each latency is the median of {rounds} fresh processes (rounds in rotated order), each the median of "
              f"at least 10 calls and 2 s after 3 warm-ups; [the range of those {rounds} medians]. Fresh-process starts: "
              f"median [range] of {COLD_REPEATS}, interleaved with `import torch` alone, each timed from spawn to the "
              "child's clock after its first result (after the import), not counting its exit."]
    import_spread = results.get("cold_start_spread_s", {}).get("import-torch")
    spread = " [{:.2f}–{:.2f}]".format(*import_spread) if import_spread else ""
    lines += ["", f"`import torch` alone: {results['import_torch_s']:.2f} s{spread}. torch.compile first call (empty Inductor cache): "
              f"{results['latency_ms']['compile']['1']['first_call_s']:.1f} s.",
              f"Build (compile-option search, {results['candidates']} candidates): cold (no pipeline cache, empty Inductor "
              f"cache) {build['cold_s']:.1f} s, unchanged rebuild {build['cached_s']:.1f} s.", "",
              *targets_table(results)]
    lines += search_table(results["search"])
    if results.get("static_sizes"):
        lines += ["", "## Static batch sizes", ""] + static_sizes_table(results["static_sizes"])
    if results.get("profile"):
        lines += ["", "## What limits it", ""] + limits(results)
    return "\n".join(lines) + "\n"


def static_sizes_table(static: dict) -> list[str]:
    """Built without and with `static = [1, 2, 4, 8]` (options pinned), and the two timed side by side."""
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    dynamic, built = static["dynamic"], static["static"]
    lines = [f"The model built again with its options pinned ({', '.join(f'{k}={v}' for k, v in static['options'].items())}), "
             f"without and with `static = {static['sizes']}`:", "",
             "| | build (s, no cache) | wheel | largest files |", "|---|---|---|---|"]
    for label, entry in (("dynamic only", dynamic), (f"with static {static['sizes']}", built)):
        files = ", ".join(f"{name} {mb(size)}" for name, size in sorted(entry["files"].items(), key=lambda f: -f[1])[:3])
        lines.append(f"| {label} | {entry['build_s']:.1f} | {mb(entry['wheel_bytes'])} | {files} |")
    lines += ["", f"Wheel {static['wheel_ratio']:.2f}x, build {static['build_ratio']:.2f}x. Latency, the static model against "
              "the dynamic one, side by side in one process (median ms):", "",
              "| batch | dynamic | static | static / dynamic |", "|---|---|---|---|"]
    for batch, entry in static["latency"].items():
        ms = entry["median_ms"]
        lines.append(f"| {batch} | {ms['dynamic']:.1f} | {ms['static']:.1f} | {entry['static_over_dynamic']:.2f} |")
    return lines


def limits(results: dict) -> list[str]:
    """The compiled model's own profile: time per kernel group, and FLOP rates against the peak."""
    prof = results["profile"]
    peak, wheel1 = prof["matmul_peak_gflops"], results["latency_ms"]["wheel"]["1"]["median_ms"]
    floor_ms = prof["gflop"] / peak * 1000
    lines = [f"Batch 1 is {prof['gflop']:.2f} GFLOP; torch's large fp32 matmul runs at {peak:.0f} GFLOP/s here, a rate "
             f"at which the model would take {floor_ms:.1f} ms: the wheel's {wheel1:.1f} ms is {floor_ms / wheel1:.0%} of it. "
             "That rate is a yardstick, not a ceiling: a well-blocked convolution runs above it. "
             f"`import torch` alone takes {results['import_torch_s']:.2f} s; a fresh process gets its first result in "
             f"{results['cold_start_s']['wheel']:.2f} s through `load()`, which imports it, and in "
             f"{results['cold_start_s']['wheel-numpy']:.2f} s through `load_numpy()`, which does not.", "",
             f"The wheel's model compiled again with `cpp.enable_kernel_profile` (same options), batch 1, "
             f"{sum(prof['groups_ms'].values()):.1f} ms per call in profiled kernels:", "",
             "| kernel group | ms per call | share | GFLOP | GFLOP/s | of peak |", "|---|---|---|---|---|---|"]
    total = sum(prof["groups_ms"].values()) or 1
    for group, ms in sorted(prof["groups_ms"].items(), key=lambda item: -item[1]):
        gflop = prof["group_gflop"].get(group)
        rate = f"{gflop:.2f} | {gflop / ms * 1000:.0f} | {gflop / ms * 1000 / peak:.0%}" if gflop else " | | "
        lines.append(f"| {group} | {ms:.2f} | {ms / total:.0%} | {rate} |")
    if results.get("onnx_profile"):
        lines += [""] + versus_onnx(prof["groups_ms"], results["onnx_profile"])
    if results.get("layers_alone"):
        lines += [""] + layers_alone.table(results["layers_alone"], prof["groups_ms"], results["onnx_profile"]["groups_ms"])
    if results.get("sampling"):
        lines += ["", f"The installed wheel itself, sampled with `perf` while it ran batch 1 through `load()` ({wheel1:.1f} ms a "
                  "call in this run's latency table; start-up not sampled), by where the samples fell:", "",
                  "| where | share of samples |", "|---|---|"]
        lines += [f"| {group} | {share:.0%} |" for group, share in results["sampling"]["groups"].items()]
    lines += ["", "Heaviest kernels:", "", "| kernel | ms per call | calls |", "|---|---|---|"]
    lines += [f"| `{k['kernel']}` | {k['ms_per_call']:.2f} | {k['calls']} |" for k in prof["kernels"]]
    fixed = results.get("static_vs_dynamic")
    if fixed:
        sizes = ", ".join(f"{name}={size}" for name, size in fixed["sizes"].items())
        lines += ["", f"Dynamic dims cost time: compiled with `freezing` and {sizes} fixed, the model runs at "
                  f"{fixed['median_ms']['static']:.1f} ms against {fixed['median_ms']['dynamic']:.1f} ms with the spec's "
                  f"dynamic dims, timed side by side ({fixed['static_over_dynamic']:.2f}x). Both have their convolution "
                  "weights packed for oneDNN at compile time (Inductor packs them only for static shapes; the pipeline's "
                  "CPU graph pass packs the dynamic model's at the example size: pipeline/conv_prepack.py), so what is "
                  "left is code that cannot assume a size: generated kernels over symbolic sizes, oneDNN primitives "
                  "chosen at run time. A service that only ever runs one batch size can declare it fixed in the spec."]
    bf16 = results.get("bf16")
    if bf16:
        onnx1, eager1 = (results["latency_ms"][v]["1"]["median_ms"] for v in ("onnx", "eager"))
        diffs = ", ".join(f"{name} {diff:.2g} (rtol {bf16['tolerances'][name]['rtol']:g}, atol {bf16['tolerances'][name]['atol']:g})"
                          for name, diff in bf16["max_abs_diff"].items())
        lines += ["", f"Under bfloat16 autocast (with freezing) the same model runs at {bf16['median_ms']:.1f} ms at batch 1 "
                  f"({bf16['median_ms'] / onnx1:.2f}x ONNX Runtime, {bf16['median_ms'] / eager1:.2f}x eager), but differs from "
                  f"float32 eager by up to {diffs} on three seeded inputs: the search's reduced-precision candidate is only "
                  "compiled where the spec's tolerances allow it, and this spec's do not."]
    return lines


def versus_onnx(wheel_groups: dict, onnx: dict) -> list[str]:
    """Where the gap to ONNX Runtime lies: the same groups of operations, each under its own
    profiler at batch 1 (the wheel's kernel profile, ONNX Runtime's node times)."""
    wheel, named = {}, {group for group, _ in ort_profile.OP_GROUPS}
    for group, ms in wheel_groups.items():
        key = group if group in named else ort_profile.OTHER
        wheel[key] = wheel.get(key, 0.0) + ms
    groups = sorted(set(wheel) | set(onnx["groups_ms"]), key=lambda g: -wheel.get(g, 0.0))
    lines = ["The same operations in ONNX Runtime, under its own profiler at batch 1 "
             f"({onnx['run_ms']:.1f} ms a run while profiled; heaviest op types: "
             + ", ".join(f"{op} {ms:.2f}" for op, ms in list(onnx["ops_ms"].items())[:5]) + " ms):", "",
             "| operations | wheel ms | ONNX Runtime ms | wheel − ONNX Runtime |", "|---|---|---|---|"]
    for group in groups:
        mine, theirs = wheel.get(group, 0.0), onnx["groups_ms"].get(group, 0.0)
        lines.append(f"| {group} | {mine:.2f} | {theirs:.2f} | {mine - theirs:+.2f} |")
    total_wheel, total_onnx = sum(wheel.values()), sum(onnx["groups_ms"].values())
    lines.append(f"| all | {total_wheel:.2f} | {total_onnx:.2f} | {total_wheel - total_onnx:+.2f} |")
    return lines


def search_table(search: dict) -> list[str]:
    lines = ["", "Compile-option search (the build report's `compile_search`, median ms at the example size):", "",
             "| candidate | ms | |", "|---|---|---|"]
    for trial in search["candidates"]:
        timing = f"{trial['median_ms']:.1f}" if trial["median_ms"] is not None else "-"
        note = "chosen" if trial["name"] == search["chosen"] else ("" if trial["passed"] else f"dropped: {trial['problem']}")
        lines.append(f"| {trial['name']} | {timing} | {note} |")
    lines += [f"| {skip['name']} | - | not tried: {skip['reason']} |" for skip in search.get("not_tried", [])]
    return lines


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = results["batches"]
    fig, axes = plt.subplots(1, len(batches) + 1, figsize=(5 * (len(batches) + 1), 4))
    names = [LABELS[v] for v in VARIANTS]
    colors = ["#999999", "#6a9fd4", "#d4a56a", "#8fbf6a", "#c0392b", "#7d3c98"]
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
    exported = export_once(spec_file)
    artifacts = {"pt2": make_pt2(exported, manifest, out), "onnx": make_onnx(exported, out),
                 "wheel": f"model_{name}", "wheel-numpy": f"model_{name}"}
    batches = sorted({1, spec_file.spec.dims["batch"].max}) if "batch" in spec_file.spec.dims else [1]
    latency, cold = measure(spec, batches, artifacts, venv_python)
    results = {
        "model": f"{manifest['dist_name']} {manifest['full_version']}", "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__, "cores": torch.get_num_threads(), "chosen": manifest["compile_search"]["chosen"],
        "candidates": len(manifest["compile_search"]["candidates"]),
        "batches": batches, "latency_ms": {v: {str(b): r for b, r in d.items()} for v, d in latency.items()},
        "cold_start_s": {v: cold["median"][v] for v in VARIANTS}, "cold_start_spread_s": cold["spread"],
        "import_torch_s": cold["median"]["import-torch"], "build": build,
        "search": json.loads(next((out / "dist").glob("*.report.json")).read_text())["compile_search"],
    }
    results["targets"] = targets(results)
    if not all(t["met"] for t in results["targets"]):
        say("==> profiling the compiled kernels (a target was not met)")
        say("==> compiling the wheel's model again with kernel profiling on (cpp.enable_kernel_profile)")
        profiled = compile_so(exported, {**manifest["compile_options"], "cpp.enable_kernel_profile": True},
                              out / "profile" / "model.so")
        results["profile"] = run_json([sys.executable, REPO / "benchmarks" / "variants.py", "so", "--spec", spec,
                                       "--mode", "kernels", "--batch", 1, "--artifact", profiled])
        say("==> profiling ONNX Runtime at batch 1 (its own profiler), for the side-by-side")
        results["onnx_profile"] = run_json([sys.executable, REPO / "benchmarks" / "variants.py", "onnx", "--spec", spec,
                                            "--mode", "ort-profile", "--batch", 1, "--artifact", artifacts["onnx"]])
        say("==> timing the model's convolutions and linear layers one at a time, in both engines (benchmarks/layers_alone.py)")
        results["layers_alone"] = run_json([sys.executable, REPO / "benchmarks" / "layers_alone.py", "--spec", spec,
                                            "--library", profiled])
        if sampling.available():
            say("==> sampling the wheel's process with perf (batch 1, start-up not sampled)")
            cmd = variant_cmd("wheel", spec, artifacts, venv_python) + ["--mode", "latency", "--batch", 1, "--min-seconds", 8]
            results["sampling"] = sampling.profile(cmd, out, skip_s=results["cold_start_s"]["wheel"] + 1.0)
        results["bf16"] = bf16_comparison(exported, spec, manifest, out)
        if spec_file.spec.dims:
            say("==> compiling with every dim fixed at its minimum, for comparison (benchmarks/static_vs_dynamic.py)")
            results["static_vs_dynamic"] = run_json([sys.executable, REPO / "benchmarks" / "static_vs_dynamic.py", "--spec", spec])
    if "batch" in spec_file.spec.dims:
        say("==> building again with static batch sizes [1, 2, 4, 8] and without, options pinned (benchmarks/static_sizes.py)")
        results["static_sizes"] = run_json([sys.executable, REPO / "benchmarks" / "static_sizes.py", "--spec", spec,
                                            "--options", json.dumps(manifest["compile_options"])])
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    chart(results, out / "chart.png")
    print(markdown(results))
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'chart.png'}")


if __name__ == "__main__":
    main()
