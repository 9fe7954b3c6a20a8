"""The one way the pipeline runs a subprocess: log the command, capture output, show it on failure."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import PipelineError

log = logging.getLogger("pipeline.services.proc")

_TAIL_LINES = 40
# Environment variables that may carry credentials: a URL's userinfo, or a password-like value.
CREDENTIAL_ENV_PREFIXES = ("TWINE_", "MODELWHEEL_INDEX_", "MODELWHEEL_SIMPLE_")
_SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|KEY", re.I)
# Shorter values would turn ordinary words into ***; a two-character password protects nothing anyway.
_MIN_SECRET = 3
# A URL in text from no known source: everything from :// to the last @ before the path.
_USERINFO = re.compile(r"(?<=://)[^\s/?#]*@")
_registered: set[str] = set()


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without userinfo, the raw userinfo or None). The userinfo is everything between ://
    and the URL's last @, so a password may hold / @ : # and spaces as typed. It is returned as
    typed: index_client.Credentials.from_userinfo percent-decodes it, once (the one rule, in one place)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url, None
    userinfo, _, location = rest.rpartition("@")
    return f"{scheme}://{location}", userinfo


def _forms(value: str) -> set[str]:
    """A secret as typed, percent-decoded and percent-encoded: any of them may be printed."""
    forms = {value, urllib.parse.unquote(value), urllib.parse.quote(value, safe=""), urllib.parse.quote(value)}
    return {form for form in forms if len(form) >= _MIN_SECRET}


def _userinfo_secrets(userinfo: str) -> set[str]:
    _user, _, password = userinfo.partition(":")
    return _forms(userinfo) | _forms(password)


def add_secret(value: str) -> None:
    """Redact ``value`` from everything this process prints from now on (credentials not in the environment)."""
    _registered.update(_forms(value))


def add_url_secrets(url: str) -> None:
    _, userinfo = split_userinfo(url)
    if userinfo:
        _registered.update(_userinfo_secrets(userinfo))


def _secrets() -> list[str]:
    found = set(_registered)
    for name, value in os.environ.items():
        if not value or not name.startswith(CREDENTIAL_ENV_PREFIXES):
            continue
        _, userinfo = split_userinfo(value)
        if userinfo:
            found |= _userinfo_secrets(userinfo)
        elif _SECRET_NAME.search(name):
            found |= _forms(value)
    return sorted(found, key=len, reverse=True)  # a secret holding another goes first


def redact(text: str) -> str:
    """Credentials never reach output, logs or reports: the values of every credential source
    (URLs' userinfo, TWINE_* and MODELWHEEL_INDEX_* passwords) and any URL userinfo become ***."""
    for secret in _secrets():
        text = text.replace(secret, "***")
    return _USERINFO.sub("***@", text)


class RedactingFilter(logging.Filter):
    """Applies redact() to every log record a handler writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        return True


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
