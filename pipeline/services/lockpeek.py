"""Whether another process holds a lock file, found without taking the lock or making anything.

Builds peek before the doctor and export, so those minutes are not spent on a build that cannot
take its folders; the locks themselves are taken later, by outdir.claim_output_dir and
layout.hold_work_dir (both flock, so a shared lock tried here conflicts with theirs)."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path


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
