"""`modelwheel reproduce WHEEL`: rebuild a wheel from its source and the records it carries, then
compare it, file by file, with the wheel.

What the rebuild takes from the wheel: its target, the CPU kind it was built for, the root its
.so was compiled under (its bytes record that path) and the compile options its manifest records
(no option search: its timings would decide). From the source: the spec the report beside the
wheel names (or ``--spec``), with the model code and weights it names. It builds into a fresh
temporary folder (work folder, build cache, dist/), so nothing cached is reused, and it must run
with the wheel's torch; the compiler and the CPU kind must match too (docs/how-a-build-works.md).

Reading the wheel needs no torch: the CPU kind is selected before torch is imported.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import targets
from ..errors import NotReproducedError, UnverifiedWheelError, UsageError
from ..features.lock import Locked
from ..spec import SpecFile, checkpoint_spec, load_spec, with_overrides
from ..stages.compile import find_cxx
from ..targets.views import Rebuild
from .wheel_check import wheels_there


@dataclass(frozen=True)
class Recipe:
    """What a rebuild of ``wheel`` uses."""

    wheel: Path
    manifest: dict[str, Any]
    spec: Path
    target: str
    root: Path
    rebuild: Rebuild  # what its target builds it again with (a CPU wheel's CPU kind), and says of it
    checkpoint: dict[str, Any] | None  # a --hf build's folder and task (the report's), else None
    forced: Locked  # the options the manifest records, as a lock entry: one candidate, no search
    keep_debug: bool  # built with --keep-debug (the report says; without a report, stripped as by default)


def read_wheel_manifest(wheel: Path) -> dict[str, Any]:
    """``<import_name>/manifest.json`` inside the wheel."""
    if not wheel.is_file():  # a wheel name copied from the docs, with another machine's tag
        # a usage error, as publish's for the same mistake (H60: exit 15 read as an altered wheel)
        raise UsageError(
            f"{wheel}: no such file",
            wheels_there(wheel) or f"{wheel.parent} holds no wheel: give the path of one modelwheel built",
        )
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/manifest.json")]
            manifest = json.loads(archive.read(names[0])) if len(names) == 1 else None
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise UnverifiedWheelError(f"{wheel}: not a readable wheel: {exc}", "give a wheel modelwheel built") from None
    if not isinstance(manifest, dict) or not {"import_name", "full_version", "target", "opt_path", "torch"} <= set(
        manifest
    ):
        raise UnverifiedWheelError(
            f"{wheel}: holds no modelwheel manifest (<package>/manifest.json) to rebuild it from",
            "give a wheel modelwheel built",
        )
    return manifest


def recipe(wheel: Path, spec: str | None) -> Recipe:
    manifest = read_wheel_manifest(wheel)
    report_path = wheel.with_name(f"{manifest['import_name']}-{manifest['full_version']}.report.json")
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    spec_path = Path(spec) if spec else Path(report["spec"]) if report.get("spec") else None
    if spec_path is None:
        raise UsageError(
            f"{wheel.name}: no spec to rebuild it from: {report_path.name} is not beside it, or names none",
            "give the spec it was built from with --spec PATH",
        )
    search = manifest.get("compile_search") or {}
    chosen = search.get("chosen", "spec-options")
    options = next(
        (c["options"] for c in search.get("candidates", []) if c["name"] == chosen), manifest.get("compile_options", {})
    )
    opt_path = Path(manifest["opt_path"])  # <root>/<model>/<version>/<target> (outdir.output_path)
    return Recipe(
        wheel=wheel,
        manifest=manifest,
        spec=spec_path,
        target=manifest["target"],
        root=opt_path.parents[2],
        rebuild=targets.get(manifest["target"]).rebuild(manifest),
        forced=Locked(wheel, chosen, dict(options), {k: v for k, v in search.items() if k != "chosen"}),
        keep_debug=report.get("debug_info") == "kept",
        checkpoint=report.get("checkpoint") if "checkpoint" in manifest else None,
    )


def source(recipe: Recipe) -> SpecFile:
    """The spec the wheel was built from. A --hf build's is made again from its folder, as `build
    --hf` made it, with the override spec it was given, if any: its report names the folder's
    config.json, which was read as a spec (a newcomer's ViT got "config.json: not valid TOML")."""
    if recipe.checkpoint is None:
        spec_file = load_spec(recipe.spec)
        version = recipe.manifest["version"]
        # built with --version: the wheel's version, as that build took it (H48: the spec's 1.3 was
        # rebuilt for a 1.4 wheel, and every file differed)
        return spec_file if spec_file.spec.model.version == version else with_overrides(spec_file, version=version)
    folder = Path(recipe.checkpoint["path"])
    overrides = None if recipe.spec == folder / "config.json" else str(recipe.spec)
    name, version = recipe.manifest["name"], recipe.manifest["version"]
    return checkpoint_spec(str(folder), recipe.checkpoint["task"], name=name, version=version, spec=overrides)


def must_match(manifest: dict[str, Any]) -> None:
    """Refuse a rebuild that cannot give the same wheel here: another torch names another wheel."""
    import torch

    built_with = manifest["torch"]["version"]
    if torch.__version__ != built_with:
        raise UsageError(
            f"the wheel was built with torch {built_with}; this is torch {torch.__version__}, whose rebuild "
            "is another wheel (its name and pin say the torch)",
            f"run reproduce where torch {built_with} is installed (a venv with that torch)",
        )


def differences(wheel: Path, rebuilt: Path) -> list[str]:
    """The files, in the wheel's order, whose bytes differ from the rebuild's (or that one of them
    lacks): all of them, where naming the first named the manifest (which records the others'
    sha256) and hid the .so that made it differ. ["the zip archive itself"] where every file is
    the same but the archives are not; [] where the two are the same bytes."""
    if wheel.read_bytes() == rebuilt.read_bytes():
        return []
    with zipfile.ZipFile(wheel) as ours, zipfile.ZipFile(rebuilt) as theirs:
        names, rebuilt_names = ours.namelist(), theirs.namelist()
        differ = [
            name
            for name in names + [n for n in rebuilt_names if n not in names]
            if name not in names or name not in rebuilt_names or ours.read(name) != theirs.read(name)
        ]
    return differ or ["the zip archive itself (its member order, timestamps or modes)"]


def work_folder() -> Path:
    """A fresh folder for the rebuild's work files, build cache and dist/: nothing cached is reused."""
    return Path(tempfile.mkdtemp(prefix="modelwheel-reproduce-"))


def source_said(recipe: Recipe) -> str:
    """What the wheel is rebuilt from, as the lines say it: a --hf build's checkpoint folder first,
    with its override spec (H47: "its rebuild from …/overrides.toml" named a two-line file, and not
    the folder that holds the model)."""
    if recipe.checkpoint is None:
        return str(recipe.spec)
    folder = Path(recipe.checkpoint["path"])
    if recipe.spec == folder / "config.json":
        return str(folder)
    return f"{folder} (with the override spec {recipe.spec})"


def announce(recipe: Recipe, work: Path) -> str:
    return (
        f"rebuilding {recipe.wheel.name} from {source_said(recipe)} in {work} (removed if identical, kept if not; "
        f"{recipe.target}, {recipe.rebuild.said}, "
        f"root {recipe.root}, the compile options the wheel records ({recipe.forced.chosen}): no option search)"
    )


def verdict(recipe: Recipe, work: Path) -> str:
    """``identical: ...`` (the rebuild's folder removed), or NotReproducedError naming the files
    that differ (the rebuild kept, to look at)."""
    rebuilt = next((work / "dist").glob("*.whl"))
    differs = differences(recipe.wheel, rebuilt)
    if not differs:
        shutil.rmtree(work, ignore_errors=True)
        return f"identical: {recipe.wheel.name} is byte for byte its rebuild from {source_said(recipe)}"
    report = recipe.wheel.with_name(f"{recipe.manifest['import_name']}-{recipe.manifest['full_version']}.report.json")
    recorded = json.loads(report.read_text()).get("compiler") if report.is_file() else None
    cxx = find_cxx()
    compilers = (
        f"the compiler it was built with ({recorded}) and this one ({cxx})"
        if recorded and recorded != cxx
        else f"the compiler ({cxx})"
    )
    raise NotReproducedError(
        f"{recipe.wheel.name} is not identical to its rebuild from {source_said(recipe)}: "
        + ("the files that differ: " if len(differs) > 1 else "the file that differs: ")
        + f"{', '.join(differs)} (the rebuild is kept: {rebuilt})",
        f"a changed spec, model code or weights, or another modelwheel (the runtime files every wheel carries), make "
        f"another wheel; else compare what must match: torch, {compilers}, {recipe.rebuild.must_match}",
    )
