"""Build the model zoo (tests/zoo/) and print docs/model-zoo.md's table.

    .venv/bin/python tools/zoo_table.py [NAME ...]      # after `make test-deps`

Per model: the build's wall time (no cache), the wheel's size, the worst max abs diff of any
verification case and output, and the latency at batch 1 of the installed wheel (a fresh venv
with only torch and the wheel) against the eager module (this venv, with transformers and
diffusers): the median of 50 calls after 5 warm-up calls, each in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "zoo"
OUT = REPO / "build" / "zoo-table"
CALLS, WARMUP = 50, 5

TIMER = """
import json, statistics, sys, time
import torch
{setup}
with torch.no_grad():
    for _ in range({warmup}):
        run()
    times = []
    for _ in range({calls}):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
print(json.dumps({{"ms": statistics.median(times) * 1000}}))
"""
WHEEL_SETUP = """
import {module} as m
model = m.load()
inputs = m.example_inputs(batch=1)
run = lambda: model(*inputs)
"""
EAGER_SETUP = """
from pipeline.wheel_template.runtime import _inputs as wheel_inputs
from pipeline.spec import load_spec
from pipeline.stages.export import spec_inputs
from pipeline.stages.loader import call_forward, load_model
spec_file = load_spec({spec!r})
module = load_model(spec_file).module
inputs = tuple(wheel_inputs.make_inputs(spec_inputs(spec_file), {{"batch": 1}}, seed=0))
run = lambda: call_forward(module, inputs)
"""


def timed_ms(python: Path, setup: str, env: dict[str, str] | None = None) -> float:
    code = TIMER.format(setup=setup, warmup=WARMUP, calls=CALLS)
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", env=env)
    if done.returncode:
        raise SystemExit(f"timing failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])["ms"]


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def build(name: str) -> tuple[float, Path, dict]:
    dist, root = OUT / "dist" / name, OUT / "opt"
    args = [
        "--spec",
        str(ZOO / name / "spec.toml"),
        "--root",
        str(root),
        "--dist",
        str(dist),
        "--build-dir",
        str(OUT / "build"),
        "--no-cache",
        "--quiet",
    ]
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline", "build", *args], capture_output=True, text=True, cwd=REPO)
    seconds = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"{name}: build failed (exit {done.returncode}):\n{done.stderr}")
    wheel = Path(done.stdout.strip().splitlines()[-1])
    report = json.loads(next(dist.glob("*.report.json")).read_text())
    return seconds, wheel, report


def row(name: str, bench_python: Path) -> dict:
    seconds, wheel, report = build(name)
    subprocess.run([str(bench_python), "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    script = bench_python.parent / wheel.name.split("-")[0].replace("_", "-")
    verified = subprocess.run([str(script), "verify"], capture_output=True, text=True)
    if verified.returncode:
        raise SystemExit(f"{name}: model verify failed in the fresh venv:\n{verified.stdout}{verified.stderr}")
    module = wheel.name.split("-")[0]
    spec = ZOO / name / "spec.toml"
    worst = max(w["max_abs"] for w in report["verification"]["worst"].values())
    return {
        "name": name,
        "summary": spec.read_text().splitlines()[0].lstrip("# ").split(":")[0],
        "build_s": seconds,
        "wheel_mb": wheel.stat().st_size / 1e6,
        "max_abs": worst,
        "chosen": report.get("compile_search", {}).get("chosen", "pinned"),
        "wheel_ms": timed_ms(bench_python, WHEEL_SETUP.format(module=module)),
        # the eager module in this venv, the repository (pipeline/) on its path
        "eager_ms": timed_ms(
            Path(sys.executable), EAGER_SETUP.format(spec=str(spec)), env={**os.environ, "PYTHONPATH": str(REPO)}
        ),
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | architecture | build (s) | wheel (MB) | max abs diff | options chosen "
        "| wheel, batch 1 (ms) | eager, batch 1 (ms) | eager / wheel |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['name']}` | {r['summary']} | {r['build_s']:.0f} | {r['wheel_mb']:.2f} | {r['max_abs']:.2g} | "
            f"{r['chosen']} | {r['wheel_ms']:.2f} | {r['eager_ms']:.2f} | {r['eager_ms'] / r['wheel_ms']:.1f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in ZOO.iterdir() if (p / "spec.toml").exists())
    OUT.mkdir(parents=True, exist_ok=True)
    bench_python = fresh_venv(OUT / "venv")
    rows = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(row(name, bench_python))
    (OUT / "rows.json").write_text(json.dumps(rows, indent=2))
    print(f"{os.cpu_count()} CPUs seen; torch threads at their default", file=sys.stderr)
    print(markdown(rows))


if __name__ == "__main__":
    main()
