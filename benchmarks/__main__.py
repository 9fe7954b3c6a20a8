"""`make bench [TARGET=NAME]` runs `python -m benchmarks [--target NAME] --spec SPEC ...`: the
benchmark of a target the registry names (pipeline/targets/; its default target without
--target), with the rest of the command line passed on.

A target whose benchmark is a module of its own, ``benchmarks/bench_<name>.py`` (the cuda
target's: the current GPU against eager and torch.compile, installing nothing, as GPU images
often have no network), runs that; any other runs ``benchmarks/bench.py`` on this machine, after
installing what it compares against (benchmarks/requirements.txt: ONNX Runtime, the chart's
matplotlib; ``--pip-args``: the Makefile's offline flags)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

from pipeline import targets

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
HOST_BENCH = f"{__package__}.bench"


def bench_module(target: str) -> str:
    """The module that measures ``target``'s wheel: its own, or the host's."""
    own = f"{__package__}.bench_{target}"
    return own if importlib.util.find_spec(own) is not None else HOST_BENCH


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        choices=targets.names(),
        default=targets.DEFAULT,
        help="the target whose wheel is measured (default: the registry's default)",
    )
    parser.add_argument("--pip-args", default="", help="extra pip install arguments for the host bench's packages")
    args, rest = parser.parse_known_args()
    module = bench_module(args.target)
    if module == HOST_BENCH:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", *shlex.split(args.pip_args), "-r", str(REQUIREMENTS)],
            check=True,
        )
        rest = ["--target", args.target, *rest]
    sys.argv = [f"python -m {module}", *rest]
    importlib.import_module(module).main()


if __name__ == "__main__":
    main()
