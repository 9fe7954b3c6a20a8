"""Requests/s at equal p99, for `make bench-serve`: each server's dynamic-batching route under
requests that arrive at a set rate whatever the answers do (docs/serving/client.py's
``paced_load``), the rate stepped up until its p99 passes the largest bound.

A closed load (N requests in flight) lets a slower server slow its own clients down, so the two
servers' p99 differ and their requests/s cannot be compared at equal p99. At a set arrival rate
a server either keeps up or queues, and the highest rate at which its p99 stays within a bound
is what it serves at that p99 (MLPerf's server scenario measures the same way). Both servers
get the very same arrival times at each rate (one seed per rate).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import numpy as np

RATE_STEPS = (0.25, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5)  # times eager's closed-load requests/s
BOUNDS = (2, 4, 8)  # p99 bounds, times eager's p50 for one request alone (no load)
ROUTE = "/predict/batched"


def sweep(client: Any, urls: dict[str, str], requests: list, base_rps: float, stop_p99_ms: float,
          say: Callable[[str], None]) -> list[dict]:
    """One row per engine and rate: the realized arrival rate, p50 and p99. An engine stops
    stepping up once its p99 passes ``stop_p99_ms`` (every bound is then passed)."""
    rows: list[dict] = []
    over: set[str] = set()
    for index, step in enumerate(RATE_STEPS):
        engines = list(urls) if index % 2 == 0 else list(urls)[::-1]  # rotated order
        for engine in (e for e in engines if e not in over):
            rate = base_rps * step
            say(f"==> {engine} {ROUTE}, requests arriving at {rate:.1f}/s")
            answers = asyncio.run(client.paced_load(urls[engine] + ROUTE, requests, rate, seed=index, timeout_s=600))
            failed = [a for a in answers if a.status != 200]
            if failed:
                raise SystemExit(f"bench-serve: {len(failed)} paced requests to {engine} failed: {failed[0].status} {failed[0].detail}")
            latencies = np.array([a.latency_s for a in answers]) * 1000
            arrivals = client.arrival_times(len(requests), rate, seed=index)
            row = {"engine": engine, "step": step, "rps": len(requests) / arrivals[-1],
                   "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99))}
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


RATIO_MARKS = {("", ""): "", (">=", ""): ">=", ("", "<"): ">=", (">=", "<"): ">=",
               ("<", ""): "<", ("", ">="): "<", ("<", ">="): "<"}  # (wheel's, eager's) -> the ratio's
MARK = {"": "", ">=": "≥ ", "<": "< "}  # as the table shows each


def at_bounds(rows: list[dict], alone_p50_ms: float) -> list[dict]:
    """Per bound, each engine's rate within it and the wheel's over eager's, with how far each is
    known (a ratio is a lower bound where the wheel's rate is or eager's is above what was
    measured, and so on; None where both are open the same way)."""
    table = []
    for times in BOUNDS:
        bound = times * alone_p50_ms
        entry: dict[str, Any] = {"times": times, "bound_ms": bound}
        for engine in ("wheel", "eager"):
            entry[engine], entry[f"{engine}_mark"] = rate_within(rows, engine, bound)
        entry["ratio_mark"] = RATIO_MARKS.get((entry["wheel_mark"], entry["eager_mark"]))
        entry["ratio"] = None if entry["ratio_mark"] is None else entry["wheel"] / entry["eager"]
        table.append(entry)
    return table


def markdown_lines(results: dict, target: float) -> list[str]:
    slo = results["equal_p99"]
    lines = ["", f"Requests/s at equal p99 (`{ROUTE}`, requests arriving at random at a set rate, "
             f"{results['paced_requests']} per rate; bounds are multiples of eager's p50 for one request alone, "
             f"{slo['alone_p50_ms']:.0f} ms):", "",
             "| p99 bound | wheel req/s | eager req/s | wheel / eager |", "|---|---|---|---|"]
    for e in slo["bounds"]:
        ratio = "-" if e["ratio"] is None else f"{MARK[e['ratio_mark']]}{e['ratio']:.2f}x"
        lines.append(f"| {e['times']}x = {e['bound_ms']:.0f} ms | {MARK[e['wheel_mark']]}{e['wheel']:.1f} | "
                     f"{MARK[e['eager_mark']]}{e['eager']:.1f} | {ratio} |")
    met = [e for e in slo["bounds"] if e["ratio"] is not None and e["ratio_mark"] != "<" and e["ratio"] >= target]
    lines += ["", "(≥: the sweep's highest rate stayed within the bound; <: its lowest rate already passed it.)",
              f"Target ({target}x eager's requests/s at equal p99): met at {len(met)} of {len(slo['bounds'])} bounds."]
    return lines

