"""The command line's shape: every command, flag and help text of `modelwheel` (handlers.py runs them)."""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import sys

from . import targets

DEFAULT_ROOT = "/opt/modelwheel"
ROOT_ENV = "MODELWHEEL_ROOT"
# The build flags the targets added (parser() fills it): a parallel build passes them on.
TARGET_FLAGS: list[argparse.Action] = []


DOCS_NOTE = "docs/… names a guide in modelwheel's source repository (the docs folder of its checkout)."


def _version() -> str:
    try:
        return importlib.metadata.version("modelwheel")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: running from a checkout)"


def _common_flags(json_help: str | None = None) -> argparse.ArgumentParser:
    """-v and -q (and --json) wherever a user puts them: before the command or after it.
    SUPPRESS as the default keeps a command's parser from resetting what the top level set."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log subprocess commands and show tracebacks",
    )
    common.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="print only the result, or the error"
    )
    if json_help:
        common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    return common


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, where a flag no command knows gets that command's usage and the flag it
    likely meant (`build --no-serch` got the top-level usage and no suggestion)."""
    top = parser()
    [commands] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
    if words and words[0] not in commands.choices:  # argparse's "invalid choice" names no likely one
        near = difflib.get_close_matches(words[0], list(commands.choices), n=1, cutoff=0.6)
        if near:
            top.error(f"no command {words[0]!r} (did you mean {near[0]}?); the commands: {', '.join(commands.choices)}")
    args, unknown = top.parse_known_args(argv)
    if unknown:
        command = commands.choices[args.command]
        flags = [flag for action in command._actions for flag in action.option_strings]
        guesses = [difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.7) for word in unknown]
        meant = [f"{word} (did you mean {guess[0]}?)" if guess else word for word, guess in zip(unknown, guesses)]
        command.error(f"unrecognized arguments: {' '.join(meant)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a hint that repeats the command keeps them
    return args


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelwheel",
        description="Build compiled PyTorch models into wheels.",
        parents=[_common_flags()],
        epilog="`python -m pipeline` is the same command, from a checkout.",
    )
    parser.set_defaults(verbose=False, quiet=False, json=False)
    parser.add_argument("--version", action="version", version=f"modelwheel {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    what = (
        "export, compile, verify and package models into wheels: one or more specs (--spec, repeated: built "
        "in parallel), or a transformers or diffusers folder (--hf)"
    )
    build = commands.add_parser(
        "build",
        help=what,
        description=what[0].upper() + what[1:] + ".",
        parents=[
            _common_flags("print one JSON record of the build on stdout (docs/how-a-build-works.md#the-json-record)")
        ],
    )
    build.add_argument(
        "--spec",
        action="append",
        help="path to a model's spec.toml (or its folder); repeat to build several in parallel; with "
        "--hf, keys that override the ones made from the checkpoint",
    )
    build.add_argument(
        "--hf",
        metavar="DIR",
        help="build a transformers or diffusers save_pretrained folder, no code needed (needs --task, "
        "--name, --version; docs/library-models.md)",
    )
    build.add_argument(
        "--task",
        help="with --hf: image-classification, object-detection, semantic-segmentation, "
        "feature-extraction, text-generation or denoising (--task help lists them)",
    )
    build.add_argument("--name", help="with --hf: the model's name (the wheel is model-<name>)")
    build.add_argument("-j", "--jobs", type=int, default=None, help="parallel builds (default: the machine's cores)")
    build.add_argument(
        "--root",
        default=None,
        help=f"absolute artifact root the .so is compiled under (default: ${ROOT_ENV} or {DEFAULT_ROOT})",
    )
    build.add_argument("--dist", default="dist", help="where the wheel and its report go (default: dist)")
    build.add_argument("--build-dir", default="build", help="work folder: traces, generated sources (default: build)")
    build.add_argument(
        "--weights", help="build with this .safetensors file instead of the spec's weights (needs --version)"
    )
    build.add_argument("--version", help="build as this version instead of the spec's model.version")
    build.add_argument(
        "--no-cache",
        action="store_true",
        help="rebuild everything, taking no compiled model or wheel from build/cache (its reports of earlier timings "
        "still advise the option search)",
    )
    build.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a wheel of the same name in --dist even where its contents differ (default: refused, "
        "as that wheel is the one that was tested)",
    )
    build.add_argument(
        "--target",
        action="append",
        choices=targets.names(),
        help="build this target instead of the spec's [build] targets (repeatable)",
    )
    TARGET_FLAGS.clear()
    for target in targets.all():  # each target's own flags (the cpu target's --cpu-isa)
        TARGET_FLAGS.extend(target.add_arguments(build))
    build.add_argument(
        "--no-search",
        action="store_true",
        help="compile the spec's own options once, with no compile-option search, as `[compile] search = false` "
        "does (a quicker first build; spec.lock.json is neither used nor written: a build says where it has an "
        "entry it leaves unused)",
    )
    build.add_argument(
        "--update-lock",
        action="store_true",
        help="run the compile-option search even where the spec's lock file (spec.lock.json beside it) "
        "has this build's entry, and write its choice there (docs/how-a-build-works.md)",
    )
    build.add_argument(
        "--keep-debug",
        action="store_true",
        help="ship the .so with its debug info (by default strip --strip-debug removes it: the tiny test model's "
        ".so goes from 1.55 to 0.39 MB; the weights a .so holds are not debug info, so a large model's shrinks far "
        "less in proportion)",
    )
    build.add_argument("--json-out", help=argparse.SUPPRESS)  # where a parallel build's child writes its record
    doctor = commands.add_parser(
        "doctor",
        help="check a model against the practices that make compilation work",
        parents=[_common_flags("print one JSON record of the findings on stdout")],
    )
    doctor.add_argument("model", nargs="?", help="a model under models/ (e.g. unet)")
    doctor.add_argument("--spec", help="path to a spec.toml (instead of a model name)")
    index = commands.add_parser(
        "index", help="the embedded package index (pypiserver on 127.0.0.1)", parents=[_common_flags()]
    )
    index.add_argument("action", choices=["start", "stop", "serve"])
    index.add_argument("--port", type=int, default=None, help="default: 8765; 0 picks a free port")
    index.add_argument("--data", default="build/index/data", help="where the index keeps its files")
    index.add_argument(
        "--listening-fd", type=int, default=None, help=argparse.SUPPRESS
    )  # `start` hands `serve` its socket
    index.add_argument("--state-dir", default="build/index", help=argparse.SUPPRESS)  # ...and where its password is
    index.add_argument(
        "--private-prefix",
        action="append",
        default=[],
        help="names starting with it are never sent to another index, as model- never is "
        "(a missing one answers 404); may be repeated",
    )
    index.add_argument(
        "--torch-url",
        default=None,
        help="where torch comes from when the index holds none, {variant} standing for cpu or cuNNN "
        "(default: PyTorch's own index, https://download.pytorch.org/whl/{variant}/)",
    )
    index.add_argument(
        "--fallback-url",
        default=None,
        help='where every other package the index does not hold comes from (default: PyPI; "" for nowhere)',
    )
    publish = commands.add_parser(
        "publish",
        help="check and upload wheels (building first if needed)",
        parents=[_common_flags("print one JSON record of what was uploaded on stdout")],
    )
    publish.add_argument("model", nargs="?", help="a model under models/ (e.g. unet)")
    publish.add_argument("--spec", help="path to a spec.toml (instead of a model name)")
    publish.add_argument(
        "--wheel",
        nargs="+",
        help="upload these wheels, as they are, instead of the model's from dist/ (a model name or --spec given "
        "too, as make publish gives one, is then not read)",
    )
    publish.add_argument(
        "--index", help=f"index URL (may hold {{target}}); default ${'{'}MODELWHEEL_INDEX_URL{'}'} or the local index"
    )
    publish.add_argument("--repository", help="a ~/.pypirc section to upload to (may hold {target})")
    publish.add_argument(
        "--skip-existing",
        action="store_true",
        help="a wheel the index already has byte for byte (same sha256) is left as it is, and the "
        "command succeeds: for re-running a release; a different file under its name is still refused",
    )
    publish.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="let plain http (and the credentials sent with it) reach a host outside loopback; "
        "only for a network you trust, as pip's --trusted-host",
    )
    publish.add_argument(
        "--without-report",
        action="store_true",
        help="publish a wheel built elsewhere, without the build's report beside it (checked then "
        "by its RECORD and manifest alone); by default a wheel needs its report",
    )
    # said: a newcomer passed the build's --root to be safe, not knowing publish needs it only to build
    publish.add_argument(
        "--dist", default="dist", help="where the wheels are taken from, and a missing one built to (default: dist)"
    )
    publish.add_argument(
        "--root",
        default=None,
        help=f"the artifact root for building a missing wheel, not needed for wheels --dist holds (default: "
        f"${ROOT_ENV} or {DEFAULT_ROOT})",
    )
    publish.add_argument(
        "--build-dir", default="build", help="the work folder for building a missing wheel (default: build)"
    )
    reproduce = commands.add_parser(
        "reproduce",
        parents=[_common_flags()],
        help="rebuild a wheel from its source and the options it records, and say whether it is identical",
        description="Rebuild WHEEL from the spec its report names (or --spec), with the options, CPU kind and root "
        "it records, into a temporary folder, and compare: `identical`, or the files inside the wheel "
        "that differ (exit 28). torch, the compiler and the CPU kind must match the build's "
        "(docs/how-a-build-works.md#reproducible-wheels).",
    )
    reproduce.add_argument("wheel", help="a wheel modelwheel built (its report beside it names the spec)")
    reproduce.add_argument("--spec", help="the spec to rebuild it from (default: the one the report beside it names)")
    schema = commands.add_parser(
        "schema",
        parents=[_common_flags()],
        help="print the JSON Schema of spec.toml, for editors (docs/quickstart.md#in-your-editor)",
        description="Print the JSON Schema (draft-07) of a spec.toml file, generated from the "
        "models the build checks specs with, for your editor's TOML extension "
        "(docs/quickstart.md#in-your-editor).",
    )
    schema.add_argument("-o", "--output", metavar="FILE", help="write it to FILE instead of printing it")
    matrix = commands.add_parser(
        "matrix",
        help="print the CI build matrix (models x targets) as JSON",
        description="Print the CI build matrix, one job per model and target, as JSON: what the release "
        "workflow builds (docs/publishing.md).",
        parents=[_common_flags()],
    )
    matrix.add_argument(
        "--spec", action="append", help="a spec.toml to include (repeatable; default: every models/*/spec.toml)"
    )
    matrix.add_argument("--models", default="models", help="the folder of <model>/spec.toml files (default: models)")
    matrix.add_argument(
        "--no-containers",
        action="store_true",
        help="run every job on its runner itself, not in the target's container (a local run under act)",
    )
    # the tool installed with pip has no docs/ beside it: a newcomer looked for the files its help named
    for command in commands.choices.values():
        command.epilog = DOCS_NOTE
    parser.epilog = f"{parser.epilog} {DOCS_NOTE}"
    return parser
