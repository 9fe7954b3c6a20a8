"""A build's lock files, read by other builds: whether one is held, and by whom.

A build peeks at its output folder's lock before the doctor and export, so those minutes are not
spent on a build that cannot claim it (outdir.claim_output_dir takes it later; both flock, so a
shared lock tried here conflicts with it). A refused build names the holder, whose pid the lock
file records (outdir.claim_output_dir and layout.hold_work_dir write it once they hold the lock).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
from pathlib import Path

from .wording import duration


def held_elsewhere(lock_file: Path) -> bool:
    """True where the lock file exists and another holder has it locked. A shared lock is tried and
    dropped at once; a missing, unreadable or odd lock file is "not held": the real lock decides."""
    try:  # non-blocking and no links: the folder may be anyone's until the real lock's checks run
        fd = os.open(lock_file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def recorded_pid(path: Path) -> str:
    """The pid a lock or marker file records ('' when none)."""
    try:
        found = re.search(r"(\d+)\s*$", path.read_text())
    except (OSError, UnicodeDecodeError):
        return ""
    return found.group(1) if found else ""


def command_of(pid: str) -> str:
    """The command line of a running process, from /proc ('' where unreadable: gone, another OS)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    # one line, and no control characters (another user's process may name anything)
    command = " ".join(" ".join(word.decode(errors="replace").split()) for word in words if word)
    command = "".join(c if c.isprintable() else "?" for c in command)
    return command if len(command) <= 160 else command[:157] + "..."


def holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, for a refusal: ``another build (pid 123: <command>, for 2m10s)``."""
    pid = recorded_pid(lock_file)
    if not pid:
        return "another build"
    command = command_of(pid)
    try:
        held = f", for {duration(time.time() - lock_file.stat().st_mtime)}"
    except OSError:
        held = ""
    return f"another build (pid {pid}{f': {command}' if command else ''}{held})"
