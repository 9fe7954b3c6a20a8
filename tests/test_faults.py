"""Faults and bad input (issue 14): each ends in a clear refusal or a correct result, nothing lost, nothing leaked."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.outdir import claim_output_dir
from pipeline.templates import wheel_integrity

from .conftest import REPO, TINY_SPEC, run_cli
from .test_end_to_end import altered, installed_package, manifest_of, run_in

# --- load_numpy(): every array the C interface cannot take as it is is converted or refused ---

# One process runs every case against the installed wheel; each case is compared with the same
# numbers passed as a plain native, C-ordered, writable array.
NUMPY_CASES = r"""
import json, numpy as np, model_tiny
m = model_tiny.load_numpy()
rng = np.random.default_rng(7)
x = rng.standard_normal((2, 3, 8, 8), dtype=np.float32)
t = (rng.random(2) * 1000).astype(np.float32)

def read_only(a):
    frozen = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)  # memory that cannot be written at all
    assert not frozen.flags.writeable
    return frozen

def misaligned(a):
    raw = np.zeros(a.nbytes + 1, np.uint8)
    shifted = raw[1:].view(a.dtype).reshape(a.shape)
    shifted[...] = a
    assert not shifted.flags.aligned
    return shifted

def strided(a):
    wide = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]

cases = {
    "big_endian": (x.astype(">f4"), t.astype(">f4")),
    "fortran": (np.asfortranarray(x), t),
    "strided": (strided(x), strided(t)),
    "reversed": (x[::-1], t[::-1]),
    "broadcast": (np.broadcast_to(x[:1], x.shape), np.broadcast_to(t[:1], t.shape)),
    "read_only": (read_only(x), read_only(t)),
    "misaligned": (misaligned(x), misaligned(t)),
    "big_endian_fortran_read_only": (read_only(np.asfortranarray(x.astype(">f4"))), t.astype(">f4")),
    "float64": (x.astype(np.float64), t),
    "int32": (x, t.astype(np.int32)),
    "object": (x.astype(object), t),
    "masked": (np.ma.masked_array(x, mask=x > 0), t),
    "zero_d": (x, np.array(t[0])),
    "rank_3": (x[0], t),
    "rank_5": (x[None], t),
}
results = {}
for name, args in cases.items():
    before = [np.array(a, copy=True) for a in args]
    try:
        got = m(*args)
    except ValueError as exc:
        results[name] = {"error": str(exc)}
        continue
    want = m(*[np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")) for a in args])
    results[name] = {
        "error": None,
        "equal": all(np.array_equal(g, w) for g, w in zip(got, want)),
        "finite": all(bool(np.isfinite(g).all()) for g in got),
        "outputs_writeable": all(g.flags.writeable for g in got),
        "inputs_unchanged": all(np.array_equal(a, b) for a, b in zip(args, before)),
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def numpy_cases(installed) -> dict[str, dict]:
    ran = run_in(installed, NUMPY_CASES)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def _correct(result: dict) -> None:
    assert result["error"] is None, result["error"]
    assert result["equal"] and result["finite"], "the model must see the same numbers as from a plain array"
    assert result["outputs_writeable"] and result["inputs_unchanged"]


def test_big_endian_arrays_are_converted(numpy_cases):
    _correct(numpy_cases["big_endian"])


@pytest.mark.parametrize("case", ["fortran", "strided", "reversed", "broadcast"])
def test_non_contiguous_and_fortran_arrays_are_copied_to_c_order(numpy_cases, case):
    _correct(numpy_cases[case])


def test_read_only_arrays_are_read_in_place_and_give_writable_outputs(numpy_cases):
    _correct(numpy_cases["read_only"])


def test_misaligned_arrays_are_copied(numpy_cases):
    _correct(numpy_cases["misaligned"])


def test_every_fault_at_once_is_converted(numpy_cases):
    _correct(numpy_cases["big_endian_fortran_read_only"])


@pytest.mark.parametrize(("case", "message"), [
    ("float64", "input 'x': expected dtype float32, got float64"),
    ("int32", "input 't': expected dtype float32, got int32"),
    ("object", "input 'x': expected dtype float32, got object"),
    ("masked", "input 'x': expected a plain numpy.ndarray, got a masked array: pass a.filled(value)"),
])
def test_wrong_dtype_or_masked_array_is_refused_naming_the_input(numpy_cases, case, message):
    assert numpy_cases[case] == {"error": message}


@pytest.mark.parametrize(("case", "message"), [
    ("zero_d", "input 't': expected 1 dims ['batch'], got 0 dims [] (a 0-d scalar)"),
    ("rank_3", "input 'x': expected 4 dims ['batch', 3, 8, 8], got 3 dims [3, 8, 8]"),
    ("rank_5", "input 'x': expected 4 dims ['batch', 3, 8, 8], got 5 dims [1, 2, 3, 8, 8]"),
])
def test_zero_d_or_wrong_rank_is_refused_with_expected_and_got(numpy_cases, case, message):
    assert numpy_cases[case] == {"error": message}


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
    records = {"model.so": {"sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(), "size": artifact.stat().st_size}}
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
    records = {"model.so": {"sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(), "size": artifact.stat().st_size}}
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


# --- publishing: a password nobody percent-encoded never reaches output, logs or files ---

# Every separator a URL parser might split on, each piece distinctive so a leaked fragment shows.
PASSWORD = "Kx9/Vq7@Mn3:Pw5#Rt2%Ls4 Jh6"
PASSWORD_PIECES = ("Kx9", "Vq7", "Mn3", "Pw5", "Rt2", "Ls4", "Jh6")


@pytest.fixture
def closed_port():
    """A port that refuses connections for the whole test: bound, never listening, so no other
    process (another test run's index) can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def leaked(text: str) -> list[str]:
    return [piece for piece in PASSWORD_PIECES if piece in text]


@pytest.mark.parametrize("source", ["index-env", "index-flag", "index-env-with-target", "twine-env", "spec-and-index-env"])
def test_unencoded_password_never_leaks_from_a_failing_publish(tiny_build, tmp_path, source, closed_port):
    build_dirs, _ = tiny_build
    wheel = next(build_dirs.dist.glob("*.whl"))
    port = closed_port
    with_userinfo = f"http://alice:{PASSWORD}@127.0.0.1:{port}/"
    env = {"MODELWHEEL_INDEX_URL": "", "MODELWHEEL_SIMPLE_URL": ""}
    args = ["-v", "publish", "--wheel", str(wheel), "--build-dir", str(tmp_path / "build")]
    if source == "index-env":
        env["MODELWHEEL_INDEX_URL"] = with_userinfo
    elif source == "index-flag":
        args += ["--index", with_userinfo]
    elif source == "index-env-with-target":  # no existence check: twine itself meets the closed port
        env["MODELWHEEL_INDEX_URL"] = with_userinfo + "{target}/"
    elif source == "twine-env":
        env.update(MODELWHEEL_INDEX_URL=f"http://127.0.0.1:{port}/{{target}}/", TWINE_USERNAME="alice", TWINE_PASSWORD=PASSWORD)
    else:  # the spec's wheel found in --dist, as `make publish` runs it
        env["MODELWHEEL_INDEX_URL"] = with_userinfo
        args = ["-v", "publish", "--spec", str(TINY_SPEC), "--dist", str(build_dirs.dist), "--build-dir", str(tmp_path / "build")]
    ran = run_cli(*args, env=env, cwd=tmp_path, timeout=300)
    assert ran.code in (13, 16), ran.err  # the index cannot be reached, or twine's upload failed
    assert f"127.0.0.1:{port}" in ran.err, "the index is still named, without its credentials"
    assert not leaked(ran.out) and not leaked(ran.err), ran.out + ran.err
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert not [path for path in written if leaked(path.read_bytes().decode(errors="replace"))]


class _RefusingIndex(http.server.BaseHTTPRequestHandler):
    """Answers 403 to everything, recording each request's method and Authorization header."""

    seen: list[tuple[str, str | None]] = []

    def _refuse(self) -> None:
        self.seen.append((self.command, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _refuse

    def log_message(self, *args) -> None:
        pass


def _server_on_a_port_holding_409() -> http.server.ThreadingHTTPServer:
    """A refusing index on a port such as 40912: its 403 must not be read as pypiserver's 409 "already
    exists" (a URL's digits once were, and a refused upload passed as an already published one)."""
    for port in range(40900, 41000):
        try:
            return http.server.ThreadingHTTPServer(("127.0.0.1", port), _RefusingIndex)
        except OSError:
            continue
    pytest.fail("ports 40900-40999 are all in use")


@pytest.mark.parametrize(("path", "method"), [("/", "GET"), ("/{target}/", "POST")])
def test_unencoded_password_reaches_the_index_intact(tiny_build, tmp_path, path, method):
    """The existence check (GET) and twine's upload (POST) both send the password as typed."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = _server_on_a_port_holding_409()
    _RefusingIndex.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{server.server_port}{path}"
        ran = run_cli("publish", "--wheel", str(wheel), cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": url, "MODELWHEEL_SIMPLE_URL": ""})
    finally:
        server.shutdown()
        server.server_close()
    assert ran.code in (13, 16), ran.err
    assert not leaked(ran.out + ran.err), ran.err
    expected = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert (method, expected) in _RefusingIndex.seen, _RefusingIndex.seen


# --- small ones: a link left aside, the log folder named, dangling links swept, no colour codes ---


def test_link_moved_aside_by_a_killed_build_is_put_back_by_the_next(tmp_path):
    installed = tmp_path / "site-packages" / "model_x" / "artifacts"
    installed.mkdir(parents=True)
    path = tmp_path / "opt" / "x" / "1.0" / "cpu"
    path.parent.mkdir(parents=True)
    path.symlink_to(installed, target_is_directory=True)
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal, sys\nfrom pathlib import Path\nfrom pipeline.outdir import claim_output_dir\n"
         "with claim_output_dir(Path(sys.argv[1])):\n    os.kill(os.getpid(), signal.SIGKILL)", str(path)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert list(path.parent.glob(".cpu.displaced-*")), "a build killed outright leaves the installed link aside"
    with claim_output_dir(path) as claimed:
        assert claimed.is_dir() and not claimed.is_symlink()
    assert path.is_symlink() and path.resolve() == installed.resolve(), "the next build puts the link back"
    assert sorted(p.name for p in path.parent.iterdir()) == ["cpu"]


def _bad_specs(tmp_path: Path, count: int) -> list[str]:
    specs = [tmp_path / f"bad{index}.toml" for index in range(count)]
    for spec in specs:
        spec.write_text("[model\n")  # malformed TOML: each build fails at once (exit 3)
    return [str(spec) for spec in specs]


def test_parallel_build_failures_name_the_real_log_folder(tmp_path):
    build_dir = tmp_path / "elsewhere"
    specs = [a for spec in _bad_specs(tmp_path, 2) for a in ("--spec", spec)]
    ran = run_cli("build", *specs, "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"), "--build-dir", str(build_dir))
    assert ran.code == 1 and "2 build(s) failed" in ran.err, ran.err
    assert f"hint: each build's log is in {build_dir / 'logs'}/" in ran.err


def test_one_failed_build_names_its_log_file(tmp_path):
    import io

    from pipeline.errors import PipelineError
    from pipeline.parallel import build_many
    from pipeline.progress import Progress

    (spec,) = _bad_specs(tmp_path, 1)
    with pytest.raises(PipelineError) as failed:
        build_many([spec], [], 1, tmp_path / "elsewhere" / "logs", Progress(io.StringIO()), {})
    assert failed.value.exit_code == 3
    log = tmp_path / "elsewhere" / "logs" / f"{tmp_path.name}-bad0.log"
    assert failed.value.hint == f"its log is {log}" and log.is_file()


def test_link_sweeps_links_left_by_uninstalled_versions_of_the_same_model(installed, wheel, tmp_path):
    opt_path = Path(manifest_of(wheel)["opt_path"])  # <root>/tiny/0.1/cpu
    model_dir, root = opt_path.parents[1], opt_path.parents[2]
    gone = tmp_path / "old-venv" / "lib" / "python3.11" / "site-packages"
    uninstalled = model_dir / "0.0" / "cpu"  # what `pip uninstall model-tiny` of 0.0 leaves: a dangling link
    foreign = model_dir / "0.0" / "cuda"  # dangling, but not made by a model_tiny runtime
    other_model = root / "other" / "0.1" / "cpu"  # another model's: not this load's to sweep
    for link, target in ((uninstalled, gone / "model_tiny" / "artifacts"), (foreign, tmp_path / "elsewhere"),
                         (other_model, gone / "model_other" / "artifacts")):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    try:
        # A CPU wheel's load() writes nothing; `link` (and a CUDA wheel's load()) sweeps
        ran = subprocess.run([str(installed.parent / "model-tiny"), "link"], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        assert f"removed {uninstalled}" in ran.stdout
        assert not uninstalled.is_symlink(), "the dangling link of an uninstalled version is removed"
        assert foreign.is_symlink() and other_model.is_symlink()
        assert opt_path.is_symlink() and opt_path.exists()
    finally:
        shutil.rmtree(model_dir / "0.0", ignore_errors=True)
        shutil.rmtree(root / "other", ignore_errors=True)


def test_twine_output_has_no_colour_codes(tiny_build, tmp_path):
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = _server_on_a_port_holding_409()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # no existence check with {target}: twine's upload meets the 403 and its output is shown
        url = f"http://127.0.0.1:{server.server_port}/{{target}}/"
        ran = run_cli("publish", "--wheel", str(wheel), cwd=tmp_path,
                      env={"MODELWHEEL_INDEX_URL": url, "MODELWHEEL_SIMPLE_URL": "", "NO_COLOR": "1",
                           "TWINE_USERNAME": "someone", "TWINE_PASSWORD": "something"})
    finally:
        server.shutdown()
        server.server_close()
    # twine's status line, not any "403": the port (409xx) or a temp path may hold those digits
    assert ran.code == 16 and re.search(r"HTTPError:\s+403\b", ran.err), ran.err
    assert "\x1b[" not in ran.out + ran.err, ran.err
