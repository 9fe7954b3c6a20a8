"""`build --json`: one machine-readable record of a build on stdout, for scripts and CI steps.

Per wheel built, the report's key facts (path, sha256, version, target, stage times, the
verification summary); per failed build of several, its spec, exit code and message; and the
command's own exit code and error. docs/how-a-build-works.md#the-json-record describes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import IO, Any, Protocol

from ..errors import PipelineError
from .proc import redact

FORMAT = 1


class Built(Protocol):
    """What a finished build hands the record (stages.deliver.BuildResult, a layer above this one)."""

    @property
    def wheel(self) -> Path: ...
    @property
    def report_path(self) -> Path: ...
    @property
    def report(self) -> dict[str, Any]: ...


def of_build(result: Built) -> dict[str, Any]:
    report, verification = result.report, result.report["verification"]
    return {
        "model": report["model"],
        "version": report["version"],
        "target": report["target"],
        "wheel": str(result.wheel),
        "sha256": report["wheel"]["sha256"],
        "size": report["wheel"]["size"],
        "report": str(result.report_path),
        "stages_s": report["stages_s"],
        "reused": report["build_cache"]["reused"],
        "verification": {
            "passed": True,
            "reference": verification["reference"],
            "cases": len(verification["cases"]),
            "worst": verification["worst"],
            "tolerances": verification["tolerances"],
        },
    }


def of_command(args: argparse.Namespace, exit_code: int, error: PipelineError | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "exit_code": exit_code,
        "builds": [r for r in args.records if "wheel" in r],
        "failures": [r for r in args.records if "spec" in r],
        # an index URL in an error must not leak through the record either
        "error": None if error is None else {"message": redact(error.message), "hint": redact(error.hint)},
        **getattr(args, "extra", {}),
    }


def record_path(log: Path) -> Path:
    return log.with_suffix(".json")


def children(specs: list[str], logs: dict[str, Path]) -> list[dict[str, Any]]:
    """The records parallel builds wrote (--json-out), as this command's builds and failures."""
    found: list[dict[str, Any]] = []
    for spec in specs:
        log = logs.get(spec)
        if log is None:  # never started (an earlier interrupt)
            continue
        try:
            child = json.loads(record_path(log).read_text())
        except (OSError, ValueError):
            found.append({"spec": spec, "exit_code": None, "error": "the build left no record", "hint": f"see {log}"})
            continue
        found += child["builds"] + child["failures"]
        if child["error"]:
            found.append({"spec": spec, "exit_code": child["exit_code"], **child["error"]})
    return found


def emit(record: dict[str, Any], path: str | None, stream: IO[str] | None = None) -> None:
    """To ``path`` (a parallel build's child), else ``stream`` (the stdout --json kept aside)."""
    text = json.dumps(record, sort_keys=True)
    if path:
        Path(path).write_text(text + "\n")
    else:
        print(text, file=stream or sys.stdout, flush=True)
