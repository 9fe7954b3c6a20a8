"""The one way the pipeline runs a subprocess: log the command, capture output, show it on failure."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import PipelineError

log = logging.getLogger("pipeline.proc")

_TAIL_LINES = 40


def run(
    cmd: Sequence[str],
    *,
    error: type[PipelineError],
    what: str,
    hint: str = "",
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``cmd`` and return its combined output; raise ``error`` with the output's tail on failure."""
    log.info("$ %s", shlex.join(str(c) for c in cmd))
    full_env = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise error(f"{what}: cannot run {cmd[0]!r}: {exc.strerror}", hint) from exc
    log.debug("%s", done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-_TAIL_LINES:])
        raise error(
            f"{what} failed (exit {done.returncode}): {shlex.join(str(c) for c in cmd)}\n{tail}",
            hint,
        )
    return done.stdout
