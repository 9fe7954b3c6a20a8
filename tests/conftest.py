"""Shared fixtures: run the CLI as a user does, build the tiny model once, make fresh virtualenvs."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipeline.errors import SpecError
from pipeline.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
TINY_SPEC = REPO / "tests" / "models" / "tiny" / "spec.toml"
BROKEN = REPO / "tests" / "models" / "broken"


def _forget_the_calling_make() -> None:
    """`make test ARGS="..."` exports its command-line variables (ARGS, MODEL, ...) to pytest and,
    through MAKEFLAGS, to every make a test starts: the release workflow's `make build` then
    passed pytest's ARGS to modelwheel. The commands the tests run must see what a user's shell or
    a CI runner gives them, not this make's."""
    _, _, overrides = os.environ.get("MAKEFLAGS", "").partition(" -- ")
    for name in re.findall(r"(?:^|(?<!\\) )([^\s=]+)=", overrides):  # make escapes a space in a value: "\ "
        os.environ.pop(name, None)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MODELWHEEL_MAKE_TARGET"):
        os.environ.pop(name, None)


_forget_the_calling_make()

# The files whose tests take longest (their builds, searches and venvs: `--durations` of a
# two-worker fresh-clone run), run first. Each of make test's two workers takes a whole file at a
# time; a long file left for the end keeps one worker busy while the other has nothing left to do.
LONGEST_FIRST = (  # by their wall seconds in a fresh-clone run on a 2-core machine (2026-11-28)
    "test_lock.py",
    "test_reproduce.py",
    "test_tune.py",
    "test_stock_install.py",
    "test_release_workflow.py",
    "test_end_to_end.py",
    "test_hf_build.py",
    "test_build_stops.py",
    "test_static.py",
    "test_broken_models.py",
    "test_zoo.py",
    "test_progress.py",
    "test_publish.py",
    "test_library_traps.py",
    "test_library_models.py",
    "test_model_refusals.py",
    "test_tool_package.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """With MODELWHEEL_TEST_CPU_LOG=FILE, each test's CPU seconds (its own and those of the
    processes it waited for: builds, compilers, venvs) and wall seconds are appended to FILE.
    CPU time, unlike --durations' wall time, does not grow when the machine is busy, so a run on a
    shared machine still shows which tests cost the suite its budget (docs/testing.md)."""
    log = os.environ.get("MODELWHEEL_TEST_CPU_LOG")
    before, started = os.times(), time.monotonic()
    yield
    if log:
        after = os.times()
        cpu = sum(
            getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system")
        )
        with open(log, "a") as out:
            out.write(f"{cpu:.1f}\t{time.monotonic() - started:.1f}\t{item.nodeid}\n")


def one_input_spec(name: str, shape: str = '["batch", 4]', input_name: str = "x", output_name: str = "y") -> str:
    """A spec for a factory `model:build` in the spec's folder: one input, one output, batch 1..4."""
    return f"""
[model]
name = "{name}"
version = "0.1"
factory = "model:build"

[weights]
seed = 0

[dims.batch]
min = 1
max = 4

[[inputs]]
name = "{input_name}"
shape = {shape}

[[outputs]]
name = "{output_name}"
"""


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: int = 600) -> Ran:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class BuildDirs:
    root: Path
    dist: Path
    build: Path

    def args(self) -> list[str]:
        return ["--root", str(self.root), "--dist", str(self.dist), "--build-dir", str(self.build)]

    def leftovers(self) -> list[str]:
        """Anything a build left in dist/ or under the artifact root (empty means clean)."""
        found = [str(p) for p in self.dist.rglob("*")] if self.dist.exists() else []
        if self.root.exists():
            found += [str(p) for p in self.root.rglob("*")]
        return found


@pytest.fixture
def dirs(tmp_path: Path) -> BuildDirs:
    return BuildDirs(root=tmp_path / "opt" / "models", dist=tmp_path / "dist", build=tmp_path / "build")


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory) -> tuple[BuildDirs, Ran]:
    """The tiny model built once for the session, through the CLI."""
    base = tmp_path_factory.mktemp("tiny")
    build_dirs = BuildDirs(root=base / "opt", dist=base / "dist", build=base / "build")
    ran = run_cli("build", "--spec", str(TINY_SPEC), *build_dirs.args())
    assert ran.code == 0, ran.err
    # Checked here, before any test runs the wheel's `link` command (which makes the /opt link under this root).
    assert not build_dirs.root.exists(), "the build leaves the artifact root as it found it"
    return build_dirs, ran


@pytest.fixture
def warm_dirs(dirs: BuildDirs, tiny_build) -> BuildDirs:
    """``dirs`` whose build cache already holds the session build's compiled tiny model (its
    compile-cache entries, not its wheel). A build of the tiny model's code and spec there (any
    name, version, root, dist or output tolerance) reuses the .so: no export and no C++ compile, 14 of a tiny build's
    23 CPU seconds; it still runs the doctor, verifies the reused .so and packages a new wheel.
    For tests whose subject comes after the compile (packaging, publishing, output folders,
    reports); a test about exporting or compiling uses ``dirs``."""
    copy_compiled(tiny_build[0].build / "cache", dirs.build / "cache")
    return dirs


def copy_compiled(cache: Path, into: Path) -> None:
    """The compile-cache entries of build cache ``cache`` (the compiled models, not the wheels and
    reports of its build-* entries) copied into build cache ``into``."""
    for entry in cache.iterdir():
        if entry.is_dir() and not entry.name.startswith(("build-", ".")):
            shutil.copytree(entry, into / entry.name)


@pytest.fixture(scope="session")
def wheel(tiny_build) -> Path:
    build_dirs, _ = tiny_build
    wheels = sorted(build_dirs.dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    public_torch = torch.__version__.split("+")[0]
    assert wheels[0].name.startswith(f"model_tiny-0.1+cpu.torch{public_torch}-py3-none-manylinux_2_"), wheels[0].name
    assert wheels[0].name.endswith("_x86_64.whl")
    return wheels[0]


@pytest.fixture(scope="session")
def installed(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the wheel installed by pip (torch comes in as its pinned dependency)."""
    python = make_venv(tmp_path_factory.mktemp("venv") / "env")
    pip_install(python, str(wheel))
    return python


def checkout_copy(dest: Path, targets: tuple[str, ...] = ("cpu",)) -> Path:
    """The checkout as actions/checkout gives it (tracked and untracked files, nothing ignored) in
    ``dest``, with one model, the tiny one, built for ``targets``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if name.startswith("models/") or not (source.is_symlink() or source.is_file()):
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # a committed link (pipeline/wheel_template) is checked out as a link
            (dest / name).symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest / name)
    shutil.copytree(REPO / "tests" / "models" / "tiny", dest / "models" / "tiny")
    spec = dest / "models" / "tiny" / "spec.toml"
    spec.write_text(spec.read_text() + f"\n[build]\ntargets = {json.dumps(list(targets))}\n")
    return dest


def make_venv(path: Path, *, sees_torch: bool = True) -> Path:
    """A fresh virtualenv (no system site-packages); returns its python. With ``sees_torch`` it
    also sees this suite's torch, torch's own requirements and pip (``attach_torch``), as a
    user's environment that already has torch does: a wheel pinned to that torch installs without
    pip unpacking 700 MB of it again (23 to 51 s a venv on a 2-core machine). A venv whose point
    is what pip fetches on its own (a stock machine, no torch at all, another torch) passes False
    and gets its own pip from ensurepip, as `python -m venv` gives a user."""
    venv.EnvBuilder(with_pip=not sees_torch, clear=True).create(path)
    python = path / "bin" / "python"
    if sees_torch:
        attach_torch(python)
    return python


def attach_torch(python: Path) -> None:
    """Make this suite's torch, what it requires, and pip visible to the virtualenv of ``python``:
    a .pth file in its site-packages names one shared folder of links to them. pip reads packages
    there as installed (it resolves a wheel's `torch==` pin against this torch) but never
    uninstalls or replaces them, as they lie outside the venv; whatever the venv installs goes
    into its own site-packages, which comes first on sys.path."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_suite_torch.pth").write_text(f"{_torch_links()}\n")


@functools.cache
def _torch_links() -> Path:
    """One folder (made on first use, per test process) with a link to each top-level file and
    folder of torch, of every distribution torch requires, and of pip, with their .dist-info."""
    folder = Path(tempfile.mkdtemp(prefix="suite-torch-"))
    folder.chmod(0o755)  # readable by the tests' second user (uid 65534), like the packages it links to
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # links only: the packages stay
    for name in _requirement_closure("torch") | {"pip"}:
        dist = importlib.metadata.distribution(name)
        tops = {Path(file).parts[0] for file in dist.files or () if not str(file).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(dist.locate_file(top))
            if source.exists() and not top.endswith(".pth"):
                (folder / top).symlink_to(source)
    return folder


def _requirement_closure(root: str) -> set[str]:
    """``root`` and every distribution it requires on this machine, extras left out."""
    found: set[str] = set()
    waiting = [root]
    while waiting:
        name = canonicalize_name(waiting.pop())
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.distribution(name).requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                waiting.append(requirement.name)
    return found


def pip_install(python: Path, *requirements: str) -> None:
    # --no-compile: byte-compiling torch's sources at install took half of each fresh venv's install
    # (51 s against 23 s, measured on a 2-core AVX2 machine); Python compiles what it imports anyway.
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", *requirements], capture_output=True, text=True
    )
    assert done.returncode == 0, f"pip install {' '.join(requirements)} failed:\n{done.stdout}{done.stderr}"


# Specs written beside their own copy of the tiny model's code (tests of refusals edit them).
GOOD = TINY_SPEC.read_text()


def spec_copy(folder: Path, text: str = GOOD, name: str = "spec.toml") -> Path:
    """A spec beside its own copy of the tiny model's code (the factory is imported from there)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TINY_SPEC.parent / "tiny_model.py", folder / "tiny_model.py")
    path = folder / name
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, old: str, new: str) -> str:
    assert old in GOOD
    with pytest.raises(SpecError) as info:
        load_spec(spec_copy(tmp_path, GOOD.replace(old, new, 1)))
    return info.value.message


def wheel_manifest(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))


def start_cli(*args: str, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def tmpfs(path: Path, size: int, read_only: bool = False):
    """A real small filesystem at ``path`` (root only): full disks and read-only mounts."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    # mode=755: a tmpfs is mounted 1777 by default, a folder anyone can add files to, which the
    # build refuses for --dist and --build-dir
    options = f"size={size},mode=755" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
