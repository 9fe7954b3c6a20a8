"""Artifact integrity: every file must match the sha256 and size in the manifest.

Hashing a large .so costs tens of milliseconds, so a full check runs once per installed file
state: a stamp in the user's cache records (path, device, inode, size, mtime, ctime, expected
hash) once verified, and later loads only stat the files. The ctime is what makes this safe:
the kernel sets it on every write, rename or utime, and no user call can set it back, so a
file changed in place with its mtime put back (`touch -r`, `cp -p`, rsync, tar) is hashed again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from stat import S_ISDIR
from typing import Any

from ._trust import chain_problem


class IntegrityError(RuntimeError):
    """An artifact differs from what the manifest recorded at build time."""


def _stamp_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modelwheel" / "verified"


def sha256_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_fd(fd: int) -> str:
    """The sha256 of what ``fd`` holds, read from its start; it is left at its start again."""
    os.lseek(fd, 0, os.SEEK_SET)
    digest = hashlib.sha256()
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(block)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest()


def _stamp(path: Path, stat: os.stat_result, expected: str) -> Path:
    key = (
        f"{path.resolve()}|{stat.st_dev}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{expected}"
    )
    return _stamp_dir() / hashlib.sha256(key.encode()).hexdigest()


def _own_cache(folder: Path) -> bool:
    """``folder`` (where it exists) is a real folder of this user's that no one else can write, in
    a chain of folders no one else controls: the build's check (_trust.chain_problem), and no
    symlink at the end. Where the cache path is shared ($XDG_CACHE_HOME in a common folder),
    another user could otherwise plant a link or a folder there and have this user chmod and
    write into a folder of their choosing, or read and plant stamps."""
    if chain_problem(folder, private=True):
        return False
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return True
    return S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def _stamped(stamp: Path) -> bool:
    """A stamp counts only in a folder no one else can write: one who could would plant stamps
    that skip the hash of a file they altered."""
    try:
        return _own_cache(stamp.parent) and stamp.parent.is_dir() and stamp.exists()
    except OSError:  # one this user may not read (HOME of another user): hash again
        return False


def _write_stamp(stamp: Path) -> None:
    """Checked before any change (mkdir, chmod, the stamp), and again after mkdir: a folder
    another user owns or links is never touched, and the next load hashes again."""
    try:
        if not _own_cache(stamp.parent):
            return
        stamp.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _own_cache(stamp.parent):
            return
        os.chmod(stamp.parent, 0o700)  # mkdir's mode is cut by the umask, never widened; make it exact
        stamp.touch(mode=0o600)
    except OSError:
        pass  # no writable cache: the next load hashes again, which is slower but still safe


def weights_record(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The external weights file's sha256 and size (the manifest keeps them as weights.file_sha256, .size)."""
    return {"sha256": manifest["weights"]["file_sha256"], "size": manifest["weights"]["size"]}


def packaged_files(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file the manifest records a sha256 and size for, by its path inside the package."""
    files = {f"artifacts/{name}": record for name, record in manifest["artifacts"].items()}
    files[manifest["golden"]["file"]] = manifest["golden"]
    files.update(manifest.get("constants", {}))  # static batch sizes' shared constants store
    if manifest.get("weights", {}).get("external"):
        files[manifest["weights"]["file"]] = weights_record(manifest)
    return files


def check_artifacts(
    directory: Path, manifest: Mapping[str, Any], *, full: bool = False, skip: Iterable[str] = ()
) -> None:
    """check_files() on the compiled artifacts (the .so, kernels) in ``directory``; ``skip``: the
    ones the caller checks as it opens them (opened_verified), which would be hashed twice."""
    left_out = set(skip)
    check_files(directory, {name: r for name, r in manifest["artifacts"].items() if name not in left_out}, full=full)


def check_files(directory: Path, records: Mapping[str, Mapping[str, Any]], *, full: bool = False) -> None:
    """Raise IntegrityError naming the first file that is missing, resized or altered."""
    for name, record in sorted(records.items()):
        with opened_verified(directory / name, record, full=full):
            pass


# Descriptors of loaded libraries, open for the life of the process: dlopen() knows a library by
# its name first, so a /proc/self/fd/N reused by another file would be handed the first library.
# One per file state (device, inode, size, mtime, ctime), not one per load: a process that loads
# and closes a model 100,000 times keeps one descriptor, not 100,000 (it ran out at ~1,000).
_HELD: dict[tuple[int, ...], int] = {}


def hold(fd: int) -> str:
    """The name a library is loaded by: ``/proc/self/fd/N`` of a descriptor held open for the life
    of the process, so N is never reused and the name never means another file. When a held
    descriptor already has the same file in the same state (the kernel changes the ctime on every
    write or rename, and nothing can set it back), ``fd`` is closed and that one's name is given:
    the same bytes, under a name that still means them."""
    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    held = _HELD.get(key)
    if held is not None and held != fd:
        os.close(fd)
        return f"/proc/self/fd/{held}"
    _HELD[key] = fd
    return f"/proc/self/fd/{fd}"


@contextmanager
def opened_verified(
    path: Path, record: Mapping[str, Any], *, full: bool = False, hold_open: bool = False
) -> Iterator[str]:
    """``path`` opened once, checked against ``record`` through that descriptor, and yielded as
    ``/proc/self/fd/N`` for the caller to load: what is loaded is what was checked, whatever
    replaces ``path`` in the meantime (a swapped link, a renamed file). ``hold_open``: for a
    library to dlopen, the descriptor stays open (see hold())."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IntegrityError(f"artifact {path} is missing ({exc.strerror}): reinstall the wheel") from None
    try:
        _check_descriptor(path, fd, record, full)
    except BaseException:
        os.close(fd)
        raise
    if hold_open:
        yield hold(fd)  # held from here, whatever the caller does: its number is never reused
        return
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _check_descriptor(path: Path, fd: int, record: Mapping[str, Any], full: bool) -> None:
    stat = os.fstat(fd)
    if stat.st_size != record["size"]:
        raise IntegrityError(
            f"artifact {path} is {stat.st_size} bytes, the manifest says {record['size']}: "
            "the file was truncated or replaced; reinstall the wheel (pip install --force-reinstall)"
        )
    stamp = _stamp(path, stat, record["sha256"])
    if not full and _stamped(stamp):
        return
    actual = sha256_fd(fd)
    if actual != record["sha256"]:
        raise IntegrityError(
            f"artifact {path} has sha256 {actual}, the manifest says {record['sha256']}: "
            "the file was altered; reinstall the wheel (pip install --force-reinstall)"
        )
    _write_stamp(stamp)
