"""The wheel's console script: ``model-<name> link`` and ``model-<name> info``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._link import ensure_link
from ._load import ARTIFACTS_DIR, manifest


def main(argv: list[str] | None = None) -> int:
    m = manifest()
    parser = argparse.ArgumentParser(prog=m["dist_name"], description=f"{m['dist_name']} {m['full_version']}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("link", help=f"create or repair the link {m['opt_path']} -> the installed artifacts")
    commands.add_parser("info", help="print the build manifest as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        print(json.dumps(m, indent=2, sort_keys=True))
        return 0
    ok, detail = ensure_link(Path(m["opt_path"]), ARTIFACTS_DIR)
    if ok:
        print(detail)
        return 0
    print(f"error: {detail}", file=sys.stderr)
    print(f"hint: run with write access to {Path(m['opt_path']).parent}; load() still works from the package directory", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
