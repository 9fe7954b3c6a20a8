"""Requests/s at equal p99, for `make bench-serve`: each setup (the app's two routes, one call
per request and dynamic batching, and one call per request with a call per core at once) under
requests that arrive at a set rate whatever the answers do
(docs/serving/client.py's ``paced_load``), the rate stepped up until its p99 passes the largest
bound.

A closed load (N requests in flight) lets a slower server slow its own clients down, so the two
servers' p99 differ and their requests/s cannot be compared at equal p99. At a set arrival rate
a server either keeps up or queues, and the highest rate at which its p99 stays within a bound
is what it serves at that p99 (MLPerf's server scenario measures the same way). Both servers
get the very same arrival times at each rate (one seed per rate).

Why several setups: under a tight bound a request may wait for little more than one call, so the
rate a server keeps within it grows faster than its speed per call. (A queue with random
arrivals and a fixed call time keeps p99 within 2x the call time only while 13% busy, within
4x while 46%, within 8x while 72%: a server 1.3x faster per call sits at a larger multiple of
its call time under the same bound.) Batching spreads a call's fixed cost over its requests,
for both engines alike, and trades that for the time a request waits to join a batch. A call per
core (the app's MODEL_SLOTS, one OpenMP thread a call) trades a slower call for calls side by
side, without the wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Arrival rates: times eager's closed-load requests/s in the same setup (its most in flight).
RATE_STEPS = (0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0, 1.1, 1.25, 1.4)
BOUNDS = (2, 4, 8)  # p99 bounds, times eager's p50 for one request alone (no load)


@dataclass(frozen=True)
class Setup:
    """A way to serve: one of docs/serving/app.py's routes, with ``slots`` calls at a time."""

    path: str
    slots: int  # MODEL_SLOTS; with more than 1, each call gets cores // slots OpenMP threads
    what: str

    @property
    def label(self) -> str:
        return f"`{self.path}`" + (f", {self.slots} slots" if self.slots > 1 else "")


def setups(cores: int) -> dict[str, Setup]:
    """What `make bench-serve` measures, by name: each route with one call at a time on every
    core, and one call per request with a call per core at once."""
    made = {
        "/predict": Setup("/predict", 1, "one call per request"),
        "/predict/batched": Setup("/predict/batched", 1, "dynamic batching"),
    }
    if cores > 1:
        made[f"/predict x{cores}"] = Setup("/predict", cores, f"one call per request, {cores} at once, 1 thread each")
    return made


def sweep(
    client: Any,
    urls: dict[str, str],
    name: str,
    setup: Setup,
    requests: list,
    base_rps: float,
    stop_p99_ms: float,
    say: Callable[[str], None],
) -> list[dict]:
    """One row per engine and rate on ``setup`` (``urls``: each engine's server set up so): the
    realized arrival rate, p50 and p99. An engine stops stepping up once its p99 passes
    ``stop_p99_ms`` (every bound is then passed)."""
    rows: list[dict] = []
    over: set[str] = set()
    for index, step in enumerate(RATE_STEPS):
        engines = list(urls) if index % 2 == 0 else list(urls)[::-1]  # rotated order
        for engine in (e for e in engines if e not in over):
            rate = base_rps * step
            say(f"==> {engine} {name}, requests arriving at {rate:.1f}/s")
            answers = asyncio.run(
                client.paced_load(urls[engine] + setup.path, requests, rate, seed=index, timeout_s=600)
            )
            failed = [a for a in answers if a.status != 200]
            if failed:
                raise SystemExit(
                    f"bench-serve: {len(failed)} paced requests to {engine} {name} failed: "
                    f"{failed[0].status} {failed[0].detail}"
                )
            latencies = np.array([a.latency_s for a in answers]) * 1000
            arrivals = client.arrival_times(len(requests), rate, seed=index)
            row = {
                "engine": engine,
                "setup": name,
                "step": step,
                "rps": len(requests) / arrivals[-1],
                "p50_ms": float(np.percentile(latencies, 50)),
                "p99_ms": float(np.percentile(latencies, 99)),
            }
            rows.append(row)
            say(f"    p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms")
            if row["p99_ms"] > stop_p99_ms:
                over.add(engine)
    return rows


def rate_within(rows: list[dict], engine: str, bound_ms: float) -> tuple[float, str]:
    """The highest arrival rate at which ``engine``'s p99 stays within ``bound_ms``, and how far
    that is known: ("", rate) between the last measured rate within it and the first past it,
    interpolated linearly on p99; (">=", the highest rate) when no rate passed it; ("<", the
    lowest rate) when even that one passed it."""
    mine = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["rps"])
    if mine[0]["p99_ms"] > bound_ms:
        return mine[0]["rps"], "<"
    for below, above in zip(mine, mine[1:]):
        if above["p99_ms"] > bound_ms:
            share = (bound_ms - below["p99_ms"]) / (above["p99_ms"] - below["p99_ms"])
            return below["rps"] + share * (above["rps"] - below["rps"]), ""
    return mine[-1]["rps"], ">="


RATIO_MARKS = {
    ("", ""): "",
    (">=", ""): ">=",
    ("", "<"): ">=",
    (">=", "<"): ">=",
    ("<", ""): "<",
    ("", ">="): "<",
    ("<", ">="): "<",
}  # (wheel's, eager's) -> the ratio's
MARK = {"": "", ">=": "≥ ", "<": "< "}  # as the table shows each


def with_ratio(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the wheel's rate over eager's and how far that is known (a lower bound where
    the wheel's rate is or eager's is above what was measured, and so on; None where both are
    open the same way)."""
    entry["ratio_mark"] = RATIO_MARKS.get((entry["wheel_mark"], entry["eager_mark"]))
    entry["ratio"] = None if entry["ratio_mark"] is None else entry["wheel"] / entry["eager"]
    return entry


def ratio_text(entry: dict) -> str:
    return "-" if entry["ratio"] is None else f"{MARK[entry['ratio_mark']]}{entry['ratio']:.2f}x"


def at_bounds(rows: list[dict], alone_p50_ms: float) -> list[dict]:
    """Per setup measured (in the order measured) and bound, each engine's rate within it and the
    wheel's over eager's, with how far each is known."""
    table = []
    for name in dict.fromkeys(row["setup"] for row in rows):
        mine = [row for row in rows if row["setup"] == name]
        for times in BOUNDS:
            bound = times * alone_p50_ms
            entry: dict[str, Any] = {"setup": name, "times": times, "bound_ms": bound}
            for engine in ("wheel", "eager"):
                entry[engine], entry[f"{engine}_mark"] = rate_within(mine, engine, bound)
            table.append(with_ratio(entry))
    return table


def best_setups(table: list[dict]) -> list[dict]:
    """Per bound, each engine on whichever setup serves it more within the bound (a service picks
    its own), and the wheel's rate over eager's. A rate known only to be below what was measured
    ("<") loses to any other."""
    best = []
    for times in BOUNDS:
        entries = [e for e in table if e["times"] == times]
        entry: dict[str, Any] = {"times": times, "bound_ms": entries[0]["bound_ms"]}
        for engine in ("wheel", "eager"):
            top = max(entries, key=lambda e: (e[f"{engine}_mark"] != "<", e[engine]))
            entry[engine], entry[f"{engine}_mark"], entry[f"{engine}_setup"] = (
                top[engine],
                top[f"{engine}_mark"],
                top["setup"],
            )
        best.append(with_ratio(entry))
    return best


def meets(entry: dict, target: float) -> bool:
    return entry["ratio"] is not None and entry["ratio_mark"] != "<" and entry["ratio"] >= target


def markdown_lines(results: dict, target: float) -> list[str]:
    slo = results["equal_p99"]
    label = {name: setup["label"] for name, setup in results["setups"].items()}
    lines = [
        "",
        f"Requests/s at equal p99 (requests arriving at random at a set rate, {results['paced_requests']} "
        f"per rate; bounds are multiples of eager's p50 for one request alone, {slo['alone_p50_ms']:.0f} ms):",
        "",
        "| setup | p99 bound | wheel req/s | eager req/s | wheel / eager |",
        "|---|---|---|---|---|",
    ]
    for e in slo["bounds"]:
        lines.append(
            f"| {label[e['setup']]} | {e['times']}x = {e['bound_ms']:.0f} ms | "
            f"{MARK[e['wheel_mark']]}{e['wheel']:.1f} | "
            f"{MARK[e['eager_mark']]}{e['eager']:.1f} | {ratio_text(e)} |"
        )
    met = [e for e in slo["bounds"] if meets(e, target)]
    best = best_setups(slo["bounds"])
    lines += [
        "",
        "(≥: the sweep's highest rate stayed within the bound; <: its lowest rate already passed it.)",
        "",
        "Each engine on its best setup at each bound:",
        "",
        "| p99 bound | wheel req/s (setup) | eager req/s (setup) | wheel / eager |",
        "|---|---|---|---|",
    ]
    for e in best:
        lines.append(
            f"| {e['times']}x = {e['bound_ms']:.0f} ms | "
            f"{MARK[e['wheel_mark']]}{e['wheel']:.1f} ({label[e['wheel_setup']]}) | "
            f"{MARK[e['eager_mark']]}{e['eager']:.1f} ({label[e['eager_setup']]}) | {ratio_text(e)} |"
        )
    lines += [
        "",
        f"Target ({target}x eager's requests/s at equal p99): met at {len(met)} of {len(slo['bounds'])} "
        "setup and bound pairs"
        + (" (" + ", ".join(f"{label[e['setup']]} at {e['times']}x" for e in met) + ")" if met else "")
        + f"; with each engine on its best setup, at {sum(meets(e, target) for e in best)} of {len(best)} bounds.",
    ]
    return lines
