"""The whole build, top to bottom: spec -> load -> doctor -> export -> compile -> verify -> package -> dist/.

Each stage's step is in build_stages.py; this module orders them, and decides what reaches dist/,
the build cache and the spec's lock file.

Two caches under build/cache/ (skipped with --no-cache): an unchanged build copies its verified
wheel from the last time; a build whose compile inputs are unchanged (e.g. only external weight
values or the version changed) reuses the compiled .so and skips export and compile.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from . import targets
from .build_stages import (
    BuildContext,
    compile_stage,
    doctor_stage,
    export_stage,
    load_stage,
    make_report,
    package_stage,
    static_stage,
    verify_stage,
)
from .errors import BuildInterrupted, OutputDirError, PipelineError
from .features import lock as options_lock
from .features import tune
from .features.candidates import SPEC_OPTIONS
from .features.tune import Tuned
from .services import cache, dist_guard
from .services.layout import WorkLayout, hold_work_dir
from .services.manifest import read_wheel_manifest
from .services.outdir import claim_output_dir, output_path, refuse_if_held
from .services.progress import Progress, reporting, stop_requested
from .services.writable import NO_ROOM, NOT_ALLOWED, write_error
from .spec import SpecFile
from .stages.compile import find_cxx, find_strip
from .stages.deliver import BuildResult, commit, restore_to_dist
from .stages.export import content_hash
from .stages.manifest import full_version
from .stages.package import Wheel
from .stages.verify import write_weights


def build(
    spec_file: SpecFile,
    *,
    root: Path,
    dist_dir: Path,
    layout: WorkLayout,
    progress: Progress,
    use_cache: bool = True,
    target_names: list[str] | None = None,
    overwrite: bool = False,
    keep_debug: bool = False,
    update_lock: bool = False,
    forced: options_lock.Locked | None = None,
) -> list[BuildResult]:
    """Build every target the spec names (or ``target_names``, from --target), one wheel each."""
    names = target_names or list(spec_file.spec.build.targets)
    targets.require_available(names)
    model = spec_file.spec.model
    results: list[BuildResult] = []
    try:
        for name in names:
            context = BuildContext(
                spec_file=spec_file,
                target=targets.get(name),
                work_dir=layout.work_dir(model.name, model.version, name),
                out_dir=output_path(root, model.name, model.version, name),
                dist_dir=dist_dir,
                store=cache.Cache(layout.cache_dir, reuse=use_cache),
                progress=progress,
                overwrite=overwrite,
                keep_debug=keep_debug,
                update_lock=update_lock,
                forced=forced,
            )
            with reporting(progress):  # what the stages say() goes to this display
                results.append(build_target(context))
    except KeyboardInterrupt:
        raise interrupted(spec_file, layout, root, dist_dir, results) from None
    except (PipelineError, OSError) as exc:
        if stop_requested:  # e.g. the C++ compiler killed by the same Ctrl-C: report the stop, not its side effect
            raise interrupted(spec_file, layout, root, dist_dir, results) from None
        if isinstance(exc, OSError) and (exc.filename or exc.errno in NO_ROOM + NOT_ALLOWED):
            raise write_error(exc) from exc
        raise
    return results


def interrupted(
    spec_file: SpecFile, layout: WorkLayout, root: Path, dist_dir: Path, finished: list[BuildResult]
) -> BuildInterrupted:
    """What the stopped build left, exactly: the work files it keeps, and any wheel it finished
    before the stop. The root, dist/ and the build cache hold nothing of the unfinished target."""
    model = spec_file.spec.model
    work = layout.model_dir(model.name, model.version)
    name = stop_requested[0] if stop_requested else "SIGINT"
    kept = (
        f"its work files in {work}/ (trace, generated sources so far, the work folder's lock) are kept for "
        f"inspection; the next build of {model.name} {model.version} replaces them"
        if work.exists()
        else "it wrote no work files"
    )
    done = "".join(f"; finished before the stop: {result.wheel}" for result in finished)
    return BuildInterrupted(
        f"build stopped by {name}: nothing of it is left under {root} or in {dist_dir}, and nothing was stored in "
        f"the build cache; {kept}{done}",
        "run the build again",
    )


def _say_all(ctx: BuildContext, lines: list[str]) -> None:
    for line in lines:
        ctx.progress.say(line)


def _known_choice(ctx: BuildContext, locked: options_lock.Locked | None) -> str | None:
    """The options this build will choose, where that is known before the doctor: the spec's with
    the search off, a lock entry's where one matches (None: a search decides, or reproduce's forced)."""
    if ctx.forced or ctx.update_lock:
        return None
    if not ctx.spec_file.spec.compile.search:
        return SPEC_OPTIONS
    return locked.chosen if locked is not None else None


def build_target(ctx: BuildContext) -> BuildResult:
    """The stages, in order. A build whose inputs are all unchanged reuses its verified wheel."""
    ctx.progress.timings.clear()
    # No compile figure until the doctor has planned the compiles (wording.outlook says why)
    ctx.progress.expect({stage: seconds for stage, seconds in ctx.last_times().items() if stage != "compile"})
    loaded = load_stage(ctx)
    cxx_version = find_cxx()
    if not ctx.keep_debug:  # checked before minutes of compiling, not after
        find_strip()
    content = content_hash(ctx.spec_file, loaded)
    # What the lock says is said once this build goes on: a second build refused a moment later
    # told a newcomer "its choice is added to spec.lock.json" just before its refusal.
    lock_notes: list[str] = []
    lock_key, locked = (
        (None, ctx.forced)
        if ctx.forced
        else options_lock.consult(
            ctx.spec_file, ctx.target.NAME, ctx.target.machine(), ctx.update_lock, lock_notes.append
        )
    )
    if not ctx.overwrite:  # a kept wheel of another root, content or choice: said now, not after minutes of search
        version = full_version(ctx.spec_file.spec.model.version, ctx.target.NAME)
        known = _known_choice(ctx, locked)
        chosen = (known, ctx.target.machine()) if known else None
        # the quick way, where the search is off (H67 was offered only another --dist or --overwrite)
        note = "or keep dist/'s wheel, as the same build without --no-search does "
        note += "(from the build cache, with no search)"
        dist_guard.refuse_early(
            ctx.dist_dir,
            ctx.spec_file.spec.import_name,
            version,
            ctx.out_dir,
            content,
            chosen,
            note if known == SPEC_OPTIONS else "",
        )
    build_key = whole_build_key(ctx, content, cxx_version, locked)
    if ctx.store.has(build_key) and not ctx.update_lock:  # --update-lock: the search itself is asked for
        # where the options came from (a lock's entry, or the spec's with the search off); not "the
        # option search runs": a newcomer's unchanged build said so, then reused its wheel in 3 s
        _say_all(ctx, lock_notes if locked or lock_key is None else [])
        return _reuse_build(ctx, build_key)
    # A running build's output folder: said now, not after the doctor and export. Only a peek: the
    # claim, later, removes the last build's folder, which installed wheels may still link to.
    refuse_if_held(ctx.out_dir)
    # The work folder is held from here: a second build of it (another --root or --dist, the same
    # --build-dir) started a few seconds later passed a peek and was refused after its doctor.
    with hold_work_dir(ctx.work_dir):
        _say_all(ctx, lock_notes)
        findings, exported, signal, (planned, skipped) = doctor_stage(ctx, loaded, cxx_version, locked)
        # The last build's compile time, scaled to the compiles this one will make (it may have made one)
        rounds = tune.expected_rounds(exported, planned, ctx.store)
        ctx.progress.expect(ctx.last_times(rounds))
        exported = export_stage(ctx, exported, loaded, planned)
        if exported.program is not None:  # the graph's guess counts a budget in seconds now (H49: 4 compiles for 1)
            ctx.progress.expect(ctx.last_times(tune.expected_rounds(exported, planned, ctx.store)))
        # The wheel in the work folder is moved to dist/ and the cache while its lock is still held.
        with claim_output_dir(ctx.out_dir):
            weights_file = write_weights(exported, ctx.work_dir)
            entry = options_lock.entry(ctx.spec_file.path, lock_key) if ctx.update_lock else None
            tuned, compiled, locked = compile_stage(ctx, exported, planned, skipped, weights_file, locked, entry)
            verified = verify_stage(ctx, exported, compiled, weights_file)
            sizes = static_stage(ctx, exported, loaded, tuned, verified, weights_file, cxx_version)
            packaged = package_stage(ctx, exported, compiled, verified, tuned, sizes)
        report = make_report(ctx, packaged, verified, compiled, tuned, findings, build_key, signal)
        if locked:  # under --update-lock: its search did not decide, and the entry stayed (compile_stage)
            report["compile_search"].update(locked=str(locked.path), entry_kept=ctx.update_lock)
        # What `modelwheel reproduce` rebuilds from, and the compiler a rebuild must match.
        report.update(spec=str(ctx.spec_file.path.resolve()), compiler=cxx_version)
        # the search's choice is this machine's, also where dist/ then refuses the wheel (H40: a search
        # that decided, refused at dist/, locked nothing, and the next build searched again)
        searched = lock_key if locked is None else None
        overrides: dict[str, Any] = next((plan.overrides for name, plan in planned if name == tuned.chosen), {})
        search = dict(packaged.manifest.get("compile_search") or {})
        # the entry this build replaces, where its search may write a lock entry dist/ then refuses
        aside = ctx.store.set_aside(build_key) if searched is not None else None
        try:
            result = commit(
                packaged.wheel,
                report,
                ctx.dist_dir,
                packaged.manifest["import_name"],
                packaged.manifest["full_version"],
                (ctx.store, build_key),
                overwrite=ctx.overwrite,
            )
        except OutputDirError as refused:
            before = options_lock.Before.of(ctx.spec_file.path, lock_key)  # read before the lock is written
            if _lock_choice(ctx, searched, tuned, overrides, search, (build_key, content, cxx_version), refused=True):
                assert before is not None  # a lock was written: the spec has a lock file's place
                # this build waits under its entry's key; without the entry, a build is the one before it (H61)
                earlier = aside is not None
                ctx.store.put_back(build_key, aside)
                aside = None
                # H47: the lock changed, dist/ refused, and every plain build after it was refused alike, unsaid
                said, back = before.refused(tuned.chosen, ctx.work_dir, _dist_choice(ctx, packaged.wheel), earlier)
                ctx.progress.say(said)
            elif locked is not None and ctx.update_lock and before is not None:
                # an --update-lock search that did not decide: the entry stays, and so does an earlier way back (H54)
                said, back = before.refused(locked.chosen, ctx.work_dir, _dist_choice(ctx, packaged.wheel))
                ctx.progress.say(said)
            else:
                back = ""
            if back:  # the hint, last on screen, ends with it (H62 scrolled up for it)
                refused.hint += f"; or {back} (above)"
            raise
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
    _lock_choice(ctx, searched, tuned, overrides, search, (build_key, content, cxx_version))
    return result


def _dist_choice(ctx: BuildContext, wheel: Wheel) -> str | None:
    """The options dist/'s wheel of this name was built with, where its manifest says: where a
    refused build's way back leads."""
    kept = read_wheel_manifest(ctx.dist_dir / wheel.path.name) or {}
    chosen = (kept.get("compile_search") or {}).get("chosen")
    return chosen if isinstance(chosen, str) else None


def _lock_choice(
    ctx: BuildContext,
    searched: options_lock.Key | None,
    tuned: Tuned,
    overrides: dict[str, Any],
    search: dict[str, Any],
    keyed: tuple[str, str, str],
    refused: bool = False,
) -> bool:
    """The search's choice into the lock, where it decided; this build, stored in the build cache under
    the key of a build from that entry too, is then that build whole (H46 waited 1m16s for it)."""
    written = options_lock.after_search(
        ctx.spec_file.path, searched, tuned, overrides, search, ctx.progress.say, refused
    )
    if written is not None:
        build_key, content, cxx_version = keyed
        ctx.store.copy_entry(build_key, whole_build_key(ctx, content, cxx_version, written))
    return written is not None


def whole_build_key(ctx: BuildContext, content: str, cxx_version: str, locked: options_lock.Locked | None) -> str:
    """The build cache's key for this build's wheel; ``locked``: the lock entry it compiles, if any."""
    return cache.build_key(
        content_hash=content,
        target=ctx.target.NAME,
        root=str(ctx.out_dir),
        cxx_version=cxx_version,
        machine=ctx.target.machine(),
        debug_info="kept" if ctx.keep_debug else "stripped",
        search=ctx.spec_file.spec.compile.model_dump_json(include=set(ctx.spec_file.spec.compile.SEARCH_KEYS)),
        locked=json.dumps(locked.record(), sort_keys=True) if locked else "",
    )


def _reuse_build(ctx: BuildContext, key: str) -> BuildResult:
    """Nothing the wheel depends on changed since it was built and verified: copy it to dist/."""
    # Per process: two builds of one unchanged spec may both take this path at once.
    restored_dir = ctx.work_dir / f"from-cache-{os.getpid()}"
    try:
        restored_dir.mkdir(parents=True)
        return restore_to_dist(ctx.store, key, restored_dir, ctx.dist_dir, ctx.progress, ctx.overwrite)
    finally:
        shutil.rmtree(restored_dir, ignore_errors=True)
