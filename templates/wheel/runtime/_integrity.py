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
from pathlib import Path
from typing import Any


class IntegrityError(RuntimeError):
    """An artifact differs from what the manifest recorded at build time."""


def _stamp_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modelwheel" / "verified"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path, stat: os.stat_result, expected: str) -> Path:
    key = f"{path.resolve()}|{stat.st_dev}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{expected}"
    return _stamp_dir() / hashlib.sha256(key.encode()).hexdigest()


def _stamped(stamp: Path) -> bool:
    try:
        return stamp.exists()
    except OSError:  # a cache this user may not read (HOME of another user): hash again
        return False


def weights_record(manifest: dict[str, Any]) -> dict[str, Any]:
    """The external weights file's sha256 and size (the manifest keeps them as weights.file_sha256, .size)."""
    return {"sha256": manifest["weights"]["file_sha256"], "size": manifest["weights"]["size"]}


def packaged_files(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file the manifest records a sha256 and size for, by its path inside the package."""
    files = {f"artifacts/{name}": record for name, record in manifest["artifacts"].items()}
    files[manifest["golden"]["file"]] = manifest["golden"]
    files.update(manifest.get("constants", {}))  # static batch sizes' shared constants store
    if manifest.get("weights", {}).get("external"):
        files[manifest["weights"]["file"]] = weights_record(manifest)
    return files


def check_artifacts(directory: Path, manifest: dict[str, Any], *, full: bool = False) -> None:
    """check_files() on the compiled artifacts (the .so, kernels) in ``directory``."""
    check_files(directory, manifest["artifacts"], full=full)


def check_files(directory: Path, records: dict[str, dict[str, Any]], *, full: bool = False) -> None:
    """Raise IntegrityError naming the first file that is missing, resized or altered."""
    for name, record in sorted(records.items()):
        path = directory / name
        try:
            stat = path.stat()
        except OSError as exc:
            raise IntegrityError(f"artifact {path} is missing ({exc.strerror}): reinstall the wheel") from None
        if stat.st_size != record["size"]:
            raise IntegrityError(
                f"artifact {path} is {stat.st_size} bytes, the manifest says {record['size']}: "
                "the file was truncated or replaced; reinstall the wheel (pip install --force-reinstall)"
            )
        stamp = _stamp(path, stat, record["sha256"])
        if not full and _stamped(stamp):
            continue
        actual = sha256_file(path)
        if actual != record["sha256"]:
            raise IntegrityError(
                f"artifact {path} has sha256 {actual}, the manifest says {record['sha256']}: "
                "the file was altered; reinstall the wheel (pip install --force-reinstall)"
            )
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:
            pass  # no writable cache: the next load hashes again, which is slower but still safe
