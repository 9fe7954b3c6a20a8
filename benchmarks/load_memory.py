"""Resident memory of a fresh process that loads an installed model wheel, against its weights' size.

    PYTHONPATH=REPO python -m benchmarks.load_memory model_unet [--json]      # what `make bench-memory` runs
    python REPO/benchmarks/load_memory.py model_unet [--json]                   # the same, by path

Run it with the python of the environment the wheel is installed in; it imports nothing of the
repository, and measures in fresh processes of this file. It prints RSS after
`import torch`, after `load()`, after one call and after 10 calls at the largest batch, the
weights' size (the external weights file, else the .so), and the ratio of the first call's RSS
to that size. Without --json it measures fresh processes in pairs, one with the runtime's heap
setting and one with glibc's defaults (MODELWHEEL_MALLOC=default), ROUNDS pairs, and shows
what keeping freed memory in the heap costs in resident memory (median [range]: with glibc's
defaults it varies from process to process).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(import_name: str) -> dict:
    start = time.perf_counter()
    import torch  # noqa: F401  (the baseline every model process pays)

    after_torch = rss_bytes()
    package = importlib.import_module(import_name)
    manifest = package.manifest()
    loaded_at = time.perf_counter()
    model = package.load()
    load_s = time.perf_counter() - loaded_at
    after_load = rss_bytes()
    model(*package.example_inputs())
    after_call = rss_bytes()
    largest = max((dim["max"] for dim in manifest.get("dims", {}).values()), default=None)
    inputs = package.example_inputs(batch=largest) if largest else package.example_inputs()
    for _ in range(10):
        model(*inputs)
    after_calls = rss_bytes()
    weights = manifest["weights"]
    size = weights["size"] if weights["external"] else sum(a["size"] for a in manifest["artifacts"].values())
    return {
        "model": f"{manifest['dist_name']} {manifest['full_version']}",
        "weights_bytes": size,
        "rss_after_import_torch": after_torch,
        "rss_after_load": after_load,
        "rss_after_first_call": after_call,
        "largest_batch": largest,
        "rss_after_calls_at_largest_batch": after_calls,
        "ratio_to_weights": round(after_call / size, 3),
        "load_s": round(load_s, 3),
        "total_s": round(time.perf_counter() - start, 3),
    }


ROUNDS = 5


def in_fresh_process(import_name: str, **env: str) -> dict:
    ran = subprocess.run(
        [sys.executable, __file__, import_name, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    result: dict = json.loads(ran.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("import_name")
    parser.add_argument("--json", action="store_true", help="measure this process only, as JSON")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.import_name)))
        return
    pairs = [
        (in_fresh_process(args.import_name), in_fresh_process(args.import_name, MODELWHEEL_MALLOC="default"))
        for _ in range(ROUNDS)
    ]
    kept = pairs[0][0]
    gb = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    print(f"{kept['model']}: weights {gb(kept['weights_bytes'])}")
    print(f"  RSS after import torch  {gb(kept['rss_after_import_torch'])}")
    print(f"  RSS after load()        {gb(kept['rss_after_load'])}  (load {kept['load_s']}s)")
    print(f"  RSS after first call    {gb(kept['rss_after_first_call'])}  = {kept['ratio_to_weights']}x the weights")
    batch = f"batch {kept['largest_batch']}" if kept["largest_batch"] else "the example inputs"
    print(f"  RSS after 10 calls at {batch}, median [range] of {ROUNDS} processes each:")
    for label, side in (("the runtime's heap setting", 0), ("glibc's defaults (MODELWHEEL_MALLOC=default)", 1)):
        mib = [pair[side]["rss_after_calls_at_largest_batch"] / 2**20 for pair in pairs]
        print(f"    {statistics.median(mib):.0f} MiB [{min(mib):.0f}-{max(mib):.0f}]  {label}")


if __name__ == "__main__":
    main()
