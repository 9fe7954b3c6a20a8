"""bench.py's report: the markdown of results.json (tables, targets, what limits the speed) and
the chart. Kept apart from the measuring so each reads on its own; bench_cuda.py shares the tables.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import ort_profile

# The wheel's batch-1 latency target, as a share of ONNX Runtime's.
ONNX_TARGET = 0.9
# The variants bench.py times, in the order the tables and the chart show them.
VARIANTS = ["eager", "compile", "pt2", "onnx", "wheel", "wheel-numpy"]
LABELS = {
    "eager": "eager PyTorch",
    "compile": "torch.compile",
    "pt2": ".pt2 (aoti_load_package)",
    "onnx": "ONNX Runtime",
    "wheel": "this wheel, load()",
    "wheel-numpy": "this wheel, load_numpy()",
}


def latency_table(results: dict, variants: list[str], labels: dict[str, str], digits: int = 1) -> list[str]:
    """Median / p90 per batch size and the fresh-process time, one row per variant; where the run
    measured in rounds, [the range of the rounds' medians] after each figure."""
    batches, spreads = results["batches"], results.get("cold_start_spread_s", {})
    lines = [
        "| | " + " | ".join(f"batch {b} median / p90 (ms)" for b in batches) + " | fresh process to first result (s) |",
        "|---|" + "---|" * (len(batches) + 1),
    ]
    for variant in variants:
        runs = results["latency_ms"][variant]
        cells = [
            (
                f"{runs[str(b)]['median_ms']:.{digits}f} / {runs[str(b)]['p90_ms']:.{digits}f}"
                + (
                    " [{:.{d}f}–{:.{d}f}]".format(*runs[str(b)]["spread_ms"], d=digits)
                    if "spread_ms" in runs[str(b)]
                    else ""
                )
            )
            if str(b) in runs
            else "—"  # not measured: a lease-sized CUDA run's torch.compile at its larger batch, or a cut-off run
            for b in batches
        ]
        cold = results["cold_start_s"].get(variant)  # a lease-sized CUDA run leaves torch.compile's out
        start = f"{cold:.2f}" if cold is not None else "—"
        start += " [{:.2f}–{:.2f}]".format(*spreads[variant]) if variant in spreads else ""
        lines.append(f"| {labels[variant]} | " + " | ".join(cells) + f" | {start} |")
    return lines


def targets_table(results: dict) -> list[str]:
    return ["| target | measured | limit | met |", "|---|---|---|---|"] + [
        f"| {t['target']} | {t['ratio']:.3f} | {t['limit']} | {'yes' if t['met'] else 'no'} |"
        for t in results["targets"]
    ]


def markdown(results: dict) -> str:
    lines = [
        f"# {results['model']} on {results['machine']}",
        "",
        f"torch {results['torch']}, {results['cores']} cores; wheel compile options: {results['chosen']}",
        "",
        *latency_table(results, VARIANTS, LABELS),
    ]
    build = results["build"]
    rounds = results["latency_ms"]["wheel"][str(results["batches"][0])].get("rounds", 1)
    lines += [
        "",
        f"Each latency is the median of {rounds} fresh processes (rounds in rotated order), each the median of "
        f"at least 10 calls and 2 s after 3 warm-ups; [the range of those {rounds} medians]. Fresh-process starts: "
        f"median [range] of {results['cold_repeats']}, interleaved with `import torch` alone, "
        f"each timed from spawn to the "
        "child's clock after its first result (after the import), not counting its exit.",
    ]
    import_spread = results.get("cold_start_spread_s", {}).get("import-torch")
    spread = " [{:.2f}–{:.2f}]".format(*import_spread) if import_spread else ""
    lines += [
        "",
        f"`import torch` alone: {results['import_torch_s']:.2f} s{spread}. "
        f"torch.compile first call (empty Inductor cache): "
        f"{results['latency_ms']['compile']['1']['first_call_s']:.1f} s.",
        f"Build (compile-option search, {results['candidates']} candidates): cold (no pipeline cache, empty Inductor "
        f"cache) {build['cold_s']:.1f} s, unchanged rebuild {build['cached_s']:.1f} s.",
        "",
        *targets_table(results),
    ]
    lines += search_table(results["search"])
    faults = ", ".join(f"{LABELS[v]} {results['latency_ms'][v]['1']['page_faults_per_call']:.0f}" for v in VARIANTS)
    lines += [
        "",
        f"Page faults per call at batch 1, each a fresh 4 KiB page a buffer was mapped into and the kernel "
        f"zeroed: {faults}. The runtime keeps the memory a call frees in the heap for the next call "
        "(templates/wheel/runtime/_malloc.py).",
    ]
    if results.get("profile"):
        lines += ["", "## What limits it", ""] + limits(results)
    return "\n".join(lines) + "\n"


def limits(results: dict) -> list[str]:
    """The compiled model's own profile: time per kernel group, and FLOP rates against the peak."""
    prof = results["profile"]
    peak, wheel1 = prof["matmul_peak_gflops"], results["latency_ms"]["wheel"]["1"]["median_ms"]
    floor_ms = prof["gflop"] / peak * 1000
    lines = [
        f"Batch 1 is {prof['gflop']:.2f} GFLOP; torch's large fp32 matmul runs at {peak:.0f} GFLOP/s here, a rate "
        f"at which the model would take {floor_ms:.1f} ms: "
        f"the wheel's {wheel1:.1f} ms is {floor_ms / wheel1:.0%} of it. "
        "That rate is a yardstick, not a ceiling: a well-blocked convolution runs above it. "
        f"`import torch` alone takes {results['import_torch_s']:.2f} s; a fresh process gets its first result in "
        f"{results['cold_start_s']['wheel']:.2f} s through `load()`, which imports it, and in "
        f"{results['cold_start_s']['wheel-numpy']:.2f} s through `load_numpy()`, which does not.",
        "",
        f"The wheel's model compiled again with `cpp.enable_kernel_profile` (same options), batch 1, "
        f"{sum(prof['groups_ms'].values()):.1f} ms per call in profiled kernels:",
        "",
        "| kernel group | ms per call | share | GFLOP | GFLOP/s | of peak |",
        "|---|---|---|---|---|---|",
    ]
    total = sum(prof["groups_ms"].values()) or 1
    for group, ms in sorted(prof["groups_ms"].items(), key=lambda item: -item[1]):
        gflop = prof["group_gflop"].get(group)
        rate = f"{gflop:.2f} | {gflop / ms * 1000:.0f} | {gflop / ms * 1000 / peak:.0%}" if gflop else " | | "
        lines.append(f"| {group} | {ms:.2f} | {ms / total:.0%} | {rate} |")
    if results.get("onnx_profile"):
        lines += [""] + versus_onnx(prof["groups_ms"], results["onnx_profile"])
    if results.get("sampling"):
        lines += [
            "",
            f"The installed wheel itself, sampled with `perf` while it ran batch 1 through `load()` ({wheel1:.1f} ms a "
            "call in this run's latency table; start-up not sampled), by where the samples fell:",
            "",
            "| where | share of samples |",
            "|---|---|",
        ]
        lines += [f"| {group} | {share:.0%} |" for group, share in results["sampling"]["groups"].items()]
    lines += ["", "Heaviest kernels:", "", "| kernel | ms per call | calls |", "|---|---|---|"]
    lines += [f"| `{k['kernel']}` | {k['ms_per_call']:.2f} | {k['calls']} |" for k in prof["kernels"]]
    bf16 = results.get("bf16")
    if bf16:
        onnx1, eager1 = (results["latency_ms"][v]["1"]["median_ms"] for v in ("onnx", "eager"))
        diffs = ", ".join(
            f"{name} {diff:.2g} (rtol {bf16['tolerances'][name]['rtol']:g}, atol {bf16['tolerances'][name]['atol']:g})"
            for name, diff in bf16["max_abs_diff"].items()
        )
        lines += [
            "",
            f"Under bfloat16 autocast (with freezing) the same model runs at {bf16['median_ms']:.1f} ms at batch 1 "
            f"({bf16['median_ms'] / onnx1:.2f}x ONNX Runtime, {bf16['median_ms'] / eager1:.2f}x eager), "
            f"but differs from "
            f"float32 eager by up to {diffs} on three seeded inputs: the search's reduced-precision candidate is only "
            "compiled where the spec's tolerances allow it, and this spec's do not.",
        ]
    return lines


def versus_onnx(wheel_groups: dict, onnx: dict) -> list[str]:
    """Where the gap to ONNX Runtime lies: the same groups of operations, each under its own
    profiler at batch 1 (the wheel's kernel profile, ONNX Runtime's node times)."""
    wheel, named = dict[str, float](), {group for group, _ in ort_profile.OP_GROUPS}
    for group, ms in wheel_groups.items():
        key = group if group in named else ort_profile.OTHER
        wheel[key] = wheel.get(key, 0.0) + ms
    groups = sorted(set(wheel) | set(onnx["groups_ms"]), key=lambda g: -wheel.get(g, 0.0))
    lines = [
        "The same operations in ONNX Runtime, under its own profiler at batch 1 "
        f"({onnx['run_ms']:.1f} ms a run while profiled; heaviest op types: "
        + ", ".join(f"{op} {ms:.2f}" for op, ms in list(onnx["ops_ms"].items())[:5])
        + " ms):",
        "",
        "| operations | wheel ms | ONNX Runtime ms | wheel − ONNX Runtime |",
        "|---|---|---|---|",
    ]
    for group in groups:
        mine, theirs = wheel.get(group, 0.0), onnx["groups_ms"].get(group, 0.0)
        lines.append(f"| {group} | {mine:.2f} | {theirs:.2f} | {mine - theirs:+.2f} |")
    total_wheel, total_onnx = sum(wheel.values()), sum(onnx["groups_ms"].values())
    lines.append(f"| all | {total_wheel:.2f} | {total_onnx:.2f} | {total_wheel - total_onnx:+.2f} |")
    return lines


def search_table(search: dict) -> list[str]:
    lines = [
        "",
        "Compile-option search (the build report's `compile_search`, median ms at the example size):",
        "",
        "| candidate | ms | |",
        "|---|---|---|",
    ]
    for trial in search["candidates"]:
        timing = f"{trial['median_ms']:.1f}" if trial["median_ms"] is not None else "-"
        note = (
            "chosen"
            if trial["name"] == search["chosen"]
            else ("" if trial["passed"] else f"dropped: {trial['problem']}")
        )
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
