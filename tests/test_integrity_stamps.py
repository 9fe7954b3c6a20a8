"""Integrity: a changed artifact is caught even when its mtime is put back."""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.wheel_template.runtime import _integrity as wheel_integrity

from .test_end_to_end import altered, installed_package, run_in

# --- integrity: corruption is caught even when the file's mtime is put back ---


def flip_middle_byte(path: Path, original: bytes) -> None:
    middle = len(original) // 2
    with path.open("r+b") as handle:  # in place: same inode, same size
        handle.seek(middle)
        handle.write(bytes([original[middle] ^ 0xFF]))


def corrupt_keeping_mtime(path: Path, original: bytes, reference: Path) -> None:
    subprocess.run(["touch", "-r", str(path), str(reference)], check=True)
    flip_middle_byte(path, original)
    subprocess.run(["touch", "-r", str(reference), str(path)], check=True)


def test_stamp_catches_a_byte_changed_with_mtime_put_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    artifact = tmp_path / "model.so"
    artifact.write_bytes(bytes(range(256)) * 64)
    records = {
        "model.so": {"sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(), "size": artifact.stat().st_size}
    }
    wheel_integrity.check_files(tmp_path, records)  # hashed once, then stamped
    before = artifact.stat()
    time.sleep(0.05)  # past a coarse file clock's tick (4 ms on older kernels), so the change moves ctime
    corrupt_keeping_mtime(artifact, artifact.read_bytes(), tmp_path / "reference")
    after = artifact.stat()
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (before.st_mtime_ns, before.st_size, before.st_ino)
    with pytest.raises(wheel_integrity.IntegrityError, match=r"model\.so has sha256 .*the file was altered"):
        wheel_integrity.check_files(tmp_path, records)


def test_stamp_still_spares_hashing_an_unchanged_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    artifact = tmp_path / "model.so"
    artifact.write_bytes(b"compiled" * 1000)
    records = {
        "model.so": {"sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(), "size": artifact.stat().st_size}
    }
    wheel_integrity.check_files(tmp_path, records)

    def no_hashing(path):
        raise AssertionError(f"{path} was hashed again although it did not change")

    monkeypatch.setattr(wheel_integrity, "sha256_file", no_hashing)
    wheel_integrity.check_files(tmp_path, records)


def test_installed_wheel_refuses_a_corrupted_so_whose_mtime_was_put_back(installed, tmp_path):
    so = installed_package(installed) / "artifacts" / "model.so"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = run_in(installed, "import model_tiny; model_tiny.load_numpy()", **env)
    assert first.returncode == 0, first.stderr
    assert any((tmp_path / "cache" / "modelwheel" / "verified").iterdir()), "the first load stamps the verified file"
    mtime = so.stat().st_mtime_ns
    with altered(so, lambda path, original: corrupt_keeping_mtime(path, original, tmp_path / "reference")):
        assert so.stat().st_mtime_ns == mtime
        native = run_in(installed, "import model_tiny; model_tiny.load_numpy()", **env)
        torch_side = run_in(installed, "import model_tiny; model_tiny.load()", **env)
    for ran in (native, torch_side):
        assert ran.returncode != 0 and "IntegrityError" in ran.stderr, ran.stderr
        assert "the file was altered; reinstall the wheel" in ran.stderr
