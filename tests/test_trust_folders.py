"""Folders another local user controls are never trusted (ssh's StrictModes): a build into a
root whose model folder is a symlink to someone else's folder, or a folder anyone can write, is
refused naming the path and the owner, before anything is written; what the build makes gets
explicit modes whatever the umask."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.errors import OutputDirError
from pipeline.wheel_template.runtime import _trust as wheel_trust

from .conftest import REPO, TINY_SPEC

NOBODY = 65534


def build(dirs, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "build", "--spec", str(TINY_SPEC), *dirs.args()],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        **popen,
    )


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user (chown) needs root")


def test_a_model_folder_planted_as_a_link_to_another_users_folder_is_refused(dirs, tmp_path, as_root):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    dirs.root.mkdir(parents=True)
    (dirs.root / "tiny").symlink_to(theirs)
    ran = build(dirs)
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    assert f"error: {dirs.root / 'tiny'} (a symlink to {theirs}) is owned by" in ran.stderr
    assert f"(uid {NOBODY}), not by this user or root" in ran.stderr and "==> load" not in ran.stderr
    assert list(theirs.iterdir()) == [], "nothing was written in the other user's folder"


def test_a_folder_anyone_can_write_is_refused(dirs, as_root):
    version = dirs.root / "tiny" / "0.1"
    version.mkdir(parents=True)
    os.chmod(version, 0o777)
    ran = build(dirs)
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    assert f"error: {version} can be written by everyone (mode 777, no sticky bit)" in ran.stderr
    os.chmod(version, 0o1777)  # the sticky bit (as /tmp): others cannot replace what is not theirs
    assert wheel_trust.problem(version) is None


def test_a_model_folder_linked_into_another_users_folder_is_refused(dirs, tmp_path, as_root):
    """The link's target is root's, but it sits in a folder another user owns: they can rename it
    away and put their own in its place, mid-build."""
    theirs = tmp_path / "theirs"
    (theirs / "tiny").mkdir(parents=True)
    os.chown(theirs, NOBODY, NOBODY)
    dirs.root.mkdir(parents=True)
    (dirs.root / "tiny").symlink_to(theirs / "tiny")
    ran = build(dirs)
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    assert (
        f"error: {theirs} is owned by nobody (uid {NOBODY}), not by this user or root (on the way to "
        f"{dirs.root / 'tiny'}'s target)" in ran.stderr
    )
    assert list((theirs / "tiny").iterdir()) == [], "nothing was written where the other user can swap it"


@pytest.mark.parametrize("named_by", ["torch's default", "TORCHINDUCTOR_CACHE_DIR"])
def test_an_inductor_cache_another_user_made_first_is_refused(dirs, tmp_path, as_root, named_by):
    """torch's default cache, /tmp/torchinductor_<user>, is a name any local user can take first;
    the build loads the kernels it finds there and compiles its headers into the model."""
    user = f"mw{os.getpid()}{tmp_path.name[-12:]}".replace("-", "")
    env = {**os.environ, "USER": user, "LOGNAME": user}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    theirs = Path(tempfile.gettempdir()) / f"torchinductor_{user}"
    if named_by == "TORCHINDUCTOR_CACHE_DIR":
        theirs = tmp_path / "shared-cache"
        env["TORCHINDUCTOR_CACHE_DIR"] = str(theirs)
    theirs.mkdir()
    try:
        os.chown(theirs, NOBODY, NOBODY)
        ran = build(dirs, env=env)
        assert ran.returncode == OutputDirError.exit_code, ran.stderr
        assert (
            f"error: {theirs} is owned by nobody (uid {NOBODY}), not by this user or root: torch Inductor's "
            "cache folder"
            in ran.stderr
            and "==> load" not in ran.stderr
        )
        assert list(theirs.iterdir()) == [], "nothing was compiled into or loaded from the other user's folder"
    finally:
        shutil.rmtree(theirs)


# What the build writes has explicit modes under umask 000: test_build_stops.py's
# test_what_the_build_writes_has_explicit_modes_under_umask_000, on the builds a stopped parallel
# build and the next two builds wrote (their fresh compiles serve three tests there).


def test_a_library_changed_after_verification_is_not_packaged(tmp_path):
    """Verification hashes the .so through the descriptor it loads; the manifest's hash of the
    file must be that one (a write into the output folder between the two is refused)."""
    import hashlib

    from pipeline.errors import PackageError
    from pipeline.stages.manifest import as_verified

    library = tmp_path / "model.so"
    library.write_bytes(b"the verified bytes")
    loaded = hashlib.sha256(b"the verified bytes").hexdigest()  # Verified.library_sha256
    assert as_verified(library, loaded) == loaded
    library.write_bytes(b"other bytes, same name")
    with pytest.raises(PackageError, match="changed after it was verified"):
        as_verified(library, loaded)


# -- links another user owns, folders others can add files to (a second-user audit found these) --


def shared_sticky(tmp_path: Path) -> Path:
    """A folder as /tmp is: anyone may add to it, and only an entry's owner may replace it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    return shared


def test_a_root_linked_by_another_user_to_a_folder_anyone_can_add_to_is_refused(dirs, tmp_path, as_root):
    """The link's target (a sticky folder of root's) passes the folder checks, but the link is
    theirs: in a sticky folder they can point it elsewhere between the checks and the compile."""
    target = shared_sticky(tmp_path)
    dirs.root.parent.mkdir(parents=True)
    os.chmod(dirs.root.parent, 0o1777)
    dirs.root.symlink_to(target)
    os.lchown(dirs.root, NOBODY, NOBODY)
    ran = build(dirs)
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    assert (
        f"error: {dirs.root} is a symlink owned by nobody (uid {NOBODY}), not by this user or root, who can point "
        "it elsewhere at any time"
        in ran.stderr
        and "==> load" not in ran.stderr
    )
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("planted", ["their link to a sticky folder", "a sticky folder"])
def test_an_inductor_cache_others_can_add_kernels_to_is_refused(dirs, tmp_path, as_root, planted):
    """Inductor loads a kernel it finds already built under its cache: one in a folder anyone can
    add to (a link of theirs to /tmp, or a cache folder set to mode 1777) is theirs to plant."""
    shared = shared_sticky(tmp_path)
    cache = shared
    if planted == "their link to a sticky folder":
        cache = tmp_path / "torchinductor_victim"
        cache.symlink_to(shared)
        os.lchown(cache, NOBODY, NOBODY)
    ran = build(dirs, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    says = (
        f"{cache} is a symlink owned by nobody (uid {NOBODY})"
        if cache != shared
        else f"{shared} can be written by everyone (mode 1777): files another user adds to it would be used as this "
        "user's own"
    )
    assert f"error: {says}" in ran.stderr and "torch Inductor's cache folder" in ran.stderr, ran.stderr
    assert "==> load" not in ran.stderr and list(shared.iterdir()) == []


@pytest.mark.parametrize("flag", ["--build-dir", "--dist"])
@pytest.mark.parametrize("whose", ["theirs", "anyone's (sticky)"])
def test_a_build_or_dist_folder_another_user_can_write_is_refused(dirs, tmp_path, as_root, flag, whose):
    """The build reuses the compiled models its cache holds, and the wheels in dist/ are what gets
    installed and published: a folder another user made first (or anyone can add to) lets them put
    their own .so into this user's wheels."""
    folder = dirs.build if flag == "--build-dir" else dirs.dist
    folder.mkdir(parents=True)
    if whose == "theirs":
        os.chmod(folder, 0o777)
        os.chown(folder, NOBODY, NOBODY)
        says = f"{folder} is owned by nobody (uid {NOBODY}), not by this user or root"
    else:
        os.chmod(folder, 0o1777)
        says = f"{folder} can be written by everyone (mode 1777)"
    ran = build(dirs)
    assert ran.returncode == OutputDirError.exit_code, ran.stderr
    assert f"error: {flag}: {says}" in ran.stderr, ran.stderr
    assert f"hint: give {flag} a folder only you (or root) can write" in ran.stderr
    assert "==> load" not in ran.stderr and list(folder.iterdir()) == [] and not dirs.root.exists()
