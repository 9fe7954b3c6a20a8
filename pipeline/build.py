"""The whole build, top to bottom: spec -> load -> doctor -> export -> compile -> verify -> package -> dist/.

Two caches under build/cache/ (skipped with --no-cache): an unchanged build copies its verified
wheel from the last time; a build whose compile inputs are unchanged (e.g. only external weight
values or the version changed) reuses the compiled .so and skips export and compile.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import targets
from .errors import BuildInterrupted, OutputDirError, PipelineError
from .features import lock as options_lock
from .features import tune
from .features.candidates import Skipped, screening_calls
from .features.tune import Tuned
from .services import cache, dist_guard
from .services.layout import WorkLayout, hold_work_dir, written_trace
from .services.manifest import read_wheel_manifest
from .services.outdir import claim_output_dir, output_path, refuse_if_held
from .services.progress import Progress, Steps, reporting, stop_requested
from .services.writable import NO_ROOM, NOT_ALLOWED, write_error
from .spec import SpecFile
from .stages import static
from .stages.compile import Compiled, CompilePlan, find_cxx, find_strip
from .stages.deliver import BuildResult, commit, restore_to_dist
from .stages.doctor import DOCTOR_CALLS, TRACE_STEP, run_doctor
from .stages.export import Exported, content_hash, export_program, prepare
from .stages.loader import LoadedModel, load_model
from .stages.manifest import build_manifest, full_version
from .stages.package import Wheel, package_wheel
from .stages.signal_check import Signal, check_signal, eager_calls
from .stages.verify import Verified, verify_model, write_weights
from .targets import Target
from .wheel_template.runtime._schema import Manifest


@dataclass(frozen=True)
class BuildContext:
    """One target's build of one spec: what it builds, where it reads and writes, and with what.
    The folders come from the layouts (layout.py, outdir.output_path), spelled nowhere else."""

    spec_file: SpecFile
    target: Target
    work_dir: Path  # build/<model>/<version>/<target>/
    out_dir: Path  # <root>/<model>/<version>/<target>/: where the .so is compiled and ships from
    dist_dir: Path
    store: cache.Cache
    progress: Progress
    overwrite: bool  # replace a wheel of the same name in dist/ even where its contents differ
    keep_debug: bool  # ship the .so files with their debug info (--keep-debug)
    update_lock: bool = False  # search again and rewrite the spec's lock entry (--update-lock)
    forced: options_lock.Locked | None = None  # the options a wheel records (reproduce): no search, no lock

    def last_times(self, rounds: float | None = None) -> dict[str, float]:
        """The stage times of the newest earlier build of this model and target on as many threads:
        one built with OMP_NUM_THREADS=1 gave a 2-thread build "about 3s" of a 33 s verify (H42)."""
        model = self.spec_file.spec.model.name
        return self.store.stage_times(model, self.target.NAME, rounds=rounds, threads=build_threads())


def build_threads() -> int:
    """The threads the build's eager calls and compiled code run on (the report records them)."""
    import torch

    return torch.get_num_threads()


@dataclass(frozen=True)
class Packaged:
    wheel: Wheel
    manifest: Manifest
    sizes: static.StaticSizes  # the static batch sizes' models (none without [dims.*] static)


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
    if not ctx.overwrite:  # a kept wheel of another root or content: said now, not after minutes of search
        version = full_version(ctx.spec_file.spec.model.version, ctx.target.NAME)
        dist_guard.refuse_early(ctx.dist_dir, ctx.spec_file.spec.import_name, version, ctx.out_dir, content)
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


def load_stage(ctx: BuildContext) -> LoadedModel:
    model = ctx.spec_file.spec.model
    with ctx.progress.stage("load", f"{model.factory or f'{model.hf} for {model.task}'} ({ctx.spec_file.path})"):
        return load_model(ctx.spec_file)


def doctor_stage(
    ctx: BuildContext, loaded: LoadedModel, cxx_version: str, locked: options_lock.Locked | None
) -> tuple[list, Exported, Signal, tuple[list, list]]:
    """The doctor's findings, the model prepared for export (on the target's device, its outputs
    described), the gate's signal check (outputs that do not move stop the build here, before
    minutes of compiling, since no comparison could verify them), pad = true's gate on eager (a
    model that mixes the batch stops here too) and the search's plans."""
    spec = ctx.spec_file.spec
    pads = static.pads(spec)
    # numbered over the doctor's checks and this stage's own; the time left is from the eager
    # calls' steps, not from the dynamo trace (TRACE_STEP), which takes a time of its own, and each
    # step weighs as its eager calls: counted alike, the unet's steps said "about 2s left" after
    # purity's two calls, before the signal's seven and the screen's (H41: 19 s more)
    calls = [*DOCTOR_CALLS, float(eager_calls(len(spec.inputs)))] + (
        [float(static.padding_calls(spec))] if pads else []
    )
    calls.append(screening_calls(spec, ctx.target.bf16_native(), locked))
    steps = Steps(len(calls), stage="doctor", unlike=frozenset({TRACE_STEP}), weights=calls)
    with ctx.progress.stage("doctor"):
        findings = run_doctor(ctx.spec_file, loaded, steps)
        # eager calls too (minutes for a large model on a busy machine): the status says which
        steps("signal: eager's outputs on the seeded inputs must differ")  # fits a row of 80 columns
        exported = prepare(ctx.spec_file, loaded, ctx.target)
        signal = check_signal(exported)
        if pads:  # a model that mixes the batch is refused before the compiles
            steps("padding: eager on padded batches against eager at their own size (pad = true's gate)")
            static.check_padding_eager(exported)
        # Planning runs eager under bfloat16 autocast against the spec's tolerances: 34 s for the
        # unet on a busy machine, silent between two stages when it ran outside one.
        steps("bf16 candidate: eager under autocast, within the tolerances?")  # fits a row of 80 columns
        return findings, exported, signal, tune.plans(exported, cxx_version, ctx.out_dir, ctx.keep_debug, locked)


def export_stage(
    ctx: BuildContext, exported: Exported, loaded: LoadedModel, planned: list[tuple[str, CompilePlan]]
) -> Exported:
    """torch.export, unless every compile the build plans is in the cache already."""
    plans = [plan for _, plan in planned] + tune.final_plans(exported, planned, ctx.out_dir)
    if all(ctx.store.has(plan.key) for plan in plans):
        return exported
    with ctx.progress.stage("export"):
        return export_program(exported, loaded.source_files)


def compile_stage(
    ctx: BuildContext,
    exported: Exported,
    planned: list[tuple[str, CompilePlan]],
    skipped: list[Skipped],
    weights_file: Path | None,
    locked: options_lock.Locked | None = None,
    entry: options_lock.Locked | None = None,
) -> tuple[Tuned, Compiled, options_lock.Locked | None]:
    """The search (or the lock's choice), its choice installed, and the lock entry the build used.
    ``entry``: the lock's entry that --update-lock searches to replace, which stays where the search
    does not decide, and is then compiled, as a build without --update-lock would (H43: such a build
    shipped the spec's options, dist/ refused them, and the refusal's hint rebuilt the entry's)."""
    say = ctx.progress.say
    beyond = len(tune.likely_left_out(exported, planned, ctx.store))
    header = tune.compile_header(len(planned), [skip.name for skip in skipped], ctx.out_dir, beyond)
    with ctx.progress.stage("compile", header):
        # reproduce's rebuild (forced options) is compared, not reported: no rough timing for it
        tuned = tune.tune(exported, planned, skipped, weights_file, ctx.work_dir, ctx.store, ctx.forced is None)
        if entry is not None and (why := tuned.not_decided()):
            # compiled already where it is the search's own first candidate (H50 read "compiles it" as a
            # second compile), taken from the build cache where it is there (H51 read "compiles it", then
            # "no recompile")
            stays = (
                f"    --update-lock: the search did not decide ({why}), so {entry.path.name}'s entry for builds like "
                f"this one stays ({entry.chosen}), "
            )
            if entry.chosen == tuned.chosen:  # this build has compiled the entry's choice already
                say(stays + "the candidate this build compiled already")
            else:
                lone, _ = tune.plans(exported, planned[0][1].cxx_version, ctx.out_dir, ctx.keep_debug, entry)
                cached = ctx.store.has(lone[0][1].key)
                done = "takes it from the build cache" if cached else "compiles it"
                say(stays + f"and this build {done}, as one without --update-lock does")
                # its own figure: the search's last ("its install", 2 s) stayed through a 25 s compile (H49)
                guess = None if cached else tune.compile_estimate(tuned, entry.chosen)
                ctx.progress.estimate(*(guess or (None, None)))
                tuned = tune.tune(exported, lone, [], weights_file, ctx.work_dir, ctx.store, False)
            locked = entry
        compiled = tune.install(tuned, exported, ctx.out_dir, ctx.work_dir, ctx.store)
        reused = compiled.from_cache and all(trial.from_cache for trial in tuned.trials)  # this build's trials
        if locked:  # the manifest records the search as it ran when its choice was locked
            tuned = tune.as_locked(tuned, locked)
        verb = "used" if tuned.why == tune.LONE else "chose"  # nothing was chosen between
        say(f"    {verb} {tuned.chosen}" + (f": {tuned.why}" if tuned.why else ""))
        if reused:
            # After the choice it is of (H53 read it, between the timing rows and "chose", as a reuse
            # before any choice). The export runs where any planned compile is missing (a search
            # stopped before compiling its candidates), so "no export" is said only where it did not run.
            skipped_too = "" if "export" in ctx.progress.timings else "no export, "
            say(f"    reused the compiled model from build cache {compiled.cache_key}: {skipped_too}no recompile")
        if tuned.cost.undecided:  # why nothing is locked, after the choice it qualifies
            say(f"    {tuned.cost.undecided}")
    return tuned, compiled, locked


def verify_stage(ctx: BuildContext, exported: Exported, compiled: Compiled, weights_file: Path | None) -> Verified:
    with ctx.progress.stage("verify"):
        return verify_model(exported, compiled, ctx.work_dir, weights_file, stage="verify")


def static_stage(
    ctx: BuildContext,
    exported: Exported,
    loaded: LoadedModel,
    tuned: Tuned,
    verified: Verified,
    weights_file: Path | None,
    cxx_version: str,
) -> static.StaticSizes:
    """The spec's static batch sizes (``[dims.<batch>] static``), each compiled with the options the
    search chose and verified like the dynamic model; their golden cases join the wheel's."""
    spec = exported.spec_file.spec
    if spec.static_dim is None:
        return static.StaticSizes(models=[], padding=None)
    with ctx.progress.stage("static", f"{spec.static_dim} = {spec.dims[spec.static_dim].static}"):
        models = static.compile_sizes(
            exported, loaded, tuned.chosen, tuned.plan, cxx_version, ctx.out_dir, ctx.work_dir, ctx.store
        )
        return static.verify_all(exported, models, verified, weights_file, ctx.work_dir)


def package_stage(
    ctx: BuildContext,
    exported: Exported,
    compiled: Compiled,
    verified: Verified,
    tuned: Tuned,
    sizes: static.StaticSizes,
) -> Packaged:
    with ctx.progress.stage("package"):
        manifest, shared, static_libraries = static.package(
            build_manifest(exported, compiled, verified, tuned.manifest_record()),
            exported,
            compiled,
            sizes,
            ctx.work_dir,
        )
        extras = [verified.golden_file, *shared] + ([verified.weights_file] if verified.weights_file else [])
        artifacts = list(compiled.artifacts) + static_libraries
        return Packaged(package_wheel(manifest, artifacts, extras, ctx.work_dir), manifest, sizes)


def _reuse_build(ctx: BuildContext, key: str) -> BuildResult:
    """Nothing the wheel depends on changed since it was built and verified: copy it to dist/."""
    # Per process: two builds of one unchanged spec may both take this path at once.
    restored_dir = ctx.work_dir / f"from-cache-{os.getpid()}"
    try:
        restored_dir.mkdir(parents=True)
        return restore_to_dist(ctx.store, key, restored_dir, ctx.dist_dir, ctx.progress, ctx.overwrite)
    finally:
        shutil.rmtree(restored_dir, ignore_errors=True)


def make_report(
    ctx: BuildContext,
    packaged: Packaged,
    verified: Verified,
    compiled: Compiled,
    tuned: Tuned,
    findings: list,
    build_key: str,
    signal: Signal,
) -> dict[str, Any]:
    manifest, wheel, timings = packaged.manifest, packaged.wheel, ctx.progress.timings
    report: dict[str, Any] = {
        "model": manifest["name"],
        "import_name": manifest["import_name"],
        "version": manifest["full_version"],
        "target": manifest["target"],
        "wheel": {
            "name": wheel.path.name,
            "sha256": wheel.sha256,
            "size": wheel.size,
            "platform_tag": wheel.platform_tag,
        },
        "artifacts": manifest["artifacts"],
        "debug_info": compiled.debug_info,  # "stripped" (the default) or "kept" (--keep-debug)
        "opt_path": manifest["opt_path"],
        "stages_s": dict(timings),
        "threads": build_threads(),  # what the stage times were measured on (BuildContext.last_times)
        "verification": {**verified.report(), "signal": signal.record()},
        "trace_dir": written_trace(),
        # none where the .so came from the build cache: H41 looked for the C++ in a folder never made
        "sources_dir": str(compiled.sources_dir) if compiled.sources_dir.is_dir() else None,
        "content_hash": manifest["content_hash"],
        "weights": {k: v for k, v in manifest["weights"].items() if k != "tensors"},
        "compile_cache": {"key": manifest["compile_cache_key"], "reused": all(t.from_cache for t in tuned.trials)},
        "compile_search": tuned.report_record(),
    }
    if packaged.sizes.models:
        report["static"] = static.report(packaged.sizes)
    report["doctor"] = [f.format() for f in findings]
    if "checkpoint" in manifest:  # the manifest names the folder; the report says where it was
        report["checkpoint"] = {**manifest["checkpoint"], "path": ctx.spec_file.spec.model.hf}
    report["build_cache"] = {"key": build_key, "reused": False}
    return report
