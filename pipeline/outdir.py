"""The versioned output folder under the artifact root, held for the length of one build.

AOTInductor must compile at the absolute path the artifacts will be reached by (CUDA kernels are
referenced by that path), so compile writes straight to ``<root>/<model>/<version>/<target>``.
The wheel carries copies; at install, the runtime makes that path a symlink to them. So a build
leaves the path exactly as it found it, on success and on failure alike: it moves an existing
link aside, compiles and packages, then removes its folder and puts the link back.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import OutputDirError

MARKER = ".modelwheel-build"


def output_path(root: Path, name: str, version: str, target: str) -> Path:
    return root / name / version / target


def _make_parents(path: Path) -> list[Path]:
    """Create the missing parents of ``path``; return those created, deepest first."""
    created = []
    for parent in reversed(path.parents):
        if not parent.exists():
            parent.mkdir()
            created.append(parent)
    return created[::-1]


def _remove_stale(path: Path) -> None:
    if path.is_symlink() or not path.exists():
        return
    if not (path / MARKER).exists():
        raise OutputDirError(
            f"{path} exists and was not made by a build",
            "move it away, or build into another root with --root DIR or MODELWHEEL_ROOT",
        )
    shutil.rmtree(path)  # left by a build that was killed outright (SIGKILL, power loss)


def _restore_displaced(path: Path) -> None:
    """Put back a link that a build moved aside and never restored (killed, or stopped inside its
    cleanup). Called with the lock held, so no build is using any of them: the one moved aside
    last goes back when nothing is at ``path``; the others are older copies and are removed."""
    leftovers = [p for p in path.parent.glob(f".{path.name}.displaced-*") if p.is_symlink()]
    for leftover in sorted(leftovers, key=lambda p: p.lstat().st_ctime_ns, reverse=True):
        if path.is_symlink() or path.exists():
            leftover.unlink()
        else:
            leftover.rename(path)


@contextmanager
def claim_output_dir(path: Path) -> Iterator[Path]:
    """Yield an empty ``path`` to compile into; restore what was there before on exit."""
    try:
        created = _make_parents(path)
    except OSError as exc:
        raise OutputDirError(
            f"cannot create {path.parent}: {exc.strerror}",
            "choose a writable artifact root with --root DIR or the MODELWHEEL_ROOT environment variable",
        ) from exc
    lock = FileLock(str(path.parent / f".{path.name}.build.lock"), blocking=False)
    displaced = path.parent / f".{path.name}.displaced-{os.getpid()}"
    made = False
    try:
        try:
            lock.acquire()
        except Timeout:
            raise OutputDirError(f"another build is writing {path}", "wait for it to finish") from None
        _remove_stale(path)
        _restore_displaced(path)
        if path.is_symlink():
            path.rename(displaced)
        path.mkdir()
        made = True
        (path / MARKER).write_text("this folder is removed when its build ends\n")
        yield path
    finally:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        if displaced.is_symlink():
            try:
                displaced.rename(path)
            except OSError:
                pass  # the folder could not be removed: the next build removes it and puts the link back
        if lock.is_locked:
            Path(lock.lock_file).unlink(missing_ok=True)
            lock.release()
        for parent in created:
            try:
                parent.rmdir()
            except OSError:
                break
