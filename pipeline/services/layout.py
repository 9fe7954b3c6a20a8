"""The build folder (``--build-dir``, default ``build/``): the only place its layout is spelled.

build/
  cache/                       finished builds and compiled models, by content key (cache.py)
  logs/                        one log per spec of a parallel build (parallel.py)
  <model>/<version>/
    trace/                     the compile's TORCH_TRACE
    <target>/                  one target's work folder: generated sources, candidates, the wheel
    .<target>.lock             held while a build uses that work folder
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import OutputDirError
from .locks import holder
from .writable import check_private


def written_trace() -> str | None:
    """The compile trace's folder (TORCH_TRACE, set by the build command) where this build wrote
    one, else None: a build reused whole from the build cache traces nothing, and its report named
    a folder that was not there (H42)."""
    folder = os.environ.get("TORCH_TRACE", "")
    return folder if folder and Path(folder).is_dir() else None


@dataclass(frozen=True)
class WorkLayout:
    build_dir: Path

    @property
    def cache_dir(self) -> Path:
        return self.build_dir / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.build_dir / "logs"

    def model_dir(self, name: str, version: str) -> Path:
        """Per version: builds of several versions of one model run at once without sharing files."""
        return self.build_dir / name / version

    def trace_dir(self, name: str, version: str) -> Path:
        return self.model_dir(name, version) / "trace"

    def work_dir(self, name: str, version: str, target: str) -> Path:
        return self.model_dir(name, version) / target

    @staticmethod
    def work_lock(work_dir: Path) -> Path:
        return work_dir.parent / f".{work_dir.name}.lock"


def _work_dir_held(work_dir: Path) -> OutputDirError:
    lock_file = WorkLayout.work_lock(work_dir)
    return OutputDirError(
        f"{holder(lock_file)} is using the work folder {work_dir}; its lock is {lock_file}",
        "wait for it to finish, or give this build its own --build-dir",
    )


@contextmanager
def hold_work_dir(work_dir: Path) -> Iterator[Path]:
    """Builds into other roots but the same --build-dir would share ``work_dir``: one at a time."""
    work_dir.mkdir(parents=True, exist_ok=True)
    check_private(work_dir, "--build-dir's work folder")  # the wheel is put together here
    lock = FileLock(str(WorkLayout.work_lock(work_dir)), blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise _work_dir_held(work_dir) from None
    # the holder a refused build names; never through a link (the lock file is ours once locked)
    pid_file = os.open(lock.lock_file, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(pid_file, 0)
        os.write(pid_file, f"{os.getpid()}\n".encode())
    finally:
        os.close(pid_file)
    try:
        yield work_dir
    finally:
        lock.release()
