"""What bounds the wheel's lead once requests are batched, for `make bench-serve`: each engine's
model call alone, no server, at batch 1 and at the built batch max, as the servers call it (the
wheel through load_numpy(), eager PyTorch's module), each in a fresh process, in rounds in
rotated order (benchmarks/variants.py, as `make bench` measures latency).

A batched server near the most it can serve runs full batches back to back, so it serves at most
batch max / call time, and the wheel's most over eager's is eager's call at the batch max over the
wheel's. Under a loose p99 bound each server runs near its most, so the ratio at equal p99 tends
to that one; under a tight bound it may exceed it (serve_slo's docstring says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks import say
from benchmarks.bench import run_json
from benchmarks.rounds import summarize
from pipeline.features.rounds import rotated

ROUNDS = 3
VARIANTS = {"wheel": "wheel-numpy", "eager": "eager"}  # benchmarks/variants.py's names, by engine


def batch_max(manifest: dict) -> int:
    """The built batch max: the largest size of the first input's first dim, the one the runtime's
    DynamicBatcher joins requests along."""
    first_axis = manifest["inputs"][0]["shape"][0]
    return int(manifest["dims"][first_axis]["max"]) if isinstance(first_axis, str) else int(first_axis)


def measure(spec: Path, site: Path, package: str, batches: list[int], rounds: int = ROUNDS) -> dict:
    """Each engine's call at each batch size once per round, each in a fresh process on every core
    (as a server calls one at a time): the median of each process's median, and their range."""
    per_round: dict[str, dict[int, list[dict]]] = {engine: {b: [] for b in batches} for engine in VARIANTS}
    for index in range(rounds):
        for engine in rotated(list(VARIANTS), index):
            for batch in batches:
                say(f"==> the model alone, round {index + 1}/{rounds}: {engine}, batch {batch}")
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks.variants",
                    VARIANTS[engine],
                    "--spec",
                    spec,
                    "--mode",
                    "latency",
                    "--batch",
                    batch,
                ]
                if engine == "wheel":  # the wheel as bench-serve installed it, as the app imports it
                    cmd += ["--artifact", package]
                per_round[engine][batch].append(
                    run_json(cmd, env={"PYTHONPATH": str(site)} if engine == "wheel" else None)
                )
    return {
        "batches": batches,
        "rounds": rounds,
        "calls": {
            engine: {str(b): summarize(runs) for b, runs in by_batch.items()} for engine, by_batch in per_round.items()
        },
    }


def most_ratio(limit: dict) -> float:
    """The wheel's most requests/s over eager's with full batches: eager's call over the wheel's."""
    largest = str(max(limit["batches"]))
    return float(limit["calls"]["eager"][largest]["median_ms"] / limit["calls"]["wheel"][largest]["median_ms"])


def markdown_lines(limit: dict, target: float) -> list[str]:
    calls = limit["calls"]
    lines = [
        "",
        f"What limits the wheel's lead with batching: each engine's model call alone, no server (a fresh "
        f"process each, median of {limit['rounds']} rounds [their range]):",
        "",
        "| batch | wheel ms per call | eager ms per call | eager / wheel |",
        "|---|---|---|---|",
    ]
    for batch in limit["batches"]:
        wheel, eager = calls["wheel"][str(batch)], calls["eager"][str(batch)]
        lines.append(
            f"| {batch} | {wheel['median_ms']:.1f} [{wheel['spread_ms'][0]:.1f}–{wheel['spread_ms'][1]:.1f}] | "
            f"{eager['median_ms']:.1f} [{eager['spread_ms'][0]:.1f}–{eager['spread_ms'][1]:.1f}] | "
            f"{eager['median_ms'] / wheel['median_ms']:.2f}x |"
        )
    most, largest = most_ratio(limit), max(limit["batches"])
    lines += [
        "",
        f"Near the most a batched server can serve, it runs full batches of {largest} back to back: there "
        f"the wheel serves at most {most:.2f}x eager's requests/s, "
        + ("below" if most < target else "at or above")
        + f" the {target}x target. Under a loose p99 bound "
        "each server runs near its most, so the ratio at equal p99 tends to this one; under a tight bound it "
        "may exceed it (benchmarks/serve_slo.py says why).",
    ]
    return lines
