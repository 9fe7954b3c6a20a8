"""The /opt symlink: ``<root>/<model>/<version>/<target>`` -> this package's artifacts folder.

Created or repaired under a file lock, so processes starting at once all succeed. The link is
swapped in with an atomic rename: a reader never sees a missing or half-made link.
``pip uninstall`` cannot remove the link (pip knows only the package's own files), so a load
also removes the dangling links that other versions of the same package left under the root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ._deps import require
from ._trust import FILE_MODE, UntrustedPath, check_chain, make_folders

if TYPE_CHECKING:  # filelock is imported where a link is made (a CPU wheel makes none)
    from filelock import FileLock

LOCK_TIMEOUT_S = 60


def _lock(link: Path) -> FileLock:
    """The file lock beside ``link``. filelock is imported here, not with the package: a CPU wheel
    makes no link, so `import model_x` works in an install without it (pip --no-deps)."""
    filelock = require("filelock", "filelock", "the /opt link (a CUDA wheel's load, `model-x link`)")
    lock: FileLock = filelock.FileLock(str(link.parent / f".{link.name}.lock"), timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)
    return lock


def points_to(link: Path, target: Path) -> bool:
    try:
        return link.is_symlink() and link.resolve(strict=True) == target.resolve(strict=True)
    except OSError:
        return False


def ensure_link(link: Path, target: Path) -> tuple[bool, str]:
    """Make ``link`` point at ``target``. Returns (ok, what happened or why it could not).
    Raises UntrustedPath, before the link is followed or anything is made beside it, where a
    folder above it is another user's."""
    check_chain(link.parent)
    if points_to(link, target):
        return True, f"{link} -> {target} (already in place)"
    try:
        make_folders(link.parent)
        check_chain(link.parent)  # a folder another user made between the check above and ours is theirs
        with _lock(link):
            if points_to(link, target):
                return True, f"{link} -> {target} (made by another process)"
            if link.exists() and not link.is_symlink():
                return False, f"{link} exists and is not a symlink (a build in progress, or files not ours)"
            action = "repaired" if link.is_symlink() else "created"
            staged = link.parent / f".{link.name}.tmp-{os.getpid()}"
            staged.unlink(missing_ok=True)
            os.symlink(target, staged, target_is_directory=True)
            os.replace(staged, link)
            return True, f"{link} -> {target} ({action})"
    except TimeoutError:  # filelock's Timeout
        return False, f"timed out after {LOCK_TIMEOUT_S}s waiting for the lock beside {link}"
    except UntrustedPath:
        raise
    except OSError as exc:
        return False, f"cannot write {link}: {exc.strerror or exc}"


def _made_for(link: Path, package: str) -> bool:
    """Whether ``link`` is one this runtime makes for ``package`` (-> .../<package>/artifacts)."""
    try:
        target = Path(os.readlink(link))
    except OSError:
        return False
    return target.name == "artifacts" and target.parent.name == package


def sweep_dangling(model_dir: Path, package: str) -> list[Path]:
    """Remove ``<model_dir>/<version>/<target>`` links to an uninstalled copy of ``package``.

    Only dangling links this runtime made are touched (a folder, or a link made by anyone else,
    is left as it is); each is checked again under the lock ensure_link() takes. Returns the
    links removed; a root this process cannot write is left as it is."""
    removed: list[Path] = []
    try:
        candidates = [link for link in model_dir.glob("*/*") if link.is_symlink() and not link.exists()]
    except OSError:
        return removed
    for link in candidates:
        if not _made_for(link, package):
            continue
        try:
            with _lock(link):
                if link.is_symlink() and not link.exists():  # not re-made by a reinstall meanwhile
                    link.unlink()
                    removed.append(link)
        except OSError:  # filelock's Timeout is one too
            continue
    return removed
