"""Stage 4: render the wheel template around the verified artifacts and build a reproducible wheel."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import shutil
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from .. import targets
from ..errors import PackageError
from ..services import proc
from ..services.manifest import dumps, sha256_file
from ..services.templates import RUNTIME_DIR, WHEEL_TEMPLATE
from ..targets import Target
from ..wheel_template.runtime import _targets as wheel_targets
from ..wheel_template.runtime._schema import Manifest

# Fixed zip timestamps (1980-01-01, the earliest a zip can hold) make the wheel byte-reproducible.
SOURCE_DATE_EPOCH = "315532800"
TORCH_INDEX = "https://download.pytorch.org/whl"  # PyTorch's index, one per build variant (/cpu, /cu130)
MANYLINUX_FLOOR = 28  # torch's own wheels need glibc 2.28
# The symbol versions auditwheel's manylinux policies list: glibc's, libstdc++'s and libgcc's.
VERSIONED_SYMBOL = re.compile(rb"\b(GLIBC|GLIBCXX|CXXABI|GCC)_(\d+(?:\.\d+)+)\b")
# The oldest Python the runtime's own code runs on: str.removeprefix, dict | dict, and list[str]
# in __init__.py's annotations (evaluated there) are 3.9; it uses no match, tomllib or X | Y
# outside annotations (every other module has `from __future__ import annotations`).
RUNTIME_PYTHON = "3.9"


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str
    size: int
    platform_tag: str


def platform_tag(artifacts: list[Path], machine: str) -> str:
    """A first guess at the tag audited_tag() then checks on the built wheel: the oldest manylinux
    policy in auditwheel's own table (not older than torch's glibc) whose symbol versions cover every
    one the artifacts reference. A wrong guess costs building the wheel a second time."""
    needed = {
        (family.decode(), version.decode())
        for path in artifacts
        for family, version in VERSIONED_SYMBOL.findall(path.read_bytes())
    }
    for glibc_minor, policy in _manylinux_policies():
        versions = policy["symbol_versions"].get(machine, {})
        if glibc_minor >= MANYLINUX_FLOOR and all(version in versions.get(family, ()) for family, version in needed):
            return f"{policy['name']}_{machine}"
    return f"manylinux_2_{MANYLINUX_FLOOR}_{machine}"


def _manylinux_policies() -> list[tuple[int, dict[str, Any]]]:
    """auditwheel's manylinux policies, oldest glibc first."""
    table = json.loads((importlib.resources.files("auditwheel.policy") / "manylinux-policy.json").read_text())
    found = [
        (int(match[1]), policy) for policy in table if (match := re.fullmatch(r"manylinux_2_(\d+)", policy["name"]))
    ]
    return sorted(found, key=lambda pair: pair[0])


def torch_libraries(target: Target) -> set[str]:
    """Shared libraries the pinned torch brings: libtorch_cpu.so, libc10.so, its libgomp.so.1, and
    those of the target's torch build (on CUDA, the nvidia-* packages' and the driver's libcuda)."""
    import torch  # heavy: the commands that read this module's constants (summary) start without it

    return {lib.name for lib in (Path(torch.__file__).parent / "lib").rglob("*.so*")} | target.provided_libraries()


def audited_tag(wheel: Path, target: Target) -> str:
    """The platform tag auditwheel gives the wheel (its symbol-version policy: glibc and
    libstdc++), with the libraries torch brings excluded, as pip installs them with the pinned
    torch. A library neither the manylinux baseline nor torch provides is refused."""
    output = proc.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", "--disable-isa-ext-check", str(wheel)],
        error=PackageError,
        what="auditwheel show",
        hint="auditwheel could not read the wheel; the output above says why",
    )
    lines = output.splitlines()  # its warnings (a .cubin "with unknown architecture") come first
    facts = json.loads("\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("{")) :]))
    foreign = sorted(set(facts["external_libs"]) - torch_libraries(target))
    if foreign:
        raise PackageError(
            f"the compiled model needs shared libraries that neither the manylinux baseline nor torch "
            f"provides: {', '.join(foreign)}",
            "remove the dependency from the model (compile options, custom ops), or install them where it runs",
        )
    tag: str = facts["sym_tag"]
    return tag


def requires_python() -> str:
    """The wheel's Requires-Python: the runtime's floor, or the pinned torch's own Requires-Python
    where that is stricter (torch 2.11 to 2.14 need 3.10): a wheel claiming less would be chosen
    by pip on a Python where its torch cannot install."""
    declared: list[str] = importlib.metadata.metadata("torch").get_all("Requires-Python") or []
    torch_needs = declared[0] if declared else ""
    if torch_needs and not SpecifierSet(torch_needs).contains(RUNTIME_PYTHON):
        return torch_needs
    return f">={RUNTIME_PYTHON}"


def project_links(manifest: Manifest) -> tuple[str, str]:
    """The pyproject lines for the spec's optional license and URLs ("" for each one not given);
    JSON strings are valid TOML basic strings."""
    license_line = f"license = {json.dumps(manifest['license'])}\n" if manifest.get("license") else ""
    urls = manifest.get("urls") or {}
    table = "".join(f"{json.dumps(label)} = {json.dumps(url)}\n" for label, url in urls.items())
    return license_line, f"\n[project.urls]\n{table}" if table else ""


def _render(template: Path, destination: Path, values: dict[str, str]) -> None:
    destination.write_text(string.Template(template.read_text()).substitute(values))


def _stage(staging: Path, manifest: Manifest, artifacts: list[Path], extras: list[Path], tag: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    package_dir = staging / manifest["import_name"]
    (package_dir / "artifacts").mkdir(parents=True)
    for source in [*sorted(RUNTIME_DIR.glob("*.py")), RUNTIME_DIR / "py.typed"]:  # py.typed: the runtime is typed
        if not source.name.startswith(wheel_targets.module_name("")):  # every target's but its own
            shutil.copyfile(source, package_dir / source.name)
    runtime_side = targets.get(manifest["target"]).RUNTIME_FILE
    shutil.copyfile(runtime_side, package_dir / f"{wheel_targets.module_name(manifest['target'])}.py")
    for artifact in artifacts:  # static batch sizes' in their own folders (batch<N>/model.so)
        name = (
            artifact.relative_to(manifest["opt_path"])
            if artifact.is_relative_to(manifest["opt_path"])
            else artifact.name
        )
        (package_dir / "artifacts" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifact, package_dir / "artifacts" / name)
    for extra in extras:  # golden cases, external weights
        shutil.copyfile(extra, package_dir / extra.name)
    (package_dir / "manifest.json").write_text(dumps(manifest))
    license_line, urls_table = project_links(manifest)
    values = {
        "dist_name": manifest["dist_name"],
        "import_name": manifest["import_name"],
        "full_version": manifest["full_version"],
        "version": manifest["version"],
        "variant": manifest["variant"],
        "torch_index": f"{TORCH_INDEX}/{manifest['variant']}",
        "torch_version": manifest["torch"]["distribution"],
        "summary": (manifest["description"] or f"Compiled PyTorch model {manifest['name']}").replace('"', "'"),
        "platform_tag": tag,
        "checkpoint_note": checkpoint_note(manifest),
        "requires_python": requires_python(),
        "license_line": license_line,
        "urls_table": urls_table,
        "package_data": json.dumps(
            ["manifest.json", "py.typed", "artifacts/*", "artifacts/*/*", *sorted(extra.name for extra in extras)]
        ),
        "target": manifest["target"],
        "link_note": (
            f"It loads from its own folder in site-packages and writes nothing (`{manifest['dist_name']} link` "
            f"makes the `{manifest['opt_path']}` link only if asked; CUDA wheels use it)."
            if manifest["relocatable"]
            else f"`load()` reaches it through the `{manifest['opt_path']}` link, made where the process may write "
            f"there (else it loads from site-packages); `{manifest['dist_name']} link` makes it ahead, "
            "e.g. as root in a Dockerfile step."
        ),
        # load_numpy() only where the target's runtime has it (a CUDA wheel's README offered it, which refuses)
        "numpy_note": (
            f"Without importing torch (numpy arrays in and out, a faster start): "
            f"`model = {manifest['import_name']}.load_numpy()`, "
            f"then `outputs = model(*{manifest['import_name']}.example_arrays())`.\n\n"
            if targets.runtime(targets.get(manifest["target"])).NUMPY
            else ""
        ),
        "inputs_summary": ", ".join(f"`{i['name']}` {i['dtype']}{list(i['shape'])}" for i in manifest["inputs"]),
        "outputs_summary": ", ".join(
            f"`{o['name']}` {o['dtype']} (rtol {o['rtol']:g}, atol {o['atol']:g})" for o in manifest["outputs"]
        ),
    }
    _render(WHEEL_TEMPLATE / "pyproject.toml.in", staging / "pyproject.toml", values)
    _render(WHEEL_TEMPLATE / "setup.py.in", staging / "setup.py", values)
    _render(WHEEL_TEMPLATE / "README.md.in", staging / "README.md", values)
    # The zip stores file modes: make them independent of the umask and the compiler's choices.
    for path in staging.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() or path.suffix == ".so" else 0o644)


def checkpoint_note(manifest: Manifest) -> str:
    """The README's line naming the save_pretrained folder a wheel was built from (none for a factory's)."""
    found = manifest.get("checkpoint")
    return (
        ""
        if not found
        else (
            f"\n\nBuilt from the save_pretrained folder `{found['folder']}`: {found['library']} {found['class']}, "
            f"task {found['task']}, config.json sha256 `{found['config_sha256']}`."
        )
    )


def package_wheel(manifest: Manifest, artifacts: list[Path], extras: list[Path], work_dir: Path) -> Wheel:
    """Build the wheel into ``work_dir/wheel``; the caller moves it into dist/ once all is done."""
    staging = work_dir / "wheel-src"
    out_dir = work_dir / "wheel"
    tag = platform_tag(artifacts, manifest["platform"]["machine"])
    wheel = _build_wheel(staging, out_dir, manifest, artifacts, extras, tag)
    audited = audited_tag(wheel, targets.get(manifest["target"]))
    if audited != tag:  # e.g. libstdc++'s GLIBCXX_3.4.30 needs glibc 2.35 systems
        tag = audited
        wheel = _build_wheel(staging, out_dir, manifest, artifacts, extras, tag)
    return Wheel(path=wheel, sha256=sha256_file(wheel), size=wheel.stat().st_size, platform_tag=tag)


def _build_wheel(
    staging: Path, out_dir: Path, manifest: Manifest, artifacts: list[Path], extras: list[Path], tag: str
) -> Path:
    shutil.rmtree(out_dir, ignore_errors=True)
    _stage(staging, manifest, artifacts, extras, tag)
    proc.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(out_dir),
            str(staging),
        ],
        error=PackageError,
        what="building the wheel",
        hint="the wheel template under templates/wheel/ or setuptools is broken; the output above says where",
        env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
    )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise PackageError(f"expected one wheel in {out_dir}, found {[w.name for w in wheels]}", "report this as a bug")
    return wheels[0]
