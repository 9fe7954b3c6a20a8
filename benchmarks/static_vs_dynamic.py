"""What a dynamic batch costs: the model compiled with the spec's dynamic dims and with every dim
fixed at its minimum, same options (freezing), timed side by side at that size.

    python benchmarks/static_vs_dynamic.py --spec models/unet/spec.toml

With a dynamic batch Inductor itself leaves convolution weights in their plain layout (it packs
them for oneDNN at compile time only when the input shape is static); both builds here get the
pipeline's CPU graph passes, as the wheel does, which pack the dynamic model's where one layout
serves every size (pipeline/conv_prepack.py), so what is left is the cost of code that cannot
assume a size and of the weights oneDNN still reorders on every call.
Prints one JSON object: each build's median ms and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.export import dynamic_shapes, prepare, spec_inputs  # noqa: E402
from pipeline.loader import load_model  # noqa: E402
from pipeline import targets  # noqa: E402
from pipeline.spec import load_spec  # noqa: E402
from pipeline.templates import wheel_inputs  # noqa: E402

OPTIONS = {"freezing": True}


def compile_at(spec, module, args, shapes, path: Path):
    cpu = targets.get("cpu")
    with torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        options = {**cpu.compile_options(spec), **OPTIONS, **cpu.graph_passes(OPTIONS), "aot_inductor.output_path": str(path)}
        torch._inductor.aot_compile(program.module(), args, options=options)
    return cpu.open_runner(path)  # as the wheel's load() opens it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    spec_file = load_spec(args.spec)
    loaded = load_model(spec_file)
    exported = prepare(spec_file, loaded)
    smallest = {name: dim.min for name, dim in spec_file.spec.dims.items()}
    inputs = tuple(wheel_inputs.make_inputs(spec_inputs(spec_file), smallest, seed=0))
    with tempfile.TemporaryDirectory() as folder:
        print("compiling with dynamic dims, then with static ones ...", file=sys.stderr)
        spec, module = spec_file.spec, loaded.module
        runners = {
            "dynamic": compile_at(spec, module, exported.example_inputs, dynamic_shapes(spec_file), Path(folder) / "dynamic.so"),
            "static": compile_at(spec, module, inputs, None, Path(folder) / "static.so"),
        }
        times: dict[str, list[float]] = {name: [] for name in runners}
        for runner in runners.values():
            for _ in range(3):
                runner.run(list(inputs))
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both alike
            for name, runner in runners.items():
                for _ in range(10):
                    started = time.perf_counter()
                    runner.run(list(inputs))
                    times[name].append((time.perf_counter() - started) * 1000)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({"sizes": smallest, "options": OPTIONS, "median_ms": medians,
                      "static_over_dynamic": medians["static"] / medians["dynamic"]}))


if __name__ == "__main__":
    main()
