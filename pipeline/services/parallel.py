"""Several specs built at once, each in its own process (torch and the compiler are per process),
at most ``jobs`` at a time; each build's output goes to <build-dir>/logs/<folder>-<spec>.log, its
--json record beside it, and a live terminal shows one line per build, read from the end of its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import PipelineError
from . import proc
from .progress import Progress
from .record import record_path
from .wording import duration


def _log_path(log_dir: Path, spec: str) -> Path:
    return log_dir / f"{Path(spec).resolve().parent.name}-{Path(spec).stem}.log"


def build_many(
    specs: list[str], passthrough: list[str], jobs: int, log_dir: Path, progress: Progress, logs: dict[str, Path]
) -> int:
    """Returns 0 when every build succeeded, else the exit code of the first that failed; ``logs``
    gets each started build's log."""
    say = progress.say
    log_dir.mkdir(parents=True, exist_ok=True)
    queue = list(specs)
    failed: list[tuple[str, int]] = []  # (spec, exit code)
    running: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}  # spec: (process, log, start)
    started = time.perf_counter()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                spec = queue.pop(0)
                log = logs[spec] = _log_path(log_dir, spec)
                record_path(log).unlink(missing_ok=True)
                cmd = [
                    sys.executable,
                    "-m",
                    "pipeline",
                    "build",
                    "--spec",
                    spec,
                    *passthrough,
                    "--json-out",
                    str(record_path(log)),
                ]
                running[spec] = (proc.start(cmd, log), log, time.perf_counter())
                say(f"==> build {spec} (log: {log})")
            for spec, (child, log, began) in list(running.items()):
                if child.poll() is None:
                    progress.track(spec, f"{last_stage(log)} · {duration(time.perf_counter() - began)}")
                    continue
                del running[spec]
                seconds = time.perf_counter() - began
                progress.track(spec, f"{'built' if child.returncode == 0 else 'FAILED'} in {duration(seconds)}")
                if child.returncode == 0:
                    say(f"    {spec} built in {seconds:.1f}s")
                else:
                    failed.append((spec, child.returncode))
                    tail = "\n      ".join(log.read_text(errors="replace").splitlines()[-4:])
                    say(f"    {spec} FAILED (exit {child.returncode}) after {seconds:.1f}s:\n      {tail}")
            time.sleep(0.2)
    except KeyboardInterrupt:
        for child, _, _ in running.values():
            child.send_signal(signal.SIGINT)  # each build removes what it wrote
        for child, _, _ in running.values():
            child.wait()
        raise
    say(
        f"{len(specs) - len(failed)} of {len(specs)} builds succeeded in {time.perf_counter() - started:.1f}s "
        f"({jobs} at a time)"
    )
    if failed:
        raise (
            PipelineError(
                f"{len(failed)} build(s) failed: " + ", ".join(f"{s} (exit {c})" for s, c in failed),
                f"each build's log is in {log_dir}/",
            )
            if len(failed) > 1
            else _first_failure(*failed[0], log_dir)
        )
    return 0


def _first_failure(spec: str, code: int, log_dir: Path) -> PipelineError:
    error = PipelineError(f"the build of {spec} failed (exit {code})", f"its log is {_log_path(log_dir, spec)}")
    error.exit_code = code
    return error


def last_stage(log: Path) -> str:
    """The stage a build's log last started, with the candidate it last finished."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 8192))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return "starting"
    for line in reversed(lines):  # the build's own status line, when it is newer than its last stage line
        if line.startswith("==> "):
            break
        if line.startswith("    ... "):
            return line[len("    ... ") :]
    stage = next((line[4:].split(":")[0] for line in reversed(lines) if line.startswith("==> ")), "starting")
    candidate = next((line.strip() for line in reversed(lines) if line.startswith("    candidate ")), "")
    return f"{stage} ({candidate})" if stage == "compile" and candidate else stage


def default_jobs(count: int) -> int:
    return max(1, min(count, os.cpu_count() or 1))
