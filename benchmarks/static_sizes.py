"""What static batch sizes cost and give: the model built without and with
``[dims.batch] static = [1, 2, 4, 8]``, both with the options the bench's own build chose (pinned,
so the two builds differ only in the static sizes); build time and wheel size of each; then the
dynamic model and the static models timed side by side at batch 1 and at the largest static size
(the .so files opened from the built wheel's folder, alternating, same process).

    python benchmarks/static_sizes.py --spec models/unet/spec.toml [--options '{"freezing": true}'] [--external]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import precision, targets  # noqa: E402
from pipeline.export import spec_inputs  # noqa: E402
from pipeline.spec import load_spec  # noqa: E402
from pipeline.templates import wheel_constants, wheel_inputs, wheel_weights  # noqa: E402

SIZES = [1, 2, 4, 8]


def variant_spec(spec: Path, static: bool, options: dict, external: bool, sizes: list[int]) -> Path:
    """A copy of the spec beside it (its factory and weights resolve the same), with the options pinned."""
    text = spec.read_text()
    text = re.sub(r"\[compile\].*?(?=\n\[|\Z)", "", text, flags=re.S)
    top = {k: v for k, v in options.items() if k in ("freezing", "max_autotune")}
    if options.get(precision.AUTOCAST_OPTION):
        top["autocast"] = options[precision.AUTOCAST_OPTION]
    # the aot_inductor.* options follow from [weights] external; the rest are passed through
    inductor = {k: v for k, v in options.items() if k not in top and k != precision.AUTOCAST_OPTION
                and not k.startswith("aot_inductor.")}
    text += "\n[compile]\nsearch = false\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in top.items())
    text += "".join(f'inductor."{k}" = {json.dumps(v)}\n' for k, v in inductor.items())
    if external:
        text = text.replace("[weights]\n", "[weights]\nexternal = true\n", 1)
    if static:
        text = text.replace("[dims.batch]\n", f"[dims.batch]\nstatic = {sizes}\n", 1)
    path = spec.parent / f".bench-{'static' if static else 'dynamic'}.toml"
    path.write_text(text)
    return path


def build(spec: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline", "build", "--spec", spec, "--no-cache", "--root", out / "opt",
                           "--build-dir", out / "build", "--dist", out / "dist"], capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"static_sizes: building {spec} failed:\n{done.stderr[-3000:]}")
    wheel = next((out / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        files = {i.filename.split("/", 1)[1]: i.file_size for i in archive.infolist() if i.filename.endswith((".so", ".safetensors", ".bin"))}
    return {"build_s": round(seconds, 1), "wheel_bytes": wheel.stat().st_size, "files": files, "wheel": str(wheel)}


def runners(wheel: Path, out: Path) -> tuple[dict, dict]:
    """Each .so of the wheel opened with torch's runner (external weights handed over), by name."""
    folder = out / "unpacked"
    shutil.rmtree(folder, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    package = next(p for p in folder.iterdir() if p.is_dir() and not p.name.endswith(".dist-info"))
    manifest = json.loads((package / "manifest.json").read_text())
    open_runner = targets.get("cpu").open_runner  # as the wheel's load() opens them
    opened = {"dynamic": open_runner(package / "artifacts" / manifest["library"])}
    for size, record in manifest["static"]["sizes"].items():
        opened[f"static{size}"] = open_runner(package / "artifacts" / record["library"])
    if manifest["weights"]["external"]:
        tensors = wheel_weights.read_weights(package / manifest["weights"]["file"])
        for runner in opened.values():
            wheel_weights.load_into(runner, tensors, inactive=False)
    if manifest.get("constants"):  # the shared constants store, as the wheel's load() hands it over
        store = opened["store"] = wheel_constants.Store(package)
        libraries = {"dynamic": manifest["library"], **{f"static{s}": r["library"] for s, r in manifest["static"]["sizes"].items()}}
        for name, library in libraries.items():
            opened[name].update_constant_buffer(store.tensors(library), False, True, True)
    return opened, manifest


def side_by_side(spec_file, opened: dict, batch: int, rounds: int) -> dict:
    inputs = list(wheel_inputs.make_inputs(spec_inputs(spec_file), {"batch": batch}, seed=0))
    pair = {"dynamic": opened["dynamic"], "static": opened[f"static{batch}"]}
    times: dict[str, list[float]] = {name: [] for name in pair}
    for runner in pair.values():
        for _ in range(3):
            runner.run(inputs)
    for _ in range(rounds):  # alternate, so drift on a shared machine hits both alike
        for name, runner in pair.items():
            for _ in range(5):
                started = time.perf_counter()
                runner.run(inputs)
                times[name].append((time.perf_counter() - started) * 1000)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"median_ms": medians, "static_over_dynamic": medians["static"] / medians["dynamic"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--options", default='{"freezing": true}', help="the compile options to pin (JSON)")
    parser.add_argument("--external", action="store_true", help="with [weights] external = true")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    options = json.loads(args.options)
    out = REPO / "build" / "bench" / load_spec(spec).spec.model.name / ("static-external" if args.external else "static")
    batch = load_spec(spec).spec.dims["batch"]
    sizes = [size for size in SIZES if batch.min <= size <= batch.max]
    results: dict = {"sizes": sizes, "options": options, "external": args.external}
    for kind in ("dynamic", "static"):
        path = variant_spec(spec, kind == "static", options, args.external, sizes)
        try:
            print(f"building {kind} ...", file=sys.stderr, flush=True)
            results[kind] = build(path, out / kind)
        finally:
            path.unlink(missing_ok=True)
    opened, _ = runners(Path(results["static"]["wheel"]), out)
    spec_file = load_spec(spec)
    results["latency"] = {str(b): side_by_side(spec_file, opened, b, args.rounds) for b in sorted({sizes[0], sizes[-1]})}
    results["wheel_ratio"] = results["static"]["wheel_bytes"] / results["dynamic"]["wheel_bytes"]
    results["build_ratio"] = results["static"]["build_s"] / results["dynamic"]["build_s"]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
