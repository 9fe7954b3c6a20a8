"""Measuring in rounds: each round runs every variant once, in fresh processes, in an order
rotated from round to round (pipeline.features.rounds.rotated, as the option search does), and a variant's
rounds are summarised with their spread (bench.py)."""

from __future__ import annotations

import statistics


def summarize(runs: list[dict]) -> dict:
    """One figure per variant and batch from its rounds: the median of the per-process medians,
    their range as the spread; the first call is the first round's (torch.compile's then ran on
    an empty Inductor cache)."""
    medians = [r["median_ms"] for r in runs]
    return {
        "median_ms": statistics.median(medians),
        "p90_ms": statistics.median(r["p90_ms"] for r in runs),
        "spread_ms": [min(medians), max(medians)],
        "rounds": len(runs),
        "runs": sum(r["runs"] for r in runs),
        "first_call_s": runs[0]["first_call_s"],
        "page_faults_per_call": statistics.median(r["page_faults_per_call"] for r in runs),
    }
