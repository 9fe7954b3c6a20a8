"""The wheel's console script: ``model-<name> link | verify | info``.

Exit codes: 0 ok, 1 golden outputs differ, 2 usage, 3 incompatible torch or machine,
4 an artifact differs from the manifest, 5 the /opt link cannot be made, 6 a package the
command needs (safetensors) is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from ._bounds import decided_by
from ._deps import MissingDependency
from ._info import summary
from ._integrity import IntegrityError, check_artifacts
from ._link import ensure_link, sweep_dangling
from ._manifest import ARTIFACTS_DIR, PACKAGE_DIR, IncompatibleRuntime, manifest
from ._schema import Manifest
from ._trust import UntrustedPath

# and 1: a golden case differs
EXIT_CODES: dict[type[Exception], int] = {IncompatibleRuntime: 3, IntegrityError: 4, MissingDependency: 6}


def _link(m: Manifest) -> int:
    check_artifacts(ARTIFACTS_DIR, m, full=True)
    try:
        ok, detail = ensure_link(Path(m["opt_path"]), ARTIFACTS_DIR)
    except UntrustedPath as exc:
        ok, detail = False, str(exc)
    if ok:
        print(detail)
        for gone in sweep_dangling(Path(m["opt_path"]).parents[1], PACKAGE_DIR.name):
            print(f"removed {gone} (its version was uninstalled)")
        return 0
    print(f"error: {detail}", file=sys.stderr)
    print(
        f"hint: run with write access to {Path(m['opt_path']).parent}; load() still works from the package directory",
        file=sys.stderr,
    )
    return 5


def _verify(m: Manifest) -> int:
    if importlib.util.find_spec("torch") is None:  # an install with --no-deps
        raise MissingDependency(
            f"{m['dist_name']} verify needs torch, which is not installed here: pip install "
            f"{m['dist_name']}=={m['full_version']} again, without --no-deps, for the torch it pins"
        )
    from ._golden import GoldenMismatch  # these import torch; and _load reads the manifest as it is imported
    from ._load import verify

    try:
        results = verify()
    except GoldenMismatch as exc:  # the numerics drifted on this machine
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for result in results:
        for diff in result.outputs:  # which bound passed it: a rel diff over rtol read as a failure
            passed = decided_by(diff.max_abs, diff.max_rel, diff.rtol, diff.atol, reference="golden")
            print(f"ok  case {result.case}: {diff.describe()}: {passed}")
    print(f"{m['dist_name']} {m['full_version']}: {len(results)} golden cases match")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        m = manifest()
    except IntegrityError as exc:  # a damaged install, not drifting numerics (exit 1)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODES[IntegrityError]
    parser = argparse.ArgumentParser(prog=m["dist_name"], description=f"{m['dist_name']} {m['full_version']}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "link",
        help=f"check the artifacts, then create or repair {m['opt_path']} -> this package's "
        "artifacts. Needed only by CUDA wheels (their kernels are addressed by that path) in processes "
        "that may not write there themselves, e.g. as a Dockerfile step run as root; a CPU wheel loads "
        "from site-packages without it",
    )
    commands.add_parser("verify", help="re-run the golden cases recorded at build time on this machine")
    info = commands.add_parser("info", help="what the wheel holds: its inputs, outputs, build and files")
    info.add_argument("--json", action="store_true", help="print the whole build manifest as JSON instead")
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            print(json.dumps(m, indent=2, sort_keys=True) if args.json else "\n".join(summary(m, ARTIFACTS_DIR)))
            return 0
        return _link(m) if args.command == "link" else _verify(m)
    except tuple(EXIT_CODES) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODES[type(exc)]


if __name__ == "__main__":
    sys.exit(main())
