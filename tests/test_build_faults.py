"""Faults and bad input against builds (issue 14): each ends in one clear refusal with its
documented exit code, or in a correct result, and leaves nothing that blocks the next build."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pipeline import progress
from pipeline.errors import BuildInterrupted, ModelLoadError, OutputDirError, SpecError, UsageError
from pipeline.spec import load_spec

from .conftest import REPO, TINY_SPEC, Ran, run_cli

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


# -- item 11: spec checks that came late or never ------------------------------------------------

@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('name = "tiny"', 'name = "tiny\\n"', "model.name"),
        ('factory = "tiny_model:build"', 'factory = "tiny_model:build\\n"', "model.factory"),
    ],
)
def test_trailing_newline_is_refused(tmp_path, old, new, key):
    message = spec_error(tmp_path, old, new)
    assert str(tmp_path / "spec.toml") in message
    assert f"key '{key}'" in message


@pytest.mark.parametrize("description", ["C:\\\\models\\\\tiny", "two\\nlines", "tab\\there", "bell\\u0007"])
def test_description_the_wheel_cannot_carry_is_refused_at_spec_time(tmp_path, description):
    message = spec_error(tmp_path, 'description = "Tiny test model"', f'description = "{description}"')
    assert "key 'model.description'" in message
    assert "one-line summary" in message


def test_description_refusal_through_the_cli(tmp_path):
    spec = spec_copy(tmp_path, GOOD.replace('description = "Tiny test model"', 'description = "a\\\\b"'))
    ran = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"))
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'model.description'" in ran.err and "hint: " in ran.err
    assert "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize(("written", "normal"), [("v0.01", "0.1"), ("1.0.0", "1.0.0"), ("01.2rc1", "1.2rc1"),
                                                 ("1.3", "1.3"), ("2.0-post1", "2.0.post1")])
def test_version_is_normalised_once_in_the_spec_stage(tmp_path, written, normal):
    spec = load_spec(spec_copy(tmp_path, GOOD.replace('version = "0.1"', f'version = "{written}"'))).spec
    assert spec.model.version == normal


def test_invalid_version_names_file_and_key(tmp_path):
    message = spec_error(tmp_path, 'version = "0.1"', 'version = "v0.01-final-final"')
    assert f"{tmp_path / 'spec.toml'}: invalid spec" in message
    assert "key 'model.version'" in message and "PEP 440" in message


def test_shipped_specs_keep_their_version_spelling():
    """Spec hashes feed the cache keys: a version that was already normal is kept as written, so
    the spec dumps (and hashes) exactly as before normalising."""
    import tomllib

    for path in (TINY_SPEC, REPO / "models" / "unet" / "spec.toml", TINY_SPEC.parent / "external.toml"):
        written = tomllib.loads(path.read_text())["model"]["version"]
        assert load_spec(path).spec.model.version == written


@pytest.fixture
def index(tmp_path):
    """A local index on a free port, its state kept in a private working folder."""
    home = tmp_path / "index"
    home.mkdir()
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert started.code == 0, started.err
    yield home
    assert run_cli("index", "stop", cwd=home).code == 0


def test_non_normal_version_builds_and_publishes_one_spelling(tmp_path, index):
    """Item 11 and the end of item 10: 'v0.01' is 0.1 in the /opt path, the manifest, the wheel,
    and for publish, which looked for a 'v0.01' wheel and failed with an IndexError."""
    spec = spec_copy(tmp_path / "spec", GOOD.replace('version = "0.1"', 'version = "v0.01"'))
    root, dist = tmp_path / "opt", tmp_path / "dist"
    dirs = ["--root", str(root), "--dist", str(dist), "--build-dir", str(tmp_path / "build")]
    ran = run_cli("build", "--spec", str(spec), *dirs)
    assert ran.code == 0, ran.err
    [wheel] = sorted(dist.glob("*.whl"))
    assert wheel.name.startswith("model_tiny-0.1+cpu."), wheel.name
    manifest = wheel_manifest(wheel)
    assert manifest["version"] == "0.1"
    assert manifest["full_version"].startswith("0.1+cpu.")
    assert manifest["opt_path"] == str(root / "tiny" / "0.1" / "cpu")
    assert (dist / f"model_tiny-{manifest['full_version']}.report.json").is_file()

    published = run_cli("publish", "--spec", str(spec), *dirs, cwd=index)
    assert published.code == 0, published.err
    assert "building it" not in published.err  # found the wheel just built
    assert f"{wheel.name}: uploaded to the cpu index" in published.err
    assert sorted(dist.glob("*.whl")) == [wheel]


# -- item 10: huge numbers and impossible job counts ----------------------------------------------

@pytest.mark.parametrize(("old", "new", "key", "says"), [
    ("max = 4", f"max = {2**40}", "dims.batch.max", "less than or equal to 2147483647"),
    ("max = 4", f"max = {2**70}", "dims.batch.max", "less than or equal to 2147483647"),
    ("max = 4", "max = 20000000", "dims.batch.max", "3840000000 elements, over the 2147483648 (2**31)"),
    ('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 16384, 16384]', "dims.batch.max", "at 4, input 'x'"),
    ('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 65536, 65536]', "inputs[0].shape", "elements, over the"),
    ('shape = ["batch", 3, 8, 8]', f'shape = ["batch", 3, {2**40}, 8]', "inputs[0].shape", "elements, over the"),
])
def test_huge_sizes_are_refused_at_spec_time(tmp_path, old, new, key, says):
    message = spec_error(tmp_path, old, new)
    assert f"key '{key}'" in message, message
    assert says in message, message


def test_huge_dim_max_through_the_cli(tmp_path):
    """It used to compile, then die in verify with a 26-line traceback from the allocator."""
    spec = spec_copy(tmp_path, GOOD.replace("max = 4", f"max = {2**40}"))
    ran = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"))
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'dims.batch.max'" in ran.err and "hint: " in ran.err and "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize("jobs", ["-1", "0"])
def test_jobs_below_one_is_a_usage_error(tmp_path, jobs):
    """-j -1 waited forever for a free slot."""
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--spec", str(TINY_SPEC.parent / "external.toml"), "-j", jobs,
                  "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"), timeout=60)
    assert ran.code == UsageError.exit_code, ran.err
    assert f"error: -j/--jobs {jobs}: the number of parallel builds must be 1 or more" in ran.err
    assert "hint: " in ran.err
    assert not (tmp_path / "build").exists() and not (tmp_path / "dist").exists()


# -- item 2: several versions of one model built at once -----------------------------------------

def start_cli(*args: str, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_two_versions_built_at_once_both_succeed(dirs):
    """They shared build/<model>/<target>/ (wheel-src, candidates, sources, the trace): one removed
    the other's files, and a build failed with exit 9 and "report this as a bug"."""
    versions = ("0.2", "0.3")
    builds = [start_cli("build", "--spec", str(TINY_SPEC), "--version", v, *dirs.args()) for v in versions]
    finished = [(child.wait(timeout=600), child.stderr.read()) for child in builds]
    for version, (code, err) in zip(versions, finished):
        assert code == 0, f"--version {version}:\n{err}"
    sources = set()
    for version in versions:
        [wheel] = sorted(dirs.dist.glob(f"model_tiny-{version}+cpu.*.whl"))
        assert wheel_manifest(wheel)["opt_path"] == str(dirs.root / "tiny" / version / "cpu")
        report = json.loads(next(dirs.dist.glob(f"model_tiny-{version}+cpu.*.report.json")).read_text())
        sources.add(report["sources_dir"])
        assert report["sources_dir"].startswith(str(dirs.build / "tiny" / version / "cpu")), report["sources_dir"]
        assert report["trace_dir"] == str(dirs.build / "tiny" / version / "trace")
    assert len(sources) == 2
    assert [p for p in dirs.root.rglob("*") if not p.is_dir()] == [], "no folder or lock is left under the root"


def test_a_work_folder_is_held_by_one_build(tmp_path):
    """Two builds of one model, version and target into other roots but one --build-dir."""
    from pipeline.build import hold_work_dir
    from pipeline.layout import WorkLayout

    work = WorkLayout(tmp_path / "build").work_dir("tiny", "0.2", "cpu")
    with hold_work_dir(work):
        with pytest.raises(OutputDirError, match="another build is using the work folder") as info:
            with hold_work_dir(work):
                pass
        assert "--build-dir" in info.value.hint
    with hold_work_dir(work):  # released: the next build takes it
        pass


# -- item 1: Ctrl-C to a parallel build ----------------------------------------------------------

def test_ctrl_c_to_a_parallel_build_leaves_nothing_that_blocks_the_next(tmp_path, dirs):
    """SIGINT to the process group (a terminal's Ctrl-C) reached each build twice, once from the
    terminal and once forwarded by the parent; the second cut the cleanup short, leaving an
    unmarked output folder and its lock, and every later build of the model stopped with exit 10."""
    specs = [spec_copy(tmp_path / v, GOOD.replace('version = "0.1"', f'version = "{v}"')) for v in ("0.2", "0.3")]
    args = ["build", *(a for s in specs for a in ("--spec", str(s))), "-j", "2", *dirs.args()]
    parent = start_cli(*args)
    seen = []
    for line in parent.stderr:
        seen.append(line)
        if sum(line.startswith("==> build ") for line in seen) == 2:
            break
    logs = [dirs.build / "logs" / f"{v}-spec.log" for v in ("0.2", "0.3")]
    deadline = time.monotonic() + 300
    while not all(log.is_file() and "==> compile" in log.read_text() for log in logs):
        assert parent.poll() is None and time.monotonic() < deadline, "".join(seen)
        time.sleep(0.2)
    time.sleep(1.0)  # inside AOTInductor now
    os.killpg(parent.pid, signal.SIGINT)
    err = "".join(seen) + parent.stderr.read()
    assert parent.wait(timeout=120) == BuildInterrupted.exit_code, err
    for log in logs:
        assert "error: build stopped by SIGINT" in log.read_text(), log.read_text()
    assert [p for p in dirs.root.rglob("*") if not p.is_dir()] == [], "no output folder, marker or lock is left"
    assert not [p for p in dirs.root.rglob("*") if p.name.startswith(".")]

    again = run_cli(*args)
    assert again.code == 0, again.err + "".join(log.read_text() for log in logs)
    assert len(list(dirs.dist.glob("*.whl"))) == 2


def test_a_second_signal_during_cleanup_does_not_cut_it_short(tmp_path, monkeypatch):
    """The forwarded SIGINT landing while the output folder is removed: cleanup still ends."""
    from pipeline import outdir

    real_rmtree = outdir.shutil.rmtree

    def interrupted_rmtree(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # Python's default handler: KeyboardInterrupt
        return real_rmtree(*args, **kwargs)

    monkeypatch.setattr(outdir.shutil, "rmtree", interrupted_rmtree)
    out = tmp_path / "root" / "tiny" / "0.1" / "cpu"
    with pytest.raises(KeyboardInterrupt):
        with progress.reporting(progress.QuietProgress(result_stream=None)), outdir.claim_output_dir(out):
            (out / "model.so").write_bytes(b"half")
            raise KeyboardInterrupt  # the first Ctrl-C
    assert not (tmp_path / "root").exists(), sorted(map(str, (tmp_path / "root").rglob("*")))


def test_a_killed_builds_leftovers_and_stale_lock_are_taken_over(tmp_path):
    from pipeline.outdir import MARKER, claim_output_dir

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no longer running
    out = tmp_path / "root" / "tiny" / "0.1" / "cpu"
    installed = tmp_path / "site-packages" / "artifacts"
    installed.mkdir(parents=True)
    out.mkdir(parents=True)
    (out / MARKER).write_text(f"made by pid {gone.pid}\n")
    (out / "half.so").write_bytes(b"x")
    (out.parent / ".cpu.build.lock").write_text(f"{gone.pid}\n")
    (out.parent / f".cpu.removing-{gone.pid}").mkdir()
    (out.parent / f".cpu.displaced-{gone.pid}").symlink_to(installed)  # the wheel's link, moved aside
    said = []

    class Recorded(progress.Progress):
        def say(self, text: str) -> None:
            said.append(text)

    with progress.reporting(Recorded()), claim_output_dir(out):
        assert sorted(p.name for p in out.iterdir()) == [MARKER]
    assert len(said) == 1 and f"taking over {out}: a build (pid {gone.pid}) that is no longer running" in said[0]
    assert sorted(p.name for p in out.parent.iterdir()) == ["cpu"]
    assert out.is_symlink() and out.resolve() == installed.resolve(), "the installed wheel's link is put back"


# -- item 8: factory modules that cannot be imported, and factories that exit --------------------

def factory_fault(tmp_path: Path, source: str, factory: str = "faulty:build") -> Ran:
    spec = spec_copy(tmp_path / "spec", GOOD.replace('factory = "tiny_model:build"', f'factory = "{factory}"'))
    (spec.parent / "faulty.py").write_text(source)
    return run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                   "--build-dir", str(tmp_path / "build"))


TINY_IMPORT = "from tiny_model import build as tiny_build\n"


@pytest.mark.parametrize(("source", "line", "says"), [
    ("import torch\n\ndef build(channels=8)\n    return None\n", 3, "SyntaxError: expected ':'"),
    ("from torch import no_such_name\n", 1, "ImportError: cannot import name 'no_such_name'"),
    ("import torch\n\nWIDTH = 8 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("import sys\nsys.exit(0)\n", 2, "called sys.exit(0)"),
])
def test_factory_module_that_cannot_be_imported_names_file_and_line(tmp_path, source, line, says):
    ran = factory_fault(tmp_path, source)
    faulty = tmp_path / "spec" / "faulty.py"
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert f"error: {tmp_path / 'spec' / 'spec.toml'}: key 'model.factory': importing module 'faulty' failed at " \
           f"{faulty}:{line}: {says}" in ran.err, ran.err
    assert "hint: fix the model's code at the line given" in ran.err
    assert "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


def test_factory_module_importing_a_missing_package_names_the_package(tmp_path):
    ran = factory_fault(tmp_path, "import torch\nimport no_such_package_xyz\n")
    faulty = tmp_path / "spec" / "faulty.py"
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert (f"key 'model.factory': importing module 'faulty' needs the package 'no_such_package_xyz', which is not "
            f"installed in this Python") in ran.err, ran.err
    assert f"(at {faulty}:2): ModuleNotFoundError: No module named 'no_such_package_xyz'" in ran.err
    assert "hint: install it where the build runs: pip install no_such_package_xyz" in ran.err
    assert "Traceback" not in ran.err


def test_missing_factory_module_still_says_it_cannot_be_found(tmp_path):
    ran = factory_fault(tmp_path, "", factory="no_such_module_xyz:build")
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "cannot import module 'no_such_module_xyz'" in ran.err and "Traceback" not in ran.err


@pytest.mark.parametrize("code", ["0", "3", "None"])
def test_factory_that_exits_is_refused(tmp_path, code):
    """sys.exit(0) from the factory ended the build with exit 0 and no wheel."""
    ran = factory_fault(tmp_path, f"import sys\n{TINY_IMPORT}\ndef build(channels=8):\n    sys.exit({code})\n")
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert f"faulty:build(**model.kwargs) called sys.exit({code}) at {tmp_path / 'spec' / 'faulty.py'}:5 " \
           "instead of returning a module" in ran.err, ran.err
    assert "hint: the factory must return the nn.Module" in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


# -- item 7: inputs that do not fit the model ----------------------------------------------------

T_INPUT = '[[inputs]]\nname = "t"\nshape = ["batch"]\nlow = 0\nhigh = 1000\n'
FORWARD_LINE = "def forward(self, x: torch.Tensor, t: torch.Tensor):"


def tiny_line(text: str) -> int:
    source = (TINY_SPEC.parent / "tiny_model.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


def build_spec_text(tmp_path: Path, text: str) -> tuple[Ran, Path]:
    spec = spec_copy(tmp_path / "spec", text)
    ran = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"))
    return ran, spec


def assert_refused_before_tracing(ran: Ran, tmp_path: Path) -> None:
    assert ran.code == SpecError.exit_code, ran.err
    assert "Traceback" not in ran.err and "torch._dynamo" not in ran.err, ran.err
    assert len(ran.err.splitlines()) <= 10, ran.err  # one paragraph, not a trace
    assert "==> export" not in ran.err and "\nhint: " in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize(("text", "declared", "names"), [
    (GOOD.replace(T_INPUT, ""), "1 input(s) declared (x)", "takes 2 (x, t)"),
    (GOOD + '\n[[inputs]]\nname = "extra"\nshape = ["batch"]\n', "3 input(s) declared (x, t, extra)", "takes 2 (x, t)"),
])
def test_input_count_is_compared_with_forwards_signature_first(tmp_path, text, declared, names):
    """One input fewer than forward takes gave a 53-line TypeError traceback and exit 1."""
    ran, spec = build_spec_text(tmp_path, text)
    assert_refused_before_tracing(ran, tmp_path)
    forward = f"{tmp_path / 'spec' / 'tiny_model.py'}:{tiny_line(FORWARD_LINE)}"
    assert f"error: {spec}: key 'inputs': {declared}, but forward at {forward} {names}" in ran.err, ran.err
    assert "hint: declare one [[inputs]] table per forward parameter" in ran.err


def test_a_shape_the_model_rejects_is_a_spec_error_naming_input_line_and_message(tmp_path):
    """3 channels declared as 5 gave 221 lines of dynamo trace and exit 1."""
    ran, spec = build_spec_text(tmp_path, GOOD.replace('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 5, 8, 8]'))
    assert_refused_before_tracing(ran, tmp_path)
    model = tmp_path / "spec" / "tiny_model.py"
    line = tiny_line("self.norm(self.conv(x))")
    assert f"error: {spec}: key 'inputs': the model does not accept the spec's example inputs " \
           "('x' float32[batch=2, 5, 8, 8], 't' float32[batch=2])" in ran.err, ran.err
    assert f"  {model}:{line}: h = nn.functional.silu(self.norm(self.conv(x)))" in ran.err
    assert "RuntimeError: Given groups=1, weight of size [8, 3, 3, 3], expected input[2, 5, 8, 8] to have 3 channels, " \
           "but got 5 channels instead" in ran.err
    assert f"hint: make the [[inputs]] shapes and dtypes (and [dims] sizes) match what the model expects at {model}:{line}" \
           in ran.err


def test_inputs_that_do_not_fit_are_reported_by_doctor_too(tmp_path):
    spec = spec_copy(tmp_path, GOOD.replace('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 8]'))
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'inputs': the model does not accept the spec's example inputs ('x' float32[batch=2, 3, 8]" in ran.err
    assert "Traceback" not in ran.err


def test_keyword_only_parameters_count_as_inputs(tmp_path):
    import torch

    from pipeline.export import check_inputs_fit
    from pipeline.loader import load_model

    # A module name of its own: tiny_model may already be imported by this process.
    spec_path = spec_copy(tmp_path, GOOD.replace(T_INPUT, "").replace("tiny_model:build", "kwonly_model:build"))
    (tmp_path / "kwonly_model.py").write_text((tmp_path / "tiny_model.py").read_text().replace(
        "def forward(self, x: torch.Tensor, t: torch.Tensor):", "def forward(self, x: torch.Tensor, *, t: torch.Tensor):"))
    spec_file = load_spec(spec_path)
    loaded = load_model(spec_file)
    with pytest.raises(SpecError, match=r"1 input\(s\) declared \(x\), but forward at .* takes 2 \(x, t\)"):
        check_inputs_fit(spec_file, loaded.module, (torch.zeros(2, 3, 8, 8),), loaded.source_files)


# -- item 5: an interrupt early in compile stops it, stores nothing, and says what it left -------

SWALLOWING_MODEL = '''"""The tiny model, plus a garbage-collector callback that sends this process SIGINT once, early
in compile: the handler's KeyboardInterrupt is raised inside the callback, where Python drops it,
as it does in torch's own finalizers and weakref callbacks."""

import gc
import os
import signal
import sys

from tiny_model import build  # noqa: F401

sent = []


def _interrupt_inside_gc(phase, info):
    if sent or phase != "start" or "torch._inductor.compile_fx" not in sys.modules:
        return
    sent.append(True)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs here, inside the callback
        pass


gc.callbacks.append(_interrupt_inside_gc)
'''


def stopped_cleanly(ran: Ran, tmp_path: Path) -> Path:
    """The stop's message names exactly what it kept; returns the work files' folder."""
    work = tmp_path / "build" / "tiny" / "0.1"
    assert ran.code == BuildInterrupted.exit_code, ran.err
    assert f"error: build stopped by SIGINT: nothing of it is left under {tmp_path / 'opt'} or in {tmp_path / 'dist'}, " \
           f"and nothing was stored in the build cache; its work files in {work}/ (trace, generated sources so far, " \
           "the work folder's lock) are kept for inspection; the next build of tiny 0.1 replaces them" in ran.err, ran.err
    assert "Traceback" not in ran.err
    assert work.is_dir(), "the message names what is there"
    assert not (tmp_path / "opt").exists() and not (tmp_path / "dist").exists()
    assert not (tmp_path / "build" / "cache").exists() or not list((tmp_path / "build" / "cache").iterdir())
    return work


def test_an_interrupt_python_drops_in_a_gc_callback_still_stops_the_compile(tmp_path):
    """Ctrl-C early in compile went on for about 10 s and stored the compiled model in the cache:
    the KeyboardInterrupt had landed in a callback inside torch, where Python drops it."""
    spec = spec_copy(tmp_path / "spec", GOOD.replace("tiny_model:build", "swallowing_model:build"))
    (spec.parent / "swallowing_model.py").write_text(SWALLOWING_MODEL)
    ran = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"))
    work = stopped_cleanly(ran, tmp_path)
    assert "==> compile" in ran.err and "compile done" not in ran.err
    candidate = work / "cpu" / "candidates" / "pinned"
    assert "Exception ignored" not in (candidate / "inductor.log").read_text(), "the interrupt was dropped"
    assert not (candidate / "sources").exists(), "AOTInductor was stopped before it finished"


def test_ctrl_c_in_compile_says_what_it_left(tmp_path):
    args = ["build", "--spec", str(TINY_SPEC), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
            "--build-dir", str(tmp_path / "build")]
    child = start_cli(*args)
    seen = []
    for line in child.stderr:
        seen.append(line)
        if line.startswith("==> compile"):
            break
    time.sleep(0.5)
    os.killpg(child.pid, signal.SIGINT)
    err = "".join(seen) + child.stderr.read()
    stopped_cleanly(Ran(child.wait(timeout=120), "", err), tmp_path)


def test_a_stopped_build_stores_nothing_in_the_cache(tmp_path, monkeypatch):
    from pipeline import cache, progress

    artifact = tmp_path / "model.so"
    artifact.write_bytes(b"compiled")
    monkeypatch.setattr(progress, "stop_requested", ["SIGINT"])  # what the signal handler records
    store = cache.Cache(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        store.store("key", (artifact,))
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


# -- item 9: --dist or --build-dir that is a file, read-only, or on a full disk -------------------

@contextlib.contextmanager
def tmpfs(path: Path, size: int, read_only: bool = False):
    """A real small filesystem at ``path`` (root only): full disks and read-only mounts."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def build_into(tmp_path: Path, dist: Path, build: Path, spec: Path = TINY_SPEC) -> Ran:
    return run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(dist),
                   "--build-dir", str(build))


def refused_early(ran: Ran, tmp_path: Path, says: str) -> None:
    assert ran.code == OutputDirError.exit_code, ran.err
    assert says in ran.err, ran.err
    assert "\nhint: " in ran.err and "Traceback" not in ran.err
    assert "==> load" not in ran.err, "refused before any work"
    assert not (tmp_path / "opt").exists()


@pytest.mark.parametrize("flag", ["--dist", "--build-dir"])
def test_a_file_given_as_a_folder_is_refused_before_building(tmp_path, flag):
    """--dist pointing at a file failed after compiling, with a FileExistsError traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    dist, build = (a_file, tmp_path / "build") if flag == "--dist" else (tmp_path / "dist", a_file)
    ran = build_into(tmp_path, dist, build)
    refused_early(ran, tmp_path, f"error: {flag} {a_file} is a file, not a folder")
    ran = build_into(tmp_path, dist / "sub", build / "sub")
    refused_early(ran, tmp_path, f"error: {flag} {a_file / 'sub'} cannot be made: {a_file} is a file, not a folder")
    assert a_file.read_text() == "not a folder"
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()


@pytest.mark.parametrize("flag", ["--dist", "--build-dir", "--root"])
def test_a_read_only_folder_is_refused_before_building(tmp_path, flag):
    """--root too: an unwritable root was reported only after load, doctor and export (exit 10)."""
    with tmpfs(tmp_path / "read-only", 1 << 20, read_only=True) as read_only:
        folders = {"--dist": tmp_path / "dist", "--build-dir": tmp_path / "build", "--root": tmp_path / "opt",
                   flag: read_only / "here"}
        ran = run_cli("build", "--spec", str(TINY_SPEC), *(a for pair in folders.items() for a in map(str, pair)))
        refused_early(ran, tmp_path, f"{folders[flag]}: cannot write there (it would be made in {read_only})")
        assert f"error: {flag}" in ran.err and "Read-only file system" in ran.err
        assert "hint: give " + flag in ran.err


def test_a_full_disk_is_refused_before_building(tmp_path):
    with tmpfs(tmp_path / "full", 64 << 10) as full:
        (full / "filler").write_bytes(b"\0" * (64 << 10))
        ran = build_into(tmp_path, full / "dist", tmp_path / "build")
        refused_early(ran, tmp_path, f"error: --dist {full / 'dist'}: cannot write there (it would be made in {full}): "
                                     "No space left on device")
        assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_dist_filling_up_while_the_wheel_is_written_leaves_nothing(tmp_path, tiny_build):
    """The report fitted and the wheel did not: an orphan report.json was left in dist/."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    with tmpfs(tmp_path / "dist", wheel.stat().st_size // 2) as dist:  # room for the report, not the wheel
        ran = build_into(tmp_path, dist, tmp_path / "build")
        assert ran.code == OutputDirError.exit_code, ran.err
        assert f"error: cannot write {dist}/.{wheel.name}.partial-" in ran.err and "No space left on device" in ran.err
        assert f"hint: free space on the disk holding {dist}" in ran.err and "Traceback" not in ran.err
        assert list(dist.iterdir()) == [], "no report without its wheel, no hidden partial file"
    cache = tmp_path / "build" / "cache"
    assert not [p.name for p in cache.iterdir() if p.name.startswith("build-")], "no build entry without its wheel"
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".")], "no partial entry"
    assert not (tmp_path / "opt").exists()


@pytest.mark.parametrize("room", ["none", "for-the-compiled-model"])
def test_build_cache_filling_up_leaves_no_partial_entry(tmp_path, tiny_build, room):
    """A full disk under --build-dir while the cache entry was written left half an entry."""
    built = tiny_build[0]
    so_size = next(built.build.glob("cache/*/model.so")).stat().st_size
    wheel_size = next(built.dist.glob("*.whl")).stat().st_size
    # "none": the compiled model's entry does not fit; else it fits, and the whole build's
    # (the wheel again, stored last) does not.
    size = so_size // 2 if room == "none" else so_size + wheel_size // 2
    with tmpfs(tmp_path / "build" / "cache", size) as cache:
        ran = build_into(tmp_path, tmp_path / "dist", tmp_path / "build")
        assert ran.code == OutputDirError.exit_code, ran.err
        assert f"error: cannot write {cache}/." in ran.err and "No space left on device" in ran.err, ran.err
        assert "Traceback" not in ran.err
        entries = sorted(p.name for p in cache.iterdir())
        assert not [name for name in entries if name.startswith(".")], entries
        assert not [name for name in entries if name.startswith("build-")], entries
        if room == "for-the-compiled-model":
            assert len(entries) == 1 and (cache / entries[0] / "model.so").is_file(), "whole entries are kept"
            assert "==> package" in ran.err, "it failed storing the whole build, last"
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []
    assert not (tmp_path / "opt").exists()


def test_partial_files_of_a_build_killed_while_writing_are_swept(tmp_path):
    from pipeline.writable import sweep_partials

    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f".model_tiny-0.1.whl.partial-{gone.pid}").write_bytes(b"half")
    (tmp_path / f".build-abc.partial-{gone.pid}").mkdir()
    (tmp_path / f".build-abc.partial-{gone.pid}" / "model.so").write_bytes(b"half")
    running = tmp_path / f".build-def.partial-{os.getppid()}"  # a live process's: left to it
    running.mkdir()
    sweep_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name]
