"""What a build delivers: its wheel and report into dist/, and the build into the build cache, all or
nothing (commit); or an unchanged build's verified wheel taken from that cache (restore_to_dist)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OutputDirError
from ..services import cache, dist_guard
from ..services.layout import written_trace
from ..services.manifest import sha256_file
from ..services.outdir import signals_deferred
from ..services.progress import Progress, check_stop, say
from ..services.writable import check_private, made_folders, remove_if_empty, sweep_partials
from .package import Wheel


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    report_path: Path
    report: dict[str, Any]
    # dist/ kept its wheel of this model and options: this build's differs only in the search's record
    kept: str = ""
    own_sha256: str = ""  # where dist/ kept its wheel: this build's, which waits in the build cache
    # dist/ held these very bytes already: the wheel was left as it is (its report is this build's)
    same_bytes: bool = False


def restore_to_dist(
    store: cache.Cache, key: str, restored_dir: Path, dist_dir: Path, progress: Progress, overwrite: bool
) -> BuildResult:
    """The verified wheel and report of cache entry ``key`` (an unchanged build's) into dist/."""
    files = store.restore(key, restored_dir) or ()
    wheel_path = next(p for p in files if p.suffix == ".whl")
    report = json.loads(next(p for p in files if p.name.endswith(".report.json")).read_text())
    progress.say(f"    unchanged since the build in cache {key}: reusing its verified wheel (--no-cache rebuilds)")
    report["stages_s"] = dict(progress.timings)
    report["build_cache"] = {"key": key, "reused": True}
    # this build generated nothing and traced nothing: the cached report named the earlier build's folders
    report.update(trace_dir=written_trace(), sources_dir=None)
    wheel = Wheel(
        path=wheel_path,
        sha256=report["wheel"]["sha256"],
        size=report["wheel"]["size"],
        platform_tag=report["wheel"]["platform_tag"],
    )
    return commit(wheel, report, dist_dir, report["import_name"], report["version"], overwrite=overwrite)


def _kept(
    finals: list[Path],
    report: dict[str, Any],
    kept: dist_guard.KeptAsIs,
    cache_entry: tuple[cache.Cache, str] | None,
    files: tuple[Path, ...],
) -> BuildResult:
    """dist/ keeps its wheel (dist_guard.keep_what_was_tested): this build goes into the build cache
    alone, and the result names the kept wheel, said with what differs and how to replace it."""
    if cache_entry:
        cache_entry[0].store(cache_entry[1], files, stoppable=False)
    say(
        f"    kept {finals[1]}: it holds this model with the options this build chose, so dist/ is left as it is; "
        f"their manifests differ only in {kept.differs}; {dist_guard.overwrite()} replaces it with this build's"
    )
    facts = {"name": finals[1].name, "size": finals[1].stat().st_size, "sha256": kept.sha256}
    own = report["wheel"]["sha256"]
    return BuildResult(finals[1], finals[0], {**report, "wheel": {**report["wheel"], **facts}}, kept.differs, own)


def commit(
    wheel: Wheel,
    report: dict[str, Any],
    dist_dir: Path,
    import_name: str,
    full_version: str,
    cache_entry: tuple[cache.Cache, str] | None = None,
    *,
    overwrite: bool = False,
) -> BuildResult:
    """The wheel and its report into dist/, and the build into the cache: all or nothing.

    Everything is written aside first (hidden files in dist/, a staged cache entry), so a full
    disk or an interrupt while writing leaves nothing; then the renames run together with
    SIGINT/SIGTERM held. The report goes in before the wheel: a wheel in dist/ has its report.
    """
    report_file = wheel.path.parent / f"{import_name}-{full_version}.report.json"
    try:
        report_file.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a failed write() names no file
        exc.filename = exc.filename or str(report_file)
        raise
    finals = [dist_dir / report_file.name, dist_dir / wheel.path.name]
    # what --overwrite replaces, said: a newcomer's summary gave no word of the wheel it replaced,
    # one already uploaded to the local index; the same bytes are left as they are, and said so (H54
    # read "built" with dist/'s sha256 and a new mtime, where another run said "kept")
    held = sha256_file(finals[1]) if finals[1].is_file() else None
    same_bytes = held == wheel.sha256
    if not overwrite:
        try:
            kept_as_is = dist_guard.keep_what_was_tested(finals[1], wheel.path, wheel.sha256, held or wheel.sha256)
        except OutputDirError:
            if cache_entry:  # what the refusal says: --overwrite then takes this wheel, not an older one
                cache_entry[0].store(cache_entry[1], (wheel.path, report_file), stoppable=False)
            raise
        if kept_as_is is not None:
            return _kept(finals, report, kept_as_is, cache_entry, (wheel.path, report_file))
    written = [(report_file, finals[0])] + ([] if same_bytes else [(wheel.path, finals[1])])
    hidden = [final.parent / f".{final.name}.partial-{os.getpid()}" for _, final in written]
    made, staged_entry = [], None
    try:
        made = made_folders(dist_dir)
        check_private(dist_dir, "--dist")  # made by another user after the check before the build: theirs
        sweep_partials(dist_dir)
        for (source, _), aside in zip(written, hidden):
            shutil.copyfile(source, aside)
            os.chmod(aside, 0o644)  # whatever the umask: a wheel others install is theirs to read, not to change
        if cache_entry:
            staged_entry = cache_entry[0].stage(cache_entry[1], (wheel.path, report_file))
        check_stop()
        with signals_deferred(redeliver=False):
            for aside, (_, final) in zip(hidden, written):
                os.replace(aside, final)
            if cache_entry and staged_entry:
                cache_entry[0].commit(cache_entry[1], staged_entry)
            made = []
    finally:
        for aside in hidden:
            aside.unlink(missing_ok=True)
        if staged_entry:
            shutil.rmtree(staged_entry, ignore_errors=True)
        remove_if_empty(made)
    if overwrite and same_bytes:  # a newcomer's --overwrite "replaced" the kept wheel with its own bytes, unsaid
        say(f"    --overwrite: {finals[1]} held these same bytes already: nothing was replaced")
    elif overwrite and held is not None:
        say(f"    --overwrite: replaced {finals[1]} (another build of this version, sha256 {held[:16]}…)")
    return BuildResult(wheel=finals[1], report_path=finals[0], report=report, same_bytes=same_bytes)
