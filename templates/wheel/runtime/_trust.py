"""Never trust a folder another local user controls, as ssh's StrictModes does.

A folder on the way to the compiled model (the artifact root, its model and version folders,
and every folder above them) decides what a process opens: whoever can write it can swap the
model for their own code. Each existing one, a symlink's target included, must be owned by this
user or root, and writable by no one else unless its sticky bit is set (as /tmp's is). Stat
calls only: about 10 microseconds a folder. Shared, like _inputs.py, by the build (before it
writes under --root) and the wheel (before it makes or follows its /opt link). Imports nothing heavy.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

# Folders made by the build and the runtime get these modes, whatever the process's umask.
FOLDER_MODE = 0o755
FILE_MODE = 0o644


class UntrustedPath(PermissionError):
    """A folder on the way to the model can be changed by another user; nothing was opened or written."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def problem(path: Path) -> str | None:
    """Why another user could change what ``path`` (an existing folder, or a link to one) holds, or None."""
    try:
        info = os.stat(path)  # a symlink's target: the folder that would really be used
    except OSError:
        return None  # gone: whoever makes it next is checked then
    trusted = {0, os.geteuid()}
    via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    if info.st_uid not in trusted:
        return f"{path}{via} is owned by {_owner(info.st_uid)}, not by this user or root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        who = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
        return f"{path}{via} can be written by {who} (mode {stat.S_IMODE(info.st_mode):o}, no sticky bit)"
    return None


def check_chain(folder: Path) -> None:
    """Raise UntrustedPath naming the first folder from / down to ``folder`` another user controls."""
    folder = Path(os.path.abspath(folder))
    for path in [*reversed(folder.parents), folder]:
        found = problem(path)
        if found:
            raise UntrustedPath(
                f"{found}: another user could put their own code where the model is loaded from; refused")
