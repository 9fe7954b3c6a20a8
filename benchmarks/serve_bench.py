"""`make bench-serve MODEL=unet`: the same HTTP load against the wheel and against eager PyTorch,
both behind docs/serving/app.py (uvicorn, one worker), each with and without dynamic batching,
and with a call per core at once (the app's MODEL_SLOTS), measured side by side in one run.
Writes results.json, results.md and chart.png under build/bench/serve-<model>/ and prints the
table.

Both servers run from this interpreter: the wheel installed (--no-deps) into --site, eager
through benchmarks/serve_eager.py, which builds the module as the build does. The load comes
from docs/serving/client.py: a fixed count of single-sample requests, at most C in flight; then
requests at a set arrival rate, stepped up in each setup, for requests/s at equal p99
(benchmarks/serve_slo.py). The servers of one slot count run together, one engine measured at
a time; then the next slot count's. Last, with no server running, each engine's model call alone
at batch 1 and the batch max (benchmarks/serve_limit.py): what bounds the lead batching leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks import say, serve_limit, serve_slo, write_results

REPO = Path(__file__).resolve().parent.parent
SERVING = REPO / "docs" / "serving"
ENGINES = {"wheel": ("app:app", SERVING), "eager": ("serve_eager:app", REPO / "benchmarks")}
CORES = os.cpu_count() or 1
SETUPS = serve_slo.setups(CORES)  # each measured on both engines
TARGET = 1.5  # the wheel's requests/s over eager's


def load_client() -> Any:
    """docs/serving/client.py, the very client the page shows (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("serving_client", SERVING / "client.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench-serve: cannot import {SERVING / 'client.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(engine: str, package: str, site: Path, spec: Path, slots: int, log: Path) -> Iterator[str]:
    """A uvicorn server of ``engine`` on a free port, ``slots`` calls at a time, stopped (its
    process group) afterwards."""
    target, app_dir = ENGINES[engine]
    port = free_port()
    env = {
        **os.environ,
        "MODEL_PACKAGE": package,
        "MODEL_SPEC": str(spec),
        "MODEL_SLOTS": str(slots),
        "PYTHONPATH": os.pathsep.join([str(site), str(SERVING)]),
    }
    if slots > 1:  # the cores shared out among the calls (docs/serving.md)
        env["OMP_NUM_THREADS"] = str(max(1, CORES // slots))
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        target,
        "--app-dir",
        str(app_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--no-access-log",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", process, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_ready(url: str, process: subprocess.Popen, log: Path, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"bench-serve: the server exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"bench-serve: the server did not answer in {limit_s}s:\n{log.read_text()[-3000:]}")


def single_requests(manifest: dict, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Batch-1 requests of the declared shapes, dtypes and value ranges."""
    rng = np.random.default_rng(seed)
    sizes = {name: 1 for name in manifest["dims"]}
    made = []
    for _ in range(count):
        request = {}
        for spec in manifest["inputs"]:
            shape = [sizes[a] if isinstance(a, str) else a for a in spec["shape"]]
            low, high = spec.get("low"), spec.get("high")
            values = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
            request[spec["name"]] = values.astype(spec["dtype"])
        made.append(request)
    return made


def measure(client: Any, url: str, requests: list, concurrency: int) -> tuple[dict, list]:
    """Requests/s and latency percentiles of one bounded load (after a warm-up of its own)."""
    asyncio.run(client.load_test(url, requests[: 2 * concurrency], concurrency, timeout_s=600))
    started = time.perf_counter()
    answers = asyncio.run(client.load_test(url, requests, concurrency, timeout_s=600))
    wall = time.perf_counter() - started
    failed = [a for a in answers if a.status != 200]
    if failed:
        raise SystemExit(f"bench-serve: {len(failed)} requests to {url} failed: {failed[0].status} {failed[0].detail}")
    latencies = np.array([a.latency_s for a in answers]) * 1000
    return (
        {
            "requests": len(answers),
            "wall_s": wall,
            "rps": len(answers) / wall,
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
        },
        answers,
    )


@contextlib.contextmanager
def both_engines(package: str, site: Path, spec: Path, slots: int, out: Path) -> Iterator[dict[str, str]]:
    """The wheel's and eager's servers, ``slots`` calls at a time each: their URLs by engine."""
    suffix = "" if slots == 1 else f"-{slots}-slots"
    with (
        serving("wheel", package, site, spec, slots, out / f"wheel{suffix}.log") as wheel_url,
        serving("eager", package, site, spec, slots, out / f"eager{suffix}.log") as eager_url,
    ):
        yield {"wheel": wheel_url, "eager": eager_url}


def closed_loads(
    client: Any,
    urls: dict[str, str],
    setups: dict[str, serve_slo.Setup],
    requests: list,
    args: argparse.Namespace,
    answers: dict[str, list],
) -> list[dict]:
    """A row per round, in-flight count, setup and engine (rotated order); each engine's last
    answers go into ``answers``."""
    rows = []
    for round_index in range(args.rounds):
        for concurrency in args.concurrency:
            for name, setup in setups.items():
                engines = list(urls) if round_index % 2 == 0 else list(urls)[::-1]  # rotated order
                for engine in engines:
                    say(f"==> round {round_index + 1}: {engine} {name}, {concurrency} in flight")
                    row, answers[engine] = measure(client, urls[engine] + setup.path, requests, concurrency)
                    rows.append(
                        {"engine": engine, "setup": name, "concurrency": concurrency, "round": round_index, **row}
                    )
                    say(f"    {row['rps']:.1f} req/s, p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms")
    return rows


def max_difference(first: list, second: list) -> float:
    return max(float(np.abs(a.outputs[k] - b.outputs[k]).max()) for a, b in zip(first, second) for k in a.outputs)


def run(args: argparse.Namespace) -> dict:
    package = f"model_{args.model}"
    manifest = json.loads((args.site / package / "manifest.json").read_text())
    client = load_client()
    requests = single_requests(manifest, args.requests)
    paced = single_requests(manifest, args.paced_requests, seed=1)
    out = REPO / "build" / "bench" / f"serve-{args.model}"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    slo_rows: list[dict] = []
    answers: dict[str, list] = {}
    for slots in dict.fromkeys(setup.slots for setup in SETUPS.values()):  # one call at a time first
        setups = {name: setup for name, setup in SETUPS.items() if setup.slots == slots}
        with both_engines(package, args.site, args.spec, slots, out) as urls:
            rows += closed_loads(client, urls, setups, requests, args, answers)
            summary = summarize(rows)
            # the bounds: eager's p50 for one request alone, one call at a time on every core
            alone_p50_ms = next(
                s["eager"]["p50_ms"]
                for s in summary
                if s["setup"] == "/predict" and s["concurrency"] == min(args.concurrency)
            )
            for name, setup in setups.items():
                # its rates scale with what eager serves in this setup under the closed load's most in flight
                base_rps = next(
                    s["eager"]["rps"]
                    for s in summary
                    if (s["setup"], s["concurrency"]) == (name, max(args.concurrency))
                )
                slo_rows += serve_slo.sweep(
                    client, urls, name, setup, paced, base_rps, max(serve_slo.BOUNDS) * alone_p50_ms, say
                )
    limit = serve_limit.measure(args.spec, args.site, package, [1, serve_limit.batch_max(manifest)])
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next(
        (line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
        platform.processor(),
    )
    isa = "AVX-512" if "avx512f" in lscpu else "AVX2" if "avx2" in lscpu else "no AVX2"
    return {
        "model": manifest["name"],
        "version": manifest["full_version"],
        "torch": torch.__version__,
        "cores": CORES,
        "cpu": f"{model_name} ({isa})",
        "requests": args.requests,
        "rounds": args.rounds,
        "setups": {name: {**dataclasses.asdict(setup), "label": setup.label} for name, setup in SETUPS.items()},
        "rows": rows,
        "summary": summary,
        "max_abs_diff_wheel_vs_eager": max_difference(answers["wheel"], answers["eager"]),
        "paced_requests": args.paced_requests,
        "equal_p99": {
            "alone_p50_ms": alone_p50_ms,
            "rows": slo_rows,
            "bounds": serve_slo.at_bounds(slo_rows, alone_p50_ms),
        },
        "limit": limit,
    }


def summarize(rows: list[dict]) -> list[dict]:
    """Per setup (in the order measured) and concurrency, each engine's median over rounds, and the
    wheel's ratio to eager."""
    summary = []
    for name in dict.fromkeys(r["setup"] for r in rows):
        for concurrency in sorted({r["concurrency"] for r in rows}):
            entry: dict[str, Any] = {"setup": name, "concurrency": concurrency}
            for engine in ENGINES:
                mine = [r for r in rows if (r["engine"], r["setup"], r["concurrency"]) == (engine, name, concurrency)]
                entry[engine] = {key: float(np.median([r[key] for r in mine])) for key in ("rps", "p50_ms", "p99_ms")}
            entry["rps_ratio"] = entry["wheel"]["rps"] / entry["eager"]["rps"]
            entry["p99_ratio"] = entry["wheel"]["p99_ms"] / entry["eager"]["p99_ms"]
            summary.append(entry)
    return summary


def markdown(results: dict) -> str:
    lines = [
        f"# Serving {results['model']} {results['version']}: the wheel against eager PyTorch",
        "",
        f"{results['cpu']}, {results['cores']} cores, torch {results['torch']}; uvicorn, 1 worker, "
        f"docs/serving/app.py; {results['requests']} single-sample requests per measurement, median of "
        f"{results['rounds']} rounds (rotated order).",
        "",
        "| setup | in flight | wheel req/s | eager req/s | "
        "wheel / eager | wheel p50 / p99 (ms) | eager p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in results["summary"]:
        w, e, setup = s["wheel"], s["eager"], results["setups"][s["setup"]]
        lines.append(
            f"| {setup['label']} ({setup['what']}) | {s['concurrency']} | {w['rps']:.1f} | {e['rps']:.1f} | "
            f"{s['rps_ratio']:.2f}x | {w['p50_ms']:.0f} / {w['p99_ms']:.0f} | {e['p50_ms']:.0f} / {e['p99_ms']:.0f} |"
        )
    met = [s for s in results["summary"] if s["rps_ratio"] >= TARGET and s["p99_ratio"] <= 1.0]
    lines += [
        "",
        f"At equal in-flight counts: the wheel serves >= {TARGET}x eager's requests/s with an equal or lower p99 "
        + (f"at {len(met)} of {len(results['summary'])} settings." if met else "at none of the settings measured."),
        f"Largest difference between the wheel's and eager's answers: {results['max_abs_diff_wheel_vs_eager']:.2e}.",
    ]
    lines += serve_slo.markdown_lines(results, TARGET)
    lines += serve_limit.markdown_lines(results["limit"], TARGET)
    return "\n".join(lines) + "\n"


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    short = {
        name: ("batched" if "batched" in name else "direct") + (f" x{setup['slots']}" if setup["slots"] > 1 else "")
        for name, setup in results["setups"].items()
    }
    labels = [f"{short[s['setup']]}\n{s['concurrency']} in flight" for s in results["summary"]]
    spots = np.arange(len(labels))
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for axis, key, title in (
        (axes[0], "rps", "requests/s (higher is better)"),
        (axes[1], "p99_ms", "p99 latency, ms (lower is better)"),
    ):
        for offset, engine, color in ((-0.2, "wheel", "#c0392b"), (0.2, "eager", "#999999")):
            axis.bar(spots + offset, [s[engine][key] for s in results["summary"]], 0.4, label=engine, color=color)
        axis.set_xticks(spots, labels)
        axis.set_title(title)
        axis.legend()
    slo = results["equal_p99"]
    for engine, color in (("wheel", "#c0392b"), ("eager", "#999999")):
        for name, style in zip(results["setups"], ("s--", "o-", "^:")):
            mine = sorted(
                (r for r in slo["rows"] if (r["engine"], r["setup"]) == (engine, name)), key=lambda r: r["rps"]
            )
            axes[2].plot(
                [r["rps"] for r in mine],
                [r["p99_ms"] for r in mine],
                style,
                color=color,
                label=f"{engine}, {short[name]}",
            )
    for bound_ms in sorted({e["bound_ms"] for e in slo["bounds"]}):
        axes[2].axhline(bound_ms, color="#555555", linewidth=0.6, linestyle=":")
    axes[2].set_yscale("log")
    axes[2].set(
        title="p99 against arrival rate (dotted: the bounds)", xlabel="requests arriving per second", ylabel="p99, ms"
    )
    axes[2].legend()
    fig.suptitle(f"serving {results['model']}: {results['cpu']}, {results['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--site", type=Path, required=True, help="where the wheel is installed (pip install --target)")
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--paced-requests", type=int, default=600, help="requests per arrival rate, for requests/s at equal p99"
    )
    args = parser.parse_args()
    args.spec = args.spec.resolve()
    args.site = args.site.resolve()
    args.model = next(args.site.glob("model_*/manifest.json")).parent.name.removeprefix("model_")
    results = run(args)
    out = REPO / "build" / "bench" / f"serve-{args.model}"
    write_results(out, results, markdown, chart)


if __name__ == "__main__":
    main()
