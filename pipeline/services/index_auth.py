"""Who may upload to the local index: its owner, by a password only they can read.

`index start` (and `index serve`) makes ``<state folder>/upload.secret`` once, 0600, in a folder
only this user can write: a random password. The index asks for it on every upload (pypiserver's
"update" action); pages and files are read without one, as pip reads them. ``publish`` sends it
only to an index of this user's on 127.0.0.1: the one the folder's state file names, or, for a
``--index http://127.0.0.1:PORT/...`` from any folder, the process the kernel says holds the
listening socket on that port (/proc/net/tcp gives the socket's owner and inode, /proc/<pid>/fd
the process holding it), when it is this user's ``modelwheel index serve``. A server another
user started on that port never gets the password.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import sys
from pathlib import Path

from ..errors import IndexServerError
from ..wheel_template.runtime import _trust as wheel_trust
from . import proc

USERNAME = "modelwheel"
SECRET_NAME = "upload.secret"
SERVE_COMMAND = [b"-m", b"pipeline", b"index", b"serve"]
LISTEN = "0A"  # a socket's state in /proc/net/tcp


def check_state_dir(state_dir: Path) -> None:
    """The state folder holds the password: this user's, in a chain no one else can write."""
    found = wheel_trust.chain_problem(state_dir.absolute(), private=True)
    if found:
        raise IndexServerError(
            f"{found}: the local index keeps its upload password there; refused",
            f"start the index from a folder only you can write, or remove {state_dir.absolute()}",
        )


def ensure_secret(state_dir: Path) -> str:
    """The index's upload password, made (0600, never over an existing file or link) when missing."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_state_dir(state_dir)
    try:
        handle = os.open(state_dir / SECRET_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read_secret(state_dir)
    with os.fdopen(handle, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return read_secret(state_dir)


def read_secret(state_dir: Path) -> str:
    """The password, from a plain file of this user's that no one else can read or write."""
    path = state_dir / SECRET_NAME
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise IndexServerError(
            f"cannot read the local index's upload password {path}: {exc.strerror}",
            "stop the index and start it again (`modelwheel index stop`, then `index start`)",
        ) from None
    with os.fdopen(handle) as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise IndexServerError(
                f"{path} is not a file of this user's that only they can read "
                f"(mode {stat.S_IMODE(info.st_mode):o}): refused as the index's upload password",
                "remove it, then `modelwheel index start` makes a new one",
            )
        value = source.read().strip()
    proc.add_secret(value)
    return value


def _loopback_hex(port: int) -> str:
    """127.0.0.1:port as /proc/net/tcp writes it (the address's bytes read as a native integer)."""
    return f"{int.from_bytes(socket.inet_aton('127.0.0.1'), sys.byteorder):08X}:{port:04X}"


def _own_listener(port: int) -> str | None:
    """The inode of the socket of this user's listening on 127.0.0.1:port, or None."""
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    wanted = _loopback_hex(port)
    for row in rows:
        fields = row.split()
        if len(fields) > 9 and fields[1] == wanted and fields[3] == LISTEN and int(fields[7]) == os.geteuid():
            return fields[9]
    return None


def index_on_port(port: int) -> Path | None:
    """The state folder of this user's ``index serve`` that listens on 127.0.0.1:port, or None."""
    inode = _own_listener(port)
    if inode is None:
        return None
    holder = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.geteuid():
                continue
            command = (entry / "cmdline").read_bytes().split(b"\0")
            if command[1:5] != SERVE_COMMAND or b"--state-dir" not in command:
                continue
            if any(os.readlink(fd) == holder for fd in (entry / "fd").iterdir()):
                return Path(os.fsdecode(command[command.index(b"--state-dir") + 1]))
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return None
