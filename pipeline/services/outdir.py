"""The versioned output folder under the artifact root, held for the length of one build.

AOTInductor must compile at the absolute path the artifacts will be reached by (CUDA kernels are
referenced by that path), so compile writes straight to ``<root>/<model>/<version>/<target>``.
The wheel carries copies; at install, the runtime makes that path a symlink to them. So a build
leaves the path exactly as it found it, on success and on failure alike: it moves an existing
link aside, compiles and packages, then removes its folder and puts the link back.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import OutputDirError
from ..wheel_template.runtime import _trust as wheel_trust
from .locks import held_elsewhere, holder, recorded_pid
from .progress import say, stop_requested
from .writable import removed_meanwhile

MARKER = ".modelwheel-build"


def output_path(root: Path, name: str, version: str, target: str) -> Path:
    return root / name / version / target


def check_trusted(path: Path) -> None:
    """The folders above ``path`` (the root, model and version folders, and all above them)
    are this user's or root's, and no one else can write them: refused before anything is written."""
    try:
        wheel_trust.check_chain(path.parent)
    except wheel_trust.UntrustedPath as exc:
        raise OutputDirError(
            str(exc),
            "build into a root that only you (or root) can write: --root DIR or "
            "MODELWHEEL_ROOT; remove or fix the folder named",
        ) from None


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache() -> Path:
    """Where torch's Inductor keeps the kernels it compiles and loads again, and the precompiled
    headers every model's C++ includes: $TORCHINDUCTOR_CACHE_DIR, else torch's own default."""
    configured = os.environ.get(INDUCTOR_CACHE_ENV)
    if configured:
        return Path(os.path.abspath(configured))
    try:  # as torch._inductor.runtime.cache_dir_utils.default_cache_dir() names it
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def claim_inductor_cache() -> Path:
    """Inductor's cache folder, made (0755) where missing and refused where another user controls
    it: its default, /tmp/torchinductor_<user>, is a name any local user can take first, and the
    build loads the kernels and compiles in the headers it finds there. Pinned in the environment
    so torch (and every child) uses exactly the folder checked; once this user's or root's, in a
    folder no one else can write, it stays theirs."""
    path = inductor_cache()
    _refuse_untrusted_cache(path)  # before anything is made in a folder of theirs
    try:
        wheel_trust.make_folders(path)
    except OSError as exc:
        raise OutputDirError(
            f"cannot create {exc.filename or path} (torch Inductor's cache): {exc.strerror}",
            f"set {INDUCTOR_CACHE_ENV} to a folder this user can write",
        ) from exc
    _refuse_untrusted_cache(path)  # and one another user made first, between the check and the mkdir
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    return path


def _refuse_untrusted_cache(path: Path) -> None:
    found = wheel_trust.chain_problem(path, private=True)
    if found:
        raise OutputDirError(
            f"{found}: torch Inductor's cache folder, whose kernels the build loads and whose headers it compiles "
            "into the model; another user could put their own code there; refused",
            "remove the folder named (or ask its owner to), "
            f"or set {INDUCTOR_CACHE_ENV} to a folder only you can write",
        )


@contextmanager
def signals_deferred(redeliver: bool = True) -> Iterator[None]:
    """SIGINT/SIGTERM arriving in the block are delivered when it ends, so it runs to the end.

    A terminal's Ctrl-C reaches a parallel build's children twice (from the terminal, then
    forwarded by the parent): the second used to cut their cleanup short. With ``redeliver``
    off, a signal that came is only recorded (``stop_requested``): the block finished the
    work, and the next stage boundary stops the build.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda number, _frame: pending.append(number))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if pending and redeliver:
            signal.raise_signal(pending[0])
        elif pending:
            stop_requested.append(signal.Signals(pending[0]).name)


def _lock_file(path: Path) -> Path:
    return path.parent / f".{path.name}.build.lock"


def _held(path: Path, lock_file: Path) -> OutputDirError:
    """The refusal while another build holds the lock: who holds it, since when, and the ways out."""
    return OutputDirError(
        f"{holder(lock_file)} is writing {path}; its lock is {lock_file}",
        "wait for that build to finish, or build elsewhere now: --root DIR (or MODELWHEEL_ROOT=DIR) "
        "puts this build's output folder under another root",
    )


def refuse_if_held(path: Path) -> None:
    """Refused at once where a running build holds ``path``'s lock, so the doctor and export are not
    spent on a build that cannot claim it. Only a peek: the lock itself is taken by
    ``claim_output_dir``, later."""
    lock_file = _lock_file(path)
    if held_elsewhere(lock_file):
        raise _held(path, lock_file)


def _take_over_stale(path: Path, lock_file: Path) -> bool:
    """With the lock held, what a build that is gone left (killed outright: SIGKILL, power
    loss) is removed, and a link it moved aside is put back, with a line saying so. True where
    such a build had left something."""
    left = sorted(path.parent.glob(f".{path.name}.new-*")) + sorted(path.parent.glob(f".{path.name}.removing-*"))
    displaced = sorted(p for p in path.parent.glob(f".{path.name}.displaced-*") if p.is_symlink())
    pid = recorded_pid(lock_file)
    if path.is_dir() and not path.is_symlink():
        if not (path / MARKER).exists():
            raise OutputDirError(
                f"{path} exists and was not made by a build",
                "move it away, or build into another root with --root DIR or MODELWHEEL_ROOT",
            )
        pid = pid or recorded_pid(path / MARKER)
        left.append(path)
    if left or displaced or pid:
        who = f"build (pid {pid})" if pid and pid != str(os.getpid()) else "build"
        say(
            f"    taking over {path}: a {who} that is no longer running left it locked; removing what it left ("
            # "removing cpu" read to a newcomer as removing a target
            + (", ".join("the folder itself" if p == path else p.name for p in left + displaced) or "its lock")
            + ")"
        )
    for leftover in left:
        shutil.rmtree(leftover)
    for link in displaced:
        if not path.is_symlink() and not path.exists():
            link.rename(path)  # the installed wheel's link, moved aside by the build that is gone
        else:
            link.unlink()
    return bool(left or displaced or pid)


def _make_marked(path: Path) -> None:
    """Made aside and renamed into place: the folder at ``path`` always holds its marker."""
    staging = path.parent / f".{path.name}.new-{os.getpid()}"
    staging.mkdir()
    os.chmod(staging, wheel_trust.FOLDER_MODE)
    (staging / MARKER).write_text(f"this folder is removed when its build ends; made by pid {os.getpid()}\n")
    os.chmod(staging / MARKER, wheel_trust.FILE_MODE)
    staging.rename(path)


def _remove_marked(path: Path) -> None:
    """Renamed aside first: a build killed while removing leaves no half folder at ``path``."""
    removing = path.parent / f".{path.name}.removing-{os.getpid()}"
    path.rename(removing)
    shutil.rmtree(removing, ignore_errors=True)


@contextmanager
def claim_output_dir(path: Path) -> Iterator[Path]:
    """Yield an empty ``path`` to compile into; restore what was there before on exit.

    Setting up and cleaning up run with SIGINT/SIGTERM deferred, so an interrupt never leaves
    half of either; a build killed outright is cleaned up by the next one (``_take_over_stale``).
    """
    lock_file = _lock_file(path)
    lock = FileLock(str(lock_file), blocking=False)
    displaced = path.parent / f".{path.name}.displaced-{os.getpid()}"
    created: list[Path] = []
    made = failing = False
    try:
        with signals_deferred():
            check_trusted(path)
            try:
                created = wheel_trust.make_folders(path.parent)
            except OSError as exc:
                raise OutputDirError(
                    f"cannot create {path.parent}: {exc.strerror}",
                    "choose a writable artifact root with --root DIR or the MODELWHEEL_ROOT environment variable",
                ) from exc
            check_trusted(path)  # a folder another user made between the check above and ours is theirs
            try:
                lock.acquire()
            except Timeout:
                raise _held(path, lock_file) from None
            if _take_over_stale(path, lock_file) and not created:
                # the killed build made the <model>/<version> folders: removed where this build leaves
                # them empty, as it would its own (H46: an empty my_bert/2.0/ stayed under the root)
                created = [path.parent, path.parent.parent]
            lock_file.write_text(f"{os.getpid()}\n")  # emptied by a clean release (unlinked)
            os.chmod(lock_file, wheel_trust.FILE_MODE)
            if path.is_symlink():
                path.rename(displaced)
            _make_marked(path)
            made = True
        yield path
    except BaseException:
        failing = True
        raise
    finally:
        with signals_deferred():
            # removed by another process while the build ran: nothing to remove, and where the build
            # failed, the cause it is said as (H63: the rename below failing named `.cpu.removing-N`)
            gone = removed_meanwhile(path, "the build failed") if made else None
            if made and gone is None:
                _remove_marked(path)
            if displaced.is_symlink():
                try:
                    displaced.rename(path)
                except OSError:
                    pass  # the folder could not be removed: the next build removes it and puts the link back
            if lock.is_locked:
                lock_file.unlink(missing_ok=True)
                lock.release()
            for parent in created:
                try:
                    parent.rmdir()
                except OSError:
                    break
            if gone is not None and failing:
                raise gone
