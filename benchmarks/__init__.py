"""The product benchmarks (`make bench`, `make bench TARGET=cuda`, `make bench-memory`), run from the
repository root as modules: `python -m benchmarks [--target NAME] --spec ...` (__main__.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    """Progress on stderr: stdout carries the results table."""
    print(text, file=sys.stderr, flush=True)


@contextmanager
def step(name: str, what: str) -> Iterator[None]:
    """A long step in this process (an Inductor compile takes minutes): ``==> name: what``, then
    a status line whenever nothing was printed for 10 s, as a build prints them, and its time."""
    from pipeline.services.live_progress import for_stream

    progress = for_stream(sys.stderr)
    try:
        with progress.stage(name, what):
            yield
    finally:
        progress.close()


def write_results(
    out: Path, results: dict[str, Any], markdown: Callable[[dict], str], chart: Callable[[dict, Path], None]
) -> None:
    """results.json, results.md and chart.png under ``out``; the table also on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    chart(results, out / "chart.png")
    print(markdown(results))
    say(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'chart.png'}")
