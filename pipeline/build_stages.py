"""Each stage of a build as build.py runs it: the stage's own module called inside its
progress stage, with what this build's context (BuildContext) gives it, and the report made of
their records."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .features import lock as options_lock
from .features import tune
from .features.candidates import Skipped, screening_calls
from .features.tune import Tuned
from .services import cache
from .services.layout import written_trace
from .services.progress import Progress, Steps
from .spec import SpecFile
from .stages import static
from .stages.compile import Compiled, CompilePlan
from .stages.doctor import DOCTOR_CALLS, TRACE_STEP, run_doctor
from .stages.export import Exported, export_program, prepare
from .stages.loader import LoadedModel, load_model
from .stages.manifest import build_manifest
from .stages.package import Wheel, package_wheel
from .stages.signal_check import Signal, check_signal, eager_calls
from .stages.verify import Verified, verify_model
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
        why = _entry_stays(tuned, entry)
        if entry is not None and why:
            # compiled already where it is the search's own first candidate (H50 read "compiles it" as a
            # second compile), taken from the build cache where it is there (H51 read "compiles it", then
            # "no recompile")
            ran = tuple({"name": trial.name, "from_cache": trial.from_cache} for trial in tuned.trials)
            stays = f"    --update-lock: {why}, so {entry.path.name}'s entry for builds like this one "
            stays += f"stays ({entry.chosen}), "
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
                searched = tuned.cost  # what the search cost, for the summary (H65: its row said none of it)
                tuned = tune.tune(exported, lone, [], weights_file, ctx.work_dir, ctx.store, False)
                tuned = replace(tuned, searched=searched)
            tuned, locked = replace(tuned, entry_kept_why=why, searched_candidates=ran), entry
        compiled = tune.install(tuned, exported, ctx.out_dir, ctx.work_dir, ctx.store)
        reused = compiled.from_cache and all(trial.from_cache for trial in tuned.trials)  # this build's trials
        if locked:  # the manifest records the search as it ran when its choice was locked
            tuned = tune.as_locked(tuned, locked)
        # nothing was chosen between; or --update-lock kept its entry ("chose" read as the search's choice, H68)
        verb = "used" if tuned.why == tune.LONE else "kept" if tuned.entry_kept_why else "chose"
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


def _entry_stays(tuned: Tuned, entry: options_lock.Locked | None) -> str:
    """Why the lock's entry --update-lock searches to replace stays ("" where the search replaces it)."""
    if entry is None:
        return ""
    undecided = tuned.not_decided()
    return f"the search did not decide ({undecided})" if undecided else tuned.keeps_entry(entry.chosen)


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
