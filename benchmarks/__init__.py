"""The product benchmarks (`make bench`, `make bench TARGET=cuda`, `make bench-memory`), run from the
repository root as modules: `python -m benchmarks [--target NAME] --spec ...` (__main__.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    """Progress on stderr: stdout carries the results table."""
    print(text, file=sys.stderr, flush=True)


def write_results(out: Path, results: dict[str, Any], markdown: Callable[[dict], str],
                  chart: Callable[[dict, Path], None]) -> None:
    """results.json, results.md and chart.png under ``out``; the table also on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    chart(results, out / "chart.png")
    print(markdown(results))
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'chart.png'}")
