"""The installed wheel's trust boundaries: what is hashed is what is loaded; the /opt link is
never made or followed through a folder another user controls (a local user swapping the link
cannot get code run in a serving process); what load() makes has explicit modes whatever the
umask; a damaged manifest is reported as a damaged install.

The link is a CUDA wheel's (its kernels are found by absolute path); no GPU is needed to test
it: the tiny CPU wheel's manifest is marked non-relocatable, which sends load() through the link.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .conftest import make_venv, pip_install, tmpfs

NOBODY = 65534
EVIL_C = '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { fclose(fopen("%s", "w")); }\n'


@pytest.fixture(scope="module")
def linked(tmp_path_factory, wheel):
    """A venv with the tiny wheel, its manifest pointing opt_path under a root of this test's own."""
    base = tmp_path_factory.mktemp("trust")
    python = make_venv(base / "env")
    pip_install(python, str(wheel))
    package = Path(
        subprocess.run(
            [str(python), "-c", "import model_tiny, os; print(os.path.dirname(model_tiny.__file__))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    manifest_file = package / "manifest.json"
    original = manifest_file.read_text()
    yield python, package, manifest_file, original, base


def point_at(linked, root: Path, **changes) -> Path:
    python, package, manifest_file, original, base = linked
    manifest = {**json.loads(original), "relocatable": False, "opt_path": str(root / "tiny" / "0.1" / "cpu"), **changes}
    manifest_file.write_text(json.dumps(manifest))
    return root / "tiny" / "0.1" / "cpu"


@pytest.fixture
def restore(linked):
    yield
    linked[2].write_text(linked[3])


def run(python: Path, code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", timeout=120, **kwargs)


def test_a_link_swapped_by_another_user_never_loads_their_code(linked, restore, tmp_path):
    """The version folder belongs to another user, who swaps its `cpu` link between the real
    artifacts and a folder with their own model.so, in a loop, while root loads 30 times."""
    if os.geteuid() != 0 or shutil.which("cc") is None:
        pytest.skip("needs root (to give the folder to another user) and a C compiler")
    python, package = linked[0], linked[1]
    link = point_at(linked, tmp_path / "root")
    link.parent.mkdir(parents=True)
    os.chown(link.parent, NOBODY, NOBODY)
    evil, ran_marker = tmp_path / "evil", tmp_path / "foreign-code-ran"
    evil.mkdir()
    (tmp_path / "evil.c").write_text(EVIL_C % ran_marker)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(evil / "model.so"), str(tmp_path / "evil.c")], check=True)
    stop = threading.Event()

    def swap() -> None:
        targets, i = [package / "artifacts", evil], 0
        while not stop.is_set():
            staged = link.parent / ".swap"
            staged.unlink(missing_ok=True)
            staged.symlink_to(targets[i % 2])
            os.replace(staged, link)
            i += 1
            # about a thousand swaps a second, hundreds during each load: without the pause the loop
            # took a core of its own (25 CPU-s of the suite) from the loads it races
            time.sleep(0.001)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        loads = [run(python, "import model_tiny; model_tiny.load_numpy()") for _ in range(30)]
    finally:
        stop.set()
        swapper.join()
    assert all(done.returncode == 0 for done in loads), loads[0].stderr
    assert not ran_marker.exists(), "the other user's model.so ran inside the loading process"
    assert f"{link.parent} is owned by nobody (uid {NOBODY})" in loads[0].stderr
    assert "UntrustedPathWarning" in loads[0].stderr and "loading from" in loads[0].stderr


def test_a_link_to_a_folder_inside_another_users_folder_is_not_followed(linked, restore, tmp_path):
    """The model folder is a symlink to a folder of root's own, but that folder sits in another
    user's, who can rename it away and put theirs in its place: as untrusted as their own folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to give the folder to another user)")
    python = linked[0]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "tiny").mkdir()  # root's, in a folder nobody owns
    os.chown(theirs, NOBODY, NOBODY)
    link = point_at(linked, tmp_path / "root")
    link.parents[2].mkdir()
    (link.parents[1]).symlink_to(theirs / "tiny")
    done = run(python, "import model_tiny; print(model_tiny.load().library)")
    assert done.returncode == 0, done.stderr
    assert (
        f"{theirs} is owned by nobody (uid {NOBODY}), not by this user or root (on the way to "
        f"{link.parents[1]}'s target)" in done.stderr
    )
    assert list((theirs / "tiny").iterdir()) == [], "nothing was made in the folder another user can replace"
    assert done.stdout.strip() == str(linked[1] / "artifacts" / "model.so")


def test_a_folder_another_user_makes_between_the_check_and_mkdir_is_not_used(linked, restore, tmp_path):
    """The race on a missing folder: another user makes it right after the ownership check, before
    load() makes it; the link and its lock are then not made in their folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to give the folder to another user)")
    python = linked[0]
    link = point_at(linked, tmp_path / "root")
    (tmp_path / "root").mkdir()
    code = f"""
import os, model_tiny._link as link_module, model_tiny
checked, calls = link_module.check_chain, []
def check_then_plant(folder):
    checked(folder)
    calls.append(folder)
    if len(calls) == 1:  # another user's mkdir, between the check and load()'s own
        os.mkdir({str(link.parents[1])!r})
        os.chown({str(link.parents[1])!r}, {NOBODY}, {NOBODY})
link_module.check_chain = check_then_plant
print(model_tiny.load().library)
"""
    done = run(python, code)
    assert done.returncode == 0, done.stderr
    assert f"{link.parents[1]} is owned by nobody (uid {NOBODY})" in done.stderr
    assert not link.parent.exists() or list(link.parent.iterdir()) == [], "the link was made in their folder"
    assert done.stdout.strip() == str(linked[1] / "artifacts" / "model.so")


def test_the_link_and_its_folders_get_explicit_modes_under_umask_000(linked, restore, tmp_path):
    python = linked[0]
    link = point_at(linked, tmp_path / "root")
    done = run(python, "import model_tiny; model_tiny.load()", preexec_fn=lambda: os.umask(0))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    for folder in (tmp_path / "root", tmp_path / "root" / "tiny", link.parent):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o755), folder
    assert oct((link.parent / ".cpu.lock").stat().st_mode & 0o777) == oct(0o644)


LOAD = "import model_tiny as t; m = t.load(); m(*t.example_inputs()); print(m.library)"


@pytest.mark.parametrize("blocked_by", ["a file", "a read-only filesystem"])
def test_a_link_it_may_not_make_loads_from_the_package_with_no_warning(linked, restore, tmp_path, blocked_by):
    """Where the link cannot be made (a read-only root, a file in the way), load() opens the
    installed artifacts, warns about nothing (warnings are errors here) and says why only in a
    debug log line; nothing is made under the root."""
    python, package = linked[0], linked[1]
    if blocked_by == "a file":
        root = tmp_path / "root"
        root.write_text("a file where the artifact root's folder should be")
        context = contextlib.nullcontext(root)
    else:
        context = tmpfs(tmp_path / "root", 1 << 20, read_only=True)
    with context as root:
        link = point_at(linked, root)
        ran = subprocess.run(
            [str(python), "-W", "error", "-c", LOAD], capture_output=True, text=True, cwd="/", timeout=120
        )
        assert ran.returncode == 0, ran.stderr
        assert (ran.stdout, ran.stderr) == (f"{package / 'artifacts' / 'model.so'}\n", "")
        logged = run(python, "import logging; logging.basicConfig(level=logging.DEBUG)\n" + LOAD)
        assert logged.returncode == 0, logged.stderr
        assert f"DEBUG:model_tiny._manifest:model-tiny: cannot write {link}" in logged.stderr
        assert (
            f"loading from {package / 'artifacts'} (`model-tiny link` with write access makes the link)"
            in logged.stderr
        )
        assert not link.exists() and (root.is_file() or not any(root.iterdir()))


def test_what_is_hashed_is_what_is_loaded(linked, restore, tmp_path):
    """The .so is replaced right after its hash was checked, before it is opened: the checked
    file is still what loads (one descriptor, hashed and loaded through /proc/self/fd)."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    python, package = linked[0], linked[1]
    library = package / "artifacts" / "model.so"
    kept, ran_marker = tmp_path / "model.so.orig", tmp_path / "foreign-code-ran"
    shutil.copy2(library, kept)
    (tmp_path / "evil.c").write_text(EVIL_C % ran_marker)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"), str(tmp_path / "evil.c")], check=True)
    code = f"""
import os, model_tiny._integrity as integrity, model_tiny
checked, seen = integrity._check_descriptor, []
def check_then_swap(path, fd, record, full):
    checked(path, fd, record, full)
    seen.append(path.name)
    if seen.count("model.so") == 2:  # the check of the open that loads (the first: every artifact's)
        os.replace({str(tmp_path / "evil.so")!r}, path)  # another process's write, between check and load
integrity._check_descriptor = check_then_swap
m = model_tiny.load_numpy()
print(m(*[t.numpy() for t in model_tiny.example_inputs()])[1].shape)
"""
    try:
        done = run(python, code)
    finally:
        os.replace(kept, library)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(2,", "4)"]
    assert not ran_marker.exists(), "the file swapped in after the check was loaded"


def test_a_corrupt_manifest_is_a_damaged_install(linked, restore):
    python, manifest_file = linked[0], linked[2]
    manifest_file.write_text('{"format": 1, "name": ')
    loaded = run(python, "import model_tiny; model_tiny.load()")
    assert loaded.returncode != 0
    assert loaded.stderr.splitlines()[-1].startswith("model_tiny._integrity.IntegrityError: ")
    assert "reinstall it (pip install --force-reinstall model-tiny)" in loaded.stderr
    verified = subprocess.run([str(python.parent / "model-tiny"), "verify"], capture_output=True, text=True, cwd="/")
    assert verified.returncode == 4, verified.stderr
    assert verified.stderr.startswith(f"error: {manifest_file} is unreadable or corrupt")


def test_two_libraries_loaded_through_descriptors_stay_two(tmp_path):
    """dlopen() knows a library by its name first: had the first descriptor been closed, the second
    library would reuse its /proc/self/fd/N and be handed the first (the build's verification of a
    static batch size ran the dynamic model, and crashed)."""
    import ctypes
    import hashlib

    from pipeline.wheel_template.runtime import _integrity as wheel_integrity

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    values = []
    for value in (1, 2):
        source, library = tmp_path / f"v{value}.c", tmp_path / f"v{value}.so"
        source.write_text(f"int value(void) {{ return {value}; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        record = {"sha256": hashlib.sha256(library.read_bytes()).hexdigest(), "size": library.stat().st_size}
        with wheel_integrity.opened_verified(library, record, hold_open=True) as loadable:
            values.append(ctypes.CDLL(loadable).value())
    assert values == [1, 2]
