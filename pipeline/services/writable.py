"""The folders a build writes (--dist, --build-dir): checked before any work, and a write that
fails later (a full disk) turned into one clear error naming the file and the fix."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..errors import OutputDirError
from ..wheel_template.runtime import _trust as wheel_trust

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink() and path != path.parent:
        path = path.parent
    return path


def check_writable(path: Path, flag: str) -> None:
    """``path`` is a folder this process can write a byte in, or one it can make: refused before
    anything is built otherwise (a file in the way, a read-only or full disk, no permission)."""
    existing = _nearest_existing(path.absolute())
    hint = f"give {flag} a folder this user can write, on a disk with free space"
    if not existing.is_dir():
        what = "is a file" if existing == path.absolute() else f"cannot be made: {existing} is a file"
        raise OutputDirError(f"{flag} {path} {what}, not a folder", hint)
    try:  # one real byte: an empty file can still be made on a full disk
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".modelwheel-probe-")
        try:
            os.write(handle, b"\0")
            os.fsync(handle)
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as exc:
        where = "" if existing == path.absolute() else f" (it would be made in {existing})"
        raise OutputDirError(f"{flag} {path}: cannot write there{where}: {exc.strerror}", hint) from exc


def check_private(path: Path, flag: str) -> None:
    """``path`` (where it exists yet) and every folder above it are this user's or root's, and
    no one else can write ``path`` itself: the build reuses the compiled models its build cache
    holds and ships the wheels it leaves in dist/, so whoever can write those folders can put
    their own code into this user's wheels. Checked before any work, and again right before the
    folder is used (one another user makes in between is theirs)."""
    found = wheel_trust.chain_problem(path.absolute(), private=True)
    if found:
        raise OutputDirError(
            f"{flag}: {found}; another user could put their own code into this build's wheels; refused",
            f"give {flag} a folder only you (or root) can write, or remove the folder named",
        )


def write_error(exc: OSError) -> OutputDirError:
    """A failed write, as the build reports it: the file, the reason, and what to do."""
    target = exc.filename2 or exc.filename  # shutil.copyfile names the source first
    what = f"cannot write {target}" if target else "cannot write a file of the build"
    folder = Path(target).parent if target else Path("<--build-dir, --dist or --root>")
    if exc.errno in NO_ROOM:
        hint = (
            f"free space on the disk holding {folder} (df -h {folder}), or give --build-dir, --dist or --root "
            f"on another disk; the build left no half-written file in dist/ or the build cache"
        )
    elif exc.errno in NOT_ALLOWED:
        hint = "give --build-dir, --dist or --root a folder this user can write"
    else:
        hint = f"check {folder}, or give --build-dir, --dist or --root another folder"
    return OutputDirError(f"{what}: {exc.strerror or exc}", hint)


NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device", as compilers print it


def disk_full(output: str) -> OutputDirError | None:
    """A compiler's output that ran out of disk (g++: "error writing to /tmp/cc….s: No space left
    on device"), as the build's full-disk error; None for any other failure. Candidates dropped as
    "C++ compile error" on a full disk read as faults of those options."""
    if NO_SPACE not in output:
        return None
    written = re.search(rf"(/[^\s:]+): {NO_SPACE}", output)
    return write_error(OSError(errno.ENOSPC, NO_SPACE, written.group(1) if written else None))


def removed_meanwhile(folder: Path, failed: str = "its compile failed") -> OutputDirError | None:
    """``folder``, made by this build, as removed while it ran (by another process), or None where
    it is there; ``failed``: what failed for want of it. H61: another user's `rm -rf` of the shared
    root dropped two candidates as "C++ compile error", then failed 4 minutes later with "No such
    file or directory"; H63's, of a tiny model's, named the build's own `.cpu.removing-N`."""
    if folder.is_dir():
        return None
    gone = folder
    while not gone.parent.exists() and gone.parent != gone:  # the highest folder removed
        gone = gone.parent
    return OutputDirError(
        f"{gone} was removed while this build used it (by another process?): {failed} for want of {folder}",
        "build again; where others use the same root, build into one of your own: --root DIR (or MODELWHEEL_ROOT=DIR)",
    )


def made_folders(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents (0755, whatever the umask); return those created,
    deepest first."""
    created = []
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            folder.mkdir()
            os.chmod(folder, 0o755)
            created.append(folder)
    return created[::-1]


def remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def sweep_partials(folder: Path) -> None:
    """Remove ``.<name>.partial-<pid>`` files and folders whose build is no longer running (one
    killed outright while writing): they block nothing, but they hold disk space."""
    for partial in folder.glob(".*.partial-*"):
        pid = partial.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running: its own to finish or remove
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's running process
        if partial.is_dir() and not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
