"""The wheel with and without its heap setting (templates/wheel/runtime/_malloc.py), side by side.

load() and load_numpy() at batch 1, each in fresh processes, once with the runtime's setting (the
memory a call frees stays in the heap) and once with glibc's defaults (MODELWHEEL_MALLOC=default),
in rotated order over the rounds. What it shows: how much of a call went to faulting fresh pages
in, and the two loaders side by side under each setting. bench.py runs it.
"""

from __future__ import annotations

from typing import Callable

from rounds import rotated, summarize

ROUNDS = 3
LOADERS = {"wheel": "load()", "wheel-numpy": "load_numpy()"}
SETTINGS = {"kept": {}, "glibc": {"MODELWHEEL_MALLOC": "default"}}
SETTING_LABELS = {"kept": "heap kept (the runtime's setting)", "glibc": "glibc's defaults (`MODELWHEEL_MALLOC=default`)"}


def measure(run_json: Callable[..., dict], command: Callable[[str], list], rounds: int = ROUNDS) -> dict:
    """run_json(cmd, env=...) runs one latency measurement; command(variant) is its command line."""
    pairs = [(variant, setting) for setting in SETTINGS for variant in LOADERS]
    runs: dict = {pair: [] for pair in pairs}
    for index in range(rounds):
        for variant, setting in rotated(pairs, index):
            cmd = command(variant) + ["--mode", "latency", "--batch", 1]
            runs[variant, setting].append(run_json(cmd, env=SETTINGS[setting]))
    results: dict = {"rounds": rounds, **{variant: {} for variant in LOADERS}}
    for (variant, setting), measured in runs.items():
        results[variant][setting] = summarize(measured)
    return results


def table(results: dict) -> list[str]:
    lines = ["| batch 1 | " + " | ".join(SETTING_LABELS[s] for s in SETTINGS) + " |", "|---|" + "---|" * len(SETTINGS)]
    for variant, loader in LOADERS.items():
        cells = ["{:.1f} ms [{:.1f}–{:.1f}]; page faults a call: {:.0f}".format(
            results[variant][s]["median_ms"], *results[variant][s]["spread_ms"], results[variant][s]["page_faults_per_call"])
            for s in SETTINGS]
        lines.append(f"| {loader} | " + " | ".join(cells) + " |")
    ratio = {s: results["wheel-numpy"][s]["median_ms"] / results["wheel"][s]["median_ms"] for s in SETTINGS}
    gain = {v: results[v]["glibc"]["median_ms"] / results[v]["kept"]["median_ms"] for v in LOADERS}
    lines += ["", f"load_numpy() / load(): {ratio['kept']:.2f}x with the heap kept, {ratio['glibc']:.2f}x with glibc's "
              f"defaults. glibc's defaults against the runtime's setting: load() {gain['wheel']:.2f}x, load_numpy() "
              f"{gain['wheel-numpy']:.2f}x. Median [range] of {results['rounds']} fresh "
              "processes each, in rotated order."]
    return lines
