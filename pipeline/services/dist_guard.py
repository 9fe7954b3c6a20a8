"""dist/ keeps the wheel that was tested: a wheel of the same name (model, version, torch, platform)
already there with other contents is the one that was tested, and perhaps published, so a build
that would replace it is refused (--overwrite replaces it).

Checked twice: before the doctor, where the clash can be known already (a kept wheel compiled for
another artifact root, or from other code, weights or spec: its manifest's opt_path or
content_hash is not this build's; or with other options chosen, where this build's choice is
known then), so such a build is not refused only after minutes of searching; and when the wheel
is put in dist/, with its bytes.
"""

from __future__ import annotations

import glob
import platform
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OutputDirError
from .manifest import differences, read_wheel_manifest, record_only, sha256_file
from .wording import under_make

# Flags the refusal's ARGS leave out: the refused wheel waits in the build cache, and with them the
# build would compile and search again (`ARGS="--update-lock --overwrite"` searched 86 s, and put a
# third wheel in dist/), where the lock entry a search wrote already holds its choice.
NOT_AGAIN = ("--overwrite", "--no-cache", "--update-lock")


def overwrite(argv: list[str] | None = None) -> str:
    """--overwrite as the user gives it: through make, in ARGS with the build's other flags (a
    newcomer's `make build MODEL=unet --overwrite` got make's own usage screen, and
    `ARGS="--overwrite"` after `ARGS="--no-search"` dropped --no-search and rebuilt another wheel)."""
    if not under_make():
        return "--overwrite"
    given, args = [], _build_args(argv)
    while args:  # what the make target adds itself: --spec and --target with their values
        arg = args.pop(0)
        if arg in ("--spec", "--target") and args:
            args.pop(0)
        elif arg not in NOT_AGAIN:
            given.append(arg)
    return f'ARGS="{shlex.join([*given, "--overwrite"])}"'


def _build_args(argv: list[str] | None) -> list[str]:
    args = list(sys.argv[1:] if argv is None else argv)
    return args[1:] if args[:1] == ["build"] else args


def not_kept(argv: list[str] | None = None) -> str:
    """The refused build's wheel is stored in the build cache all the same (stages/deliver.py): a
    newcomer's --overwrite after a 3-minute search that chose freezing got the cache's older wheel,
    whose search had stopped on the noise, with no word of it. Another copied the hint's
    `ARGS="--no-cache --overwrite"`, which searched again and put another wheel in dist/."""
    with_it = f"with {overwrite(argv)}"
    again = [flag for flag in NOT_AGAIN[1:] if flag in _build_args(argv)]
    if again and not under_make():
        with_it = f"without {' and '.join(again)}, with --overwrite,"
    return (
        "it is left as it is, and this build's verified wheel is kept in the build cache: the same build "
        f"{with_it} puts it in dist/ from the build cache, without building it again (it was verified when built)"
    )


# What the search chose, alone: the same model, so "bump model.version … for a changed model" did not fit
CHOICE_ONLY = ("compile_options", "compile_search")


def _choice_only(differ: list[str]) -> bool:
    """The manifests differ in what the build chose alone (the lines as differences() words them)."""
    return bool(differ) and all(line.split(":")[0].split(" ")[0] in CHOICE_ONLY for line in differ)


@dataclass(frozen=True)
class KeptAsIs:
    """dist/'s wheel, kept: the same model and options as this build's, its manifest other only in
    the search's record (which candidates were timed)."""

    differs: str  # that difference, as the refusals say one
    sha256: str  # the kept wheel's


def keep_what_was_tested(
    existing: Path, new_wheel: Path, new_sha256: str, existing_sha256: str | None = None
) -> KeptAsIs | None:
    """The late check: ``existing`` (dist/'s file of the new wheel's name) must hold the same bytes
    (None), or the same model with the same options chosen, its manifest other only in the search's
    record: then dist/ keeps its wheel, which serves as well (KeptAsIs). A newcomer's refusal of
    such a wheel said "nothing to do", and every later plain build was refused alike (the lock
    file then held the new record). Anything else is refused. ``existing_sha256``: its sha256, where
    the caller has it (an 85 MB CUDA wheel is read once)."""
    if existing_sha256 is None:
        existing_sha256 = sha256_file(existing) if existing.is_file() else new_sha256
    if existing_sha256 == new_sha256:
        return None
    kept, made = read_wheel_manifest(existing), read_wheel_manifest(new_wheel)
    differ = differences(kept, made) if kept is not None and made is not None else []
    if kept is not None and made is not None and record_only(kept, made):
        return KeptAsIs(differ[0], existing_sha256)
    hashes = f"sha256 {existing_sha256[:16]}…, this build's {new_sha256[:16]}…"
    raise refusal(existing, hashes, differ, other_root(kept, made), not_kept(), _from_checkpoint(made or kept))


def refuse_early(
    dist_dir: Path,
    import_name: str,
    full_version: str,
    opt_path: Path,
    content_hash: str,
    chosen: tuple[str, str] | None = None,
    choice_note: str = "",
) -> None:
    """The early check, before the doctor: a wheel in dist/ of this name and version (target and
    torch are in the version), made on a machine like this one (so the platform tag the compile
    gives is the same, and so the wheel's file name), compiled for another /opt path or from other
    code, weights or spec (its manifest's content_hash), or with other options chosen than this
    build's, where they are known before the doctor (``chosen``: the search off, or a lock's entry,
    with the machine kind this build runs kernels for): the late check would refuse this build's
    wheel, after minutes of search (H65: `--no-search` after a search that chose freezing was
    refused once its wheel was made). A kept wheel for another CPU kind is left to the late
    check, which names that difference first. ``choice_note``: added to the hint where the choice
    alone differs (H67: `--no-search` was offered another --dist or --overwrite, not the quick way)."""
    pattern = f"{glob.escape(import_name)}-{glob.escape(full_version)}-py3-none-*_{platform.machine()}.whl"
    for existing in sorted(dist_dir.glob(pattern)):
        kept = read_wheel_manifest(existing)
        if not kept or not _made_like_here(kept):
            continue
        made: dict[str, Any] = {"opt_path": str(opt_path), "content_hash": content_hash}
        kept_choice = (kept.get("compile_search") or {}).get("chosen")
        kept_kind = (kept.get("platform") or {}).get("cpu_capability")
        if chosen and kept_choice and kept_choice != chosen[0] and kept_kind in (None, chosen[1]):
            # the choice alone, said as the late check says it
            made["compile_search"], kept = {"chosen": chosen[0]}, {**kept, "compile_search": {"chosen": kept_choice}}
        compared = {key: kept[key] for key in made if kept.get(key) is not None}
        checkpoint = _from_checkpoint(kept)
        differ = [_content_named(line, checkpoint) for line in differences(compared, {k: made[k] for k in compared})]
        if differ:
            stopped = "it is left as it is, and this build stops here, before the doctor (it wrote nothing)"
            hashes = f"sha256 {sha256_file(existing)[:16]}…"
            refused = refusal(existing, hashes, differ, other_root(kept, made), stopped, checkpoint)
            if choice_note and _choice_only(differ):
                refused.hint += f"; {choice_note}"
            raise refused


def _content_named(described: str, checkpoint: bool = False) -> str:
    """content_hash said as what it hashes: for a --hf build, its folder and override spec (H67 read
    "the model's code, weights or spec" where only its --spec had changed)."""
    if not described.startswith("content_hash"):
        return described
    what = "the checkpoint folder's files or the override spec" if checkpoint else "the model's code, weights or spec"
    kept, _, new = described.removeprefix("content_hash: ").partition(" in the kept wheel, ")
    return (
        f"{what} (content_hash {kept[:16]}… in the kept wheel, {new[:16]}… in this build)"
        if new
        else f"{what} (content_hash)"
    )


def _made_like_here(kept: dict[str, Any]) -> bool:
    """The kept wheel was compiled on this machine's kind and glibc: a build here names its wheel alike."""
    facts = kept.get("platform") or {}
    return facts.get("machine") == platform.machine() and facts.get("glibc") == platform.libc_ver()[1]


def _from_checkpoint(manifest: dict[str, Any] | None) -> bool:
    """A --hf build's wheel: its version comes from --version, not from a spec's model.version."""
    return bool((manifest or {}).get("checkpoint"))


def refusal(
    existing: Path, hashes: str, differ: list[str], root_hint: str, outcome: str, checkpoint: bool = False
) -> OutputDirError:
    """The same refusal, early or late: what is kept, what differs, and how to go on. ``checkpoint``:
    a --hf build's, told to bump --version (H66 was told "model.version in the spec", which it had not)."""
    # another CPU kind (--cpu-isa avx2 beside a native build): the same model, so not "bump the version"
    for_other_machines = any(line.split(":")[0] == "platform" for line in differ)
    choice_only = _choice_only(differ)
    if for_other_machines:
        lead = "the two are for other machines (another CPU kind): "
    elif choice_only:  # a lock entry, or a search on a noisy machine, chose other options
        lead = "the two are the same model with other compile options chosen: "
    elif checkpoint:
        lead = "bump --version for a changed model (a --hf build's version is the one --version gives), "
    else:
        lead = "bump model.version in the spec (or --version) for a changed model, "
    return OutputDirError(
        f"{existing} already holds a different build of this version ({hashes})"
        + (f"; their manifests differ in {'; '.join(differ)}" if differ else "")
        + f"; {outcome}",
        root_hint or f"{lead}build into another --dist to keep both, or pass {overwrite()} to replace it",
    )


def other_root(kept: dict[str, Any] | None, made: dict[str, Any] | None) -> str:
    """The hint where the kept wheel was compiled for another root ('' otherwise): a wheel holds the
    /opt path it was compiled at, <root>/<model>/<version>/<target>, so a root of its own is another wheel."""
    if not kept or not made or kept.get("opt_path") == made.get("opt_path"):
        return ""
    folders = Path(str(kept.get("opt_path"))).parents
    if len(folders) < 3:
        return ""
    return (
        f"the kept wheel was built for the artifact root {folders[2]}: build with --root {folders[2]} to remake it, "
        f"into another --dist to keep both, or pass {overwrite()} to replace it with this root's build"
    )
