"""Several specs built at once, each in its own process (torch and the compiler are per process),
at most ``jobs`` at a time; each build's output goes to <build-dir>/logs/<folder>-<spec>.log."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from . import proc
from .errors import PipelineError


def _log_path(log_dir: Path, spec: str) -> Path:
    return log_dir / f"{Path(spec).resolve().parent.name}-{Path(spec).stem}.log"


def build_many(specs: list[str], passthrough: list[str], jobs: int, log_dir: Path, say) -> int:
    """Returns 0 when every build succeeded, else the exit code of the first that failed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    queue, running, failed = list(specs), {}, []
    started = time.perf_counter()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                spec = queue.pop(0)
                log = _log_path(log_dir, spec)
                cmd = [sys.executable, "-m", "pipeline", "build", "--spec", spec, *passthrough]
                running[spec] = (proc.start(cmd, log), log, time.perf_counter())
                say(f"==> build {spec} (log: {log})")
            for spec, (child, log, began) in list(running.items()):
                if child.poll() is None:
                    continue
                del running[spec]
                seconds = time.perf_counter() - began
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
    say(f"{len(specs) - len(failed)} of {len(specs)} builds succeeded in {time.perf_counter() - started:.1f}s "
        f"({jobs} at a time)")
    if failed:
        raise PipelineError(
            f"{len(failed)} build(s) failed: " + ", ".join(f"{s} (exit {c})" for s, c in failed),
            f"each build's log is in {log_dir}/",
        ) if len(failed) > 1 else _first_failure(*failed[0], log_dir)
    return 0


def _first_failure(spec: str, code: int, log_dir: Path) -> PipelineError:
    error = PipelineError(f"the build of {spec} failed (exit {code})", f"its log is {_log_path(log_dir, spec)}")
    error.exit_code = code
    return error


def default_jobs(count: int) -> int:
    return max(1, min(count, os.cpu_count() or 1))
