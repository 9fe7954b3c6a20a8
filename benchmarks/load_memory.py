"""Resident memory of a fresh process that loads an installed model wheel, against its weights' size.

    python benchmarks/load_memory.py model_unet [--json]

Run it with the python of the environment the wheel is installed in. It prints RSS after
`import torch`, after `load()` and after one call, the weights' size (the external weights
file, else the .so), and the ratio of the last RSS to that size.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
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
    weights = manifest["weights"]
    size = weights["size"] if weights["external"] else sum(a["size"] for a in manifest["artifacts"].values())
    return {
        "model": f"{manifest['dist_name']} {manifest['full_version']}",
        "weights_bytes": size,
        "rss_after_import_torch": after_torch,
        "rss_after_load": after_load,
        "rss_after_first_call": after_call,
        "ratio_to_weights": round(after_call / size, 3),
        "load_s": round(load_s, 3),
        "total_s": round(time.perf_counter() - start, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("import_name")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.import_name)
    if args.json:
        print(json.dumps(result))
        return
    gb = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    print(f"{result['model']}: weights {gb(result['weights_bytes'])}")
    print(f"  RSS after import torch  {gb(result['rss_after_import_torch'])}")
    print(f"  RSS after load()        {gb(result['rss_after_load'])}  (load {result['load_s']}s)")
    print(f"  RSS after first call    {gb(result['rss_after_first_call'])}  = {result['ratio_to_weights']}x the weights")


if __name__ == "__main__":
    main()
