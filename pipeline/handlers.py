"""What each command does with its parsed arguments (COMMANDS, by name): build (one spec, several
side by side, or a save_pretrained folder), doctor, index, publish (building what dist/ lacks),
matrix, reproduce, schema. cli.py parses, calls one of them, and turns its errors into exit codes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from . import targets
from .arguments import DEFAULT_ROOT, ROOT_ENV, TARGET_FLAGS
from .commands.index_client import resolve_index
from .commands.matrix import build_matrix, spec_paths
from .commands.publish import publish
from .commands.wheel_check import built_by, wheels_there
from .errors import PackageError, UsageError
from .hf import guess_task
from .hf_tasks import supported
from .services import index, record
from .services.layout import WorkLayout
from .services.outdir import check_trusted, claim_inductor_cache, output_path
from .services.parallel import build_many, default_jobs
from .services.progress import Progress, QuietProgress, Steps, reporting
from .services.wording import under_make
from .services.writable import check_private, check_writable
from .spec import SpecFile, checkpoint_spec, load_spec, with_overrides
from .spec_schema import spec_schema
from .summary import print_report

if TYPE_CHECKING:  # the build imports torch, which commands that build nothing never load
    from .stages.deliver import BuildResult


def _artifact_root(flag: str | None) -> Path:
    value = flag or os.environ.get(ROOT_ENV) or DEFAULT_ROOT
    root = Path(value)
    if not root.is_absolute():
        raise UsageError(
            f"artifact root {value!r} is not an absolute path", f"give --root or {ROOT_ENV} an absolute path"
        )
    return root


def _print_summary(progress: Progress, result: BuildResult, rebuild: bool) -> None:
    if isinstance(progress, QuietProgress):
        progress.result(str(result.wheel))
    else:
        print_report(progress, result, rebuild=rebuild)


def _check_outputs(args: argparse.Namespace, root: Path) -> None:
    """Every folder the build writes, before any work: a file there, no permission, a full disk."""
    for folder, flag in ((Path(args.dist), "--dist"), (Path(args.build_dir), "--build-dir")):
        check_writable(folder, flag)
        check_private(folder, flag)
    check_writable(root, f"--root (or ${ROOT_ENV})")


def _build_many(args: argparse.Namespace, progress: Progress) -> int:
    if args.weights or args.version:
        raise UsageError("--weights and --version apply to one spec", "build the specs one at a time")
    passthrough = [
        a
        for flag, value in (("--root", args.root), ("--dist", args.dist), ("--build-dir", args.build_dir))
        if value
        for a in (flag, str(value))
    ] + (["--no-cache"] if args.no_cache else [])
    passthrough += [a for target in args.target or [] for a in ("--target", target)]
    passthrough += ["--quiet"] if args.quiet else []
    passthrough += ["--keep-debug"] if args.keep_debug else []
    passthrough += ["--update-lock"] if args.update_lock else []
    passthrough += ["--no-search"] if args.no_search else []
    for flag in TARGET_FLAGS:  # each target's own (--cpu-isa)
        value = getattr(args, flag.dest, None)
        passthrough += (
            ([flag.option_strings[0]] if flag.nargs == 0 else [flag.option_strings[0], str(value)]) if value else []
        )
    passthrough += ["--overwrite"] if args.overwrite else []
    _check_outputs(args, _artifact_root(args.root))
    jobs = args.jobs or default_jobs(len(args.spec))
    logs: dict[str, Path] = {}
    try:
        return build_many(args.spec, passthrough, jobs, WorkLayout(Path(args.build_dir)).logs_dir, progress, logs)
    finally:
        args.records.extend(record.children(args.spec, logs))


def _build(args: argparse.Namespace, progress: Progress) -> int:
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        raise UsageError(
            f"-j/--jobs {jobs}: the number of parallel builds must be 1 or more",
            "give -j N with N >= 1, or leave -j out to use one build per core",
        )
    if getattr(args, "task", None) == "help":  # asked for, not a mistake: the table, and exit 0
        print(f"the tasks `build --hf DIR --task TASK` builds from a save_pretrained folder:\n{supported()}")
        return 0
    if getattr(args, "hf", None) or getattr(args, "task", None) or getattr(args, "name", None):
        return _run_build(_checkpoint_spec(args), args, progress)  # --version and --name are in its spec
    if not args.spec:
        if under_make():  # `make build MODEL=` (empty): said in make's terms (H65)
            raise UsageError(
                "no model to build: MODEL (or SPEC) is empty",
                "make build MODEL=<name> (a folder of models/ holding a spec.toml, e.g. MODEL=unet), or "
                "make build SPEC=path/to/spec.toml",
            )
        raise UsageError(
            "give --spec PATH, or --hf DIR for a save_pretrained folder",
            "e.g. modelwheel build --spec my_model/spec.toml, or modelwheel build --hf ./my-vit "
            "--task image-classification --name my_vit --version 1.0",
        )
    if isinstance(args.spec, list) and len(args.spec) > 1:
        return _build_many(args, progress)
    spec_file = load_spec(args.spec[0] if isinstance(args.spec, list) else args.spec)
    weights, version = getattr(args, "weights", None), getattr(args, "version", None)
    if weights and not version:
        raise UsageError(
            "--weights makes a new wheel, so it needs a new version: add --version",
            f"e.g. --version {spec_file.spec.model.version}.1",
        )
    if weights or version:
        spec_file = with_overrides(spec_file, version=version, weights=weights)
    return _run_build(spec_file, args, progress)


def _run_build(spec_file: SpecFile, args: argparse.Namespace, progress: Progress) -> int:
    """Build one spec with the command's folders, targets and flags (``build``, or ``publish``
    building what dist/ lacks: its parser has the folders, and the defaults stand for the rest)."""
    if getattr(args, "no_search", False):
        if getattr(args, "update_lock", False):
            raise UsageError(
                "--no-search and --update-lock contradict each other: --update-lock runs the search again",
                "give --no-search for one quick compile of the spec's options, or --update-lock to search",
            )
        spec_file = with_overrides(spec_file, search=False)
    root = _artifact_root(args.root)
    _check_outputs(args, root)
    layout = WorkLayout(Path(args.build_dir).resolve())
    model = spec_file.spec.model
    # TORCH_TRACE is read when torch is imported: set it before the stages import torch.
    trace_dir = layout.trace_dir(model.name, model.version)
    os.environ.setdefault("TORCH_TRACE", str(trace_dir))
    target_names = getattr(args, "target", None) or list(spec_file.spec.build.targets)
    for name in target_names:  # a root another user controls is refused before any work
        check_trusted(output_path(root, model.name, model.version, name))
    claim_inductor_cache()  # and so is a compile cache of theirs (/tmp/torchinductor_<user> taken first)
    for name in target_names:  # before torch is imported (the cpu target fixes the ISA its kernels use)
        targets.get(name).before_torch(spec_file.spec.build.options(name), args)

    # Importing torch takes seconds, and was a silent 43 s on a busy machine: a stage of its own,
    # so its status lines come as in the others (build() clears its time from the build's).
    with progress.stage("start", "importing torch"):
        if not getattr(args, "target", None):  # the spec's own list: a target this machine lacks is left out, said
            target_names = targets.buildable_here(target_names, progress.say)
        targets.require_available(target_names)  # before anything is written
        shutil.rmtree(trace_dir, ignore_errors=True)
        from .build import build  # imports torch, which reads TORCH_TRACE and the target's settings made above

        if not args.verbose:
            import torch._logging  # torch: imported by the build above already

            # torch logs warnings (graph dumps, guard notes) that our own messages already cover.
            torch._logging.set_logs(all=logging.ERROR)

    for result in build(
        spec_file,
        root=root,
        dist_dir=Path(args.dist).resolve(),
        layout=layout,
        progress=progress,
        use_cache=not getattr(args, "no_cache", False),
        target_names=target_names,
        overwrite=getattr(args, "overwrite", False),
        keep_debug=getattr(args, "keep_debug", False),
        update_lock=getattr(args, "update_lock", False),
        forced=getattr(args, "forced", None),
    ):
        _print_summary(progress, result, rebuild=getattr(args, "forced", None) is not None)
        args.records.append(record.of_build(result))
    return 0


def _checkpoint_spec(args: argparse.Namespace) -> SpecFile:
    """build --hf DIR --task TASK --name N --version V [--spec overrides.toml]."""
    if not args.hf:
        raise UsageError(
            "--task and --name go with --hf DIR (a save_pretrained folder)",
            "add --hf DIR, or leave them out and build a spec with --spec",
        )
    if not args.task:
        raise UsageError(
            f"--hf {args.hf}: needs --task: a checkpoint folder is built for one task", guess_task(args.hf)
        )
    if args.spec and len(args.spec) > 1:
        raise UsageError(
            "--hf takes at most one --spec (the keys that override the checkpoint's)",
            "build other specs in a command of their own",
        )
    if getattr(args, "weights", None):
        raise UsageError(
            "--weights does not apply to --hf: the weights come from the folder's safetensors files",
            "save the new weights with save_pretrained() into a folder and give it to --hf",
        )
    return checkpoint_spec(
        args.hf, args.task, name=args.name, version=args.version, spec=args.spec[0] if args.spec else None
    )


def _spec_from(args: argparse.Namespace, wheels: bool = False) -> SpecFile:
    """``wheels``: the command also takes --wheel instead (publish: H66 was told of the other two only)."""
    if bool(args.model) == bool(args.spec):
        what = "a model name, --spec PATH or --wheel PATH" if wheels else "a model name or --spec PATH"
        # with the flags given (H63: a hint without the --index given failed)
        given = shlex.join(getattr(args, "argv", None) or [args.command])
        built = f", or modelwheel {given} --wheel dist/<wheel>.whl for a wheel built already" if wheels else ""
        raise UsageError(
            f"give {what} (one of them)",
            f"e.g. modelwheel {args.command} --spec my_model/spec.toml, "
            f"or make {args.command} MODEL=unet in a checkout{built}",
        )
    spec = _spec_path(args)
    assert spec is not None  # one of the two is given (checked above)
    return load_spec(spec)


def _spec_path(args: argparse.Namespace) -> str | None:
    """--spec, or the checkout's spec of the model named (None: neither given)."""
    return args.spec or (str(Path("models") / args.model / "spec.toml") if args.model else None)


def _doctor(args: argparse.Namespace, progress: Progress) -> int:
    spec_file = _spec_from(args)
    from .stages.doctor import DOCTOR_STEPS, TRACE_STEP, run_doctor  # these import torch: commands that
    from .stages.loader import load_model  # load no model start without it

    # As the build's doctor stage: what runs, how far along, about how long is left (a newcomer's
    # `modelwheel doctor unet` printed nothing for its 9 s)
    detail = f"{spec_file.spec.model.name} ({spec_file.path}): the model loaded and called eagerly"
    with reporting(progress), progress.stage("doctor", detail):
        steps = Steps(DOCTOR_STEPS, stage="doctor", unlike=frozenset({TRACE_STEP}))
        findings = run_doctor(spec_file, load_model(spec_file), steps)
    args.extra["doctor"] = {"model": spec_file.spec.model.name, "warnings": [f.format() for f in findings]}
    progress.say(f"{spec_file.spec.model.name}: no problems that stop compilation ({len(findings)} warning(s))")
    return 0


def _index(args: argparse.Namespace, progress: Progress) -> int:
    if args.action == "stop":
        here = index.STATE_DIR.resolve()
        if index.stop():
            progress.say(f"local index stopped (the one started from this folder: {here})")
            return 0
        elsewhere = [(pid, folder) for pid, folder in index.yours_elsewhere() if folder != here]
        if elsewhere:  # H63: "no local index was started from this folder", exit 0, with one running
            pid, folder = elsewhere[0]
            started_in = folder.parent.parent  # <the folder it was started from>/build/index
            raise UsageError(
                f"no local index was started from this folder ({here}); yours runs from {started_in} (pid {pid})",
                f"stop it there: cd {started_in} && modelwheel index stop (make index-stop in a checkout)",
            )
        progress.say(f"no local index was started from this folder ({here}), and none of yours is running")
        return 0
    port = index.DEFAULT_PORT if args.port is None else args.port
    fallback_url: str = index.FALLBACK_URL if args.fallback_url is None else args.fallback_url
    torch_url: str = args.torch_url or index.TORCH_URL
    private: tuple[str, ...] = tuple(args.private_prefix)
    if args.action == "serve":
        index.serve(
            Path(args.data),
            port,
            fallback_url,
            torch_url,
            listening_fd=args.listening_fd,
            state_dir=Path(args.state_dir),
            private=private,
        )
        return 0
    already = index.read_state()  # H63: a second start reprinted the block, and said nothing of it
    state = already or index.start(
        Path(args.data), port, fallback_url=fallback_url, torch_url=torch_url, private=private
    )
    running = "already running, started from this folder earlier: " if already else ""
    progress.say(f"local index {running}at {state['url']} (pid {state['pid']}, files in {state['data']})")
    progress.say(
        f"  install from it: pip install <name>==<version> --index-url {state['url']}<variant>/simple  "
        "(variant: cpu, or the CUDA build's cuNNN, e.g. cu130)"
    )
    progress.say(
        # the template's {variant} said as the line above says it (a newcomer saw both spellings)
        f"  torch comes from {state.get('torch_url', index.TORCH_URL).replace('{variant}', '<variant>')} "
        "(redirected), every other package "
        f"it does not hold from {state.get('fallback_url', index.FALLBACK_URL) or 'nowhere'}, except "
        f"names starting with {' or '.join(state.get('private', index.PRIVATE_PREFIXES))} (never looked up "
        "elsewhere)"
    )
    progress.say(
        f"  uploads need its password ({index.STATE_DIR / 'upload.secret'}, readable by you alone), "
        "which publish sends by itself"
    )
    progress.say("  stop it: make index-stop in a checkout, else modelwheel index stop")
    return 0


def _wheels_for(spec_file: SpecFile, args: argparse.Namespace, progress: Progress) -> list[Path]:
    """The spec's wheels in dist/, built first when one is missing."""
    spec = spec_file.spec
    for name in spec.build.targets:  # before torch is imported, as a build does (the cpu target's ISA)
        targets.get(name).before_torch(spec.build.options(name), args)
    from .stages.manifest import full_version  # imports torch: the label names its version

    dist = Path(args.dist)
    check_private(dist, "--dist")  # the wheels found there are uploaded as they are
    skipped: list[str] = []  # said only where a build runs: publishing what dist/ holds skips nothing
    args.target = targets.buildable_here(list(spec.build.targets), skipped.append)  # what a build here would make
    wanted = {t: f"{spec.import_name}-{full_version(spec.model.version, t)}-" for t in args.target}
    found = {t: sorted(dist.glob(f"{prefix}*.whl")) for t, prefix in wanted.items()}
    if not all(found.values()):
        progress.say(f"no wheel for {spec.dist_name} {spec.model.version} in {dist}: building it")
        for note in skipped:
            progress.say(note)
        _run_build(spec_file, args, progress)
        found = {t: sorted(dist.glob(f"{prefix}*.whl")) for t, prefix in wanted.items()}
    missing = [f"{prefix}*.whl" for t, prefix in wanted.items() if not found[t]]
    if missing:
        raise PackageError(
            f"the build finished but {dist} holds no {', '.join(missing)}",
            "report this as a bug, with the build's output above",
        )
    return [wheels[-1] for wheels in found.values()]


def _publish(args: argparse.Namespace, progress: Progress) -> int:
    if args.model and args.model.endswith(".whl"):  # H62: read as a model name, "models/dist/….whl/spec.toml"
        # the command as given, the wheel moved to --wheel (H63: a hint without the --index given failed)
        words = list(args.argv)
        words.remove(args.model)
        raise UsageError(
            f"{args.model}: a wheel, given where publish takes a model name",
            f"give wheels with --wheel: modelwheel {shlex.join([*words, '--wheel', args.model])}",
        )
    # the spec, as the wheels below, read before the index is looked for (H62: `publish unet` from /)
    spec_file = None if args.wheel else _spec_from(args, wheels=True)
    # the wheels named checked first: a typo in --wheel was said only after the index was found (H60)
    missing = [w for w in args.wheel or () if not Path(w).is_file()]
    if missing:
        there = wheels_there(Path(missing[0]))  # H63: reproduce named them, publish did not
        raise UsageError(
            # a relative path with the folder it was looked for in (H68 ran it from /)
            "no such wheel: "
            + ", ".join(w if Path(w).is_absolute() else f"{w} (looked for {Path(w).absolute()})" for w in missing),
            f"build it first with {built_by(_spec_path(args))}, or give "
            "the path of one it built" + (f"; {there}" if there else ""),
        )
    index = resolve_index(args.index, args.repository, dict(os.environ), allow_insecure_http=args.allow_insecure_http)
    wheels = [Path(w) for w in args.wheel] if spec_file is None else _wheels_for(spec_file, args, progress)
    with progress.stage("publish", ", ".join(w.name for w in wheels)):
        result = publish(
            wheels, index, progress.say, skip_existing=args.skip_existing, require_report=not args.without_report
        )
    args.extra["published"] = {"uploaded": list(result.uploaded), "existing": list(result.existing)}
    progress.say(f"published {len(result.uploaded)} wheel(s); {len(result.existing)} already on the index")
    return 0


def _matrix(args: argparse.Namespace, progress: Progress) -> int:
    specs = [Path(s) for s in args.spec] if args.spec else spec_paths(Path(args.models))
    if not specs:
        raise UsageError(f"no <model>/spec.toml under {args.models}", "give --models DIR or --spec PATH")
    print(json.dumps(build_matrix(specs, containers=not args.no_containers, note=progress.say), separators=(",", ":")))
    return 0


def _reproduce(args: argparse.Namespace, progress: Progress) -> int:
    """Rebuild the wheel as its build did (_run_build, into a temporary folder) and compare."""
    from .commands import reproduce  # imports torch (it rebuilds)

    plan = reproduce.recipe(Path(args.wheel), args.spec)
    spec_file = reproduce.source(plan)
    work = reproduce.work_folder()
    vars(args).update(
        root=str(plan.root),
        dist=str(work / "dist"),
        build_dir=str(work / "build"),
        no_cache=True,
        target=[plan.target],
        keep_debug=plan.keep_debug,
        forced=plan.forced,
        **plan.rebuild.arguments,
    )
    progress.say(reproduce.announce(plan, work))
    targets.get(plan.target).before_torch(spec_file.spec.build.options(plan.target), args)  # before torch
    reproduce.must_match(plan.manifest)
    _run_build(spec_file, args, progress)
    progress.say(reproduce.verdict(plan, work))  # or NotReproducedError, naming the files that differ
    return 0


def _schema(args: argparse.Namespace, progress: Progress) -> int:
    text = json.dumps(spec_schema(), indent=2) + "\n"
    if args.output is None:
        print(text, end="")
        return 0
    try:
        Path(args.output).write_text(text)
    except OSError as exc:
        raise UsageError(
            f"--output {args.output}: cannot write it: {exc.strerror}",
            "give a file in a folder that exists and that you can write",
        ) from exc
    progress.say(f"wrote the spec's JSON Schema to {args.output}")
    return 0


COMMANDS = {
    "build": _build,
    "doctor": _doctor,
    "index": _index,
    "publish": _publish,
    "matrix": _matrix,
    "reproduce": _reproduce,
    "schema": _schema,
}
