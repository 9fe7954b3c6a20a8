"""What the compile-option search adds to a build (issue 44's target: a default build of a small
model takes at most 1.5x its build with `search = false`).

    .venv/bin/python -m benchmarks.search_cost --spec tests/models/tiny/spec.toml [--rounds 2]

Each round builds the spec twice from cold, in fresh processes: as a default spec does (`search =
true`) and with `search = false`, in an order rotated from round to round (a busy minute hits
both alike). Cold: a fresh build folder, root and dist, and an empty Inductor cache, so no compile
is reused. The table gives each variant's wall-clock build times, the median ratio, what the
search said it cost and won (its report's `compile_search.cost`), and the load average and cores
it ran on: on a shared machine the load decides much of it (the noise can stop the search)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import say
from pipeline.features.rounds import rotated

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.5
# name -> the [compile] keys it builds with; the last compiles the candidates even where the
# noise would stop the search: what the search costs when it runs (a quiet machine's case).
VARIANTS = {
    "default": "search = true",
    "search = false": "search = false",
    "search_when_noisy = true": "search = true\nsearch_when_noisy = true",
}


def spec_copy(spec: Path, folder: Path, keys: str) -> Path:
    """The spec and its folder's files in ``folder``, with ``keys`` for its [compile] search keys."""
    shutil.copytree(spec.parent, folder, ignore=shutil.ignore_patterns("*.lock.json", "__pycache__"))
    text = re.sub(r"(?m)^search(_when_noisy)?\s*=\s*\w+\n?", "", (folder / spec.name).read_text())
    text = (
        text.replace("[compile]\n", f"[compile]\n{keys}\n") if "[compile]" in text else text + f"\n[compile]\n{keys}\n"
    )
    (folder / spec.name).write_text(text)
    return folder / spec.name


def build_once(spec: Path, search: str, work: Path) -> dict:
    """One cold build in a fresh process: its wall-clock seconds and its report's stages and search."""
    folder = work / re.sub(r"\W+", "-", search)
    shutil.rmtree(folder, ignore_errors=True)
    copied = spec_copy(spec, folder / "spec", search)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--spec",
        str(copied),
        "--root",
        str(folder / "opt"),
        "--dist",
        str(folder / "dist"),
        "--build-dir",
        str(folder / "build"),
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"build failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(next((folder / "dist").glob("*.report.json")).read_text())
    search_line = next((line.strip() for line in done.stderr.splitlines() if line.startswith("  search    ")), "")
    return {
        "build_s": seconds,
        "load_before": load,
        "stages_s": report["stages_s"],
        "cost": report["compile_search"].get("cost"),
        "chosen": report["compile_search"]["chosen"],
        "summary": search_line,
    }


def markdown(results: dict) -> str:
    rows = [
        "| variant | build s (median) | each round | compile stage s | what the search said |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, runs in results["runs"].items():
        times = [r["build_s"] for r in runs]
        compiles = [r["stages_s"].get("compile", 0.0) for r in runs]
        said = "; ".join(r["summary"].removeprefix("search").strip() for r in runs if r["summary"]) or "-"
        rows.append(
            f"| {name} | {statistics.median(times):.1f} | {', '.join(f'{t:.1f}' for t in times)} | "
            f"{statistics.median(compiles):.1f} | {said} |"
        )
    rows.append("")
    for name, ratio in results["ratios"].items():
        rows.append(
            f"{name} / `search = false`: {ratio:.2f}x (target <= {TARGET_RATIO}x: "
            f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})  "
        )
    rows.append(
        f"{results['cores']} core(s), load average {results['load'][0]:.2f} before and "
        f"{results['load'][1]:.2f} after ({results['spec']})"
    )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=REPO / "tests" / "models" / "tiny" / "spec.toml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench" / "search-cost")
    args = parser.parse_args(argv)
    spec = args.spec.resolve()
    before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="search-cost-") as work:
        for index in range(args.rounds):
            for name in rotated(list(VARIANTS), index):
                say(f"round {index + 1}/{args.rounds}: {name} build of {spec}")
                runs[name].append(build_once(spec, VARIANTS[name], Path(work)))
                say(f"    {runs[name][-1]['build_s']:.1f}s  {runs[name][-1]['summary']}")
    medians = {name: statistics.median(r["build_s"] for r in found) for name, found in runs.items()}
    results = {
        "spec": str(spec),
        "cores": len(os.sched_getaffinity(0)),
        "load": [before, os.getloadavg()[0]],
        "runs": runs,
        "ratios": {name: medians[name] / medians["search = false"] for name in VARIANTS if name != "search = false"},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))
    say(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
