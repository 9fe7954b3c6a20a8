"""Never trust a folder another local user controls, as ssh's StrictModes does.

A folder on the way to the compiled model (the artifact root, its model and version folders,
and every folder above them) decides what a process opens: whoever can write it can swap the
model for their own code. Each existing one, a symlink's target included, must be owned by this
user or root, and writable by no one else unless its sticky bit is set (as /tmp's is); for a
symlink, so is every folder on the way to its target (ssh checks the real path the same way), and
the link itself is this user's or root's: in a sticky folder its owner can replace it at any time
(a link to /tmp passes every other check). A folder whose files are loaded (a cache, a build or
output folder) is checked ``private``: writable by no one else even with the sticky bit, since
whatever another user adds to it is theirs.
Stat calls only: about 6 microseconds a folder. Shared, like _inputs.py, by the build (before it
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


def make_folders(folder: Path) -> list[Path]:
    """``folder`` and its missing parents, each FOLDER_MODE whatever the umask (under umask 000
    they were left writable by everyone, who could then swap what is loaded). One that another
    process makes meanwhile is left as it is and not counted: the caller checks the chain again
    (check_chain) to know whose it is. Returns the folders made here, deepest first."""
    made = []
    for path in [p for p in [*reversed(folder.parents), folder] if not p.exists()]:
        try:
            path.mkdir()
        except FileExistsError:
            continue
        os.chmod(path, FOLDER_MODE)
        made.append(path)
    return made[::-1]


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
    via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return _judged(f"{path}{via}", info)


def _judged(named: str, info: os.stat_result) -> str | None:
    if info.st_uid not in {0, os.geteuid()}:
        return f"{named} is owned by {_owner(info.st_uid)}, not by this user or root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        who = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
        return f"{named} can be written by {who} (mode {stat.S_IMODE(info.st_mode):o}, no sticky bit)"
    return None


# As the kernel's own limit on symlinks followed in one lookup (ELOOP).
_MAX_LINKS = 40


def chain_problem(folder: Path | str, private: bool = False, _links: int = 0) -> str | None:
    """Why another user controls a folder the kernel passes through to reach ``folder``, or None:
    each folder from / down; a symlink is checked as the folder it leads to (named by the link),
    and then so is every folder on the way to its target (whoever can write a folder above the
    target can rename it away and put their own in its place). One lstat a folder; a symlink
    costs a stat and a readlink more. A missing folder ends the check: whoever makes it is
    checked then. ``private``: ``folder`` itself must be writable by no one else, sticky or not."""
    current = "/"
    found = _judged(current, os.stat(current))
    for part in str(folder).split("/"):
        if found:
            return found
        if part in ("", "."):
            continue
        if part == "..":  # ``current`` is a real path (no symlink in it): its parent is plain
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except OSError:
            return None
        if not stat.S_ISLNK(info.st_mode):
            found, current = _judged(candidate, info), candidate
            continue
        if _links >= _MAX_LINKS:
            return None  # the kernel refuses the lookup (ELOOP): nothing is reached through it
        if info.st_uid not in {0, os.geteuid()}:
            return (
                f"{candidate} is a symlink owned by {_owner(info.st_uid)}, not by this user or root, "
                "who can point it elsewhere at any time"
            )
        found = problem(Path(candidate))
        beyond = found or chain_problem(os.path.join(current, os.readlink(candidate)), False, _links + 1)
        if beyond and not found:
            found = f"{beyond} (on the way to {candidate}'s target)"
        current = os.path.realpath(candidate)
    return found or (_shared_problem(folder, current) if private else None)


def _shared_problem(named: Path | str, real: str) -> str | None:
    """Why files another user adds to the folder ``real`` (``named`` as given) would be among its own."""
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return None
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    who = "everyone" if mode & stat.S_IWOTH else "its group"
    via = f" ({real})" if os.path.abspath(named) != real else ""
    return (
        f"{named}{via} can be written by {who} (mode {stat.S_IMODE(mode):o}): files another user adds to it "
        "would be used as this user's own"
    )


def check_chain(folder: Path, private: bool = False) -> None:
    """Raise UntrustedPath naming the first folder down to ``folder`` another user controls."""
    found = chain_problem(os.path.abspath(folder), private)
    if found:
        raise UntrustedPath(f"{found}: another user could put their own code where the model is loaded from; refused")
