"""The one way the pipeline runs a subprocess: log the command, capture output, show it on failure."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import PipelineError

log = logging.getLogger("pipeline.proc")

_TAIL_LINES = 40
SECRET_ENV = ("TWINE_PASSWORD", "MODELWHEEL_INDEX_PASSWORD")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """Credentials never reach output, logs or reports: URL userinfo and secret env values become ***."""
    text = _USERINFO.sub("***@", text)
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 3:
            text = text.replace(value, "***")
    return text


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
    shown = redact(shlex.join(str(c) for c in cmd))
    log.info("$ %s", shown)
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
    output = redact(done.stdout)
    log.debug("%s", output)
    if done.returncode != 0:
        tail = "\n".join(output.splitlines()[-_TAIL_LINES:])
        raise error(f"{what} failed (exit {done.returncode}): {shown}\n{tail}", hint)
    return output


def start(cmd: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start ``cmd`` in the background with its output in ``log_path`` (for parallel builds)."""
    shown = redact(shlex.join(str(c) for c in cmd))
    log.info("$ %s  > %s", shown, log_path)
    with log_path.open("w") as handle:
        return subprocess.Popen([str(c) for c in cmd], stdout=handle, stderr=subprocess.STDOUT)
