"""What the local index is trusted for: uploads from its owner alone (a password only they can
read, which publish sends from any folder, to their own index only), and the models' names
never sent to another index."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import run_cli

SETPRIV = shutil.which("setpriv")
PYTHON = os.path.realpath(sys.executable)  # the interpreter itself: another user runs it isolated (-I)
AS_NOBODY = [SETPRIV or "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="acting as a second local user (nobody) needs root and setpriv"
)

# What another local user runs: a plain POST of a wheel, as twine sends it, with the given Basic auth.
POST_AS_ANOTHER_USER = r"""
import base64, sys, urllib.error, urllib.request
url, name, auth = sys.argv[1:4]
data = sys.stdin.buffer.read()
boundary = "xx-boundary-xx"
fields = [("\x3aaction", b"file_upload"), ("protocol_version", b"1")]
body = b"".join(
    f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode() + v + b"\r\n" for k, v in fields
)
body += (f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{name}"\r\n'
         "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
request = urllib.request.Request(url, data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
if auth:
    request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A local index on a free port (with a private prefix of its own), started in a private folder."""
    home = tmp_path_factory.mktemp("index")
    started = run_cli(
        "index", "start", "--port", "0", "--data", str(home / "data"), "--private-prefix", "Acme_", cwd=home
    )
    assert started.code == 0, started.err
    # both lines spell the variant's placeholder one way (a newcomer saw <variant>, then {variant})
    assert "--index-url http://127.0.0.1:" in started.err and "/<variant>/simple" in started.err, started.err
    assert "  torch comes from https://download.pytorch.org/whl/<variant>/ (redirected)" in started.err, started.err
    yield home, json.loads((home / "build" / "index" / "state.json").read_text())
    assert run_cli("index", "stop", cwd=home).code == 0


def held(data: Path) -> list[str]:
    return sorted(str(p.relative_to(data)) for p in data.rglob("*.whl"))


@needs_nobody
def test_another_local_user_cannot_upload_to_the_local_index(index, wheel):
    """Another local user POSTed its own wheel under the model's name (answer 200); the owner's
    publish then found it "already on the index", and every pip install got that user's bytes."""
    home, state = index
    before = held(Path(state["data"]))
    tried = {
        auth: subprocess.run(
            [*AS_NOBODY, PYTHON, "-I", "-c", POST_AS_ANOTHER_USER, state["url"] + "cpu/", wheel.name, auth],
            input=wheel.read_bytes(),
            capture_output=True,
            timeout=60,
        )
        for auth in ("", "local:no-auth", "modelwheel:")
    }
    assert {auth: ran.stdout.decode().strip() for auth, ran in tried.items()} == {
        "": "401",
        "local:no-auth": "403",
        "modelwheel:": "403",
    }, {a: r.stderr[-500:] for a, r in tried.items()}
    secret = home / "build" / "index" / "upload.secret"
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    read = subprocess.run([*AS_NOBODY, PYTHON, "-I", "-c", f"open({str(secret)!r})"], capture_output=True, text=True)
    assert read.returncode == 1 and "PermissionError" in read.stderr
    assert held(Path(state["data"])) == before


def serve_as_nobody(log: Path) -> tuple[subprocess.Popen, int]:
    """Another user's server on 127.0.0.1 that logs each request's Authorization header."""
    code = (
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def _any(self):\n"
        "        print(self.command, self.path, self.headers.get('Authorization'), flush=True)\n"
        "        self.send_response(404); self.send_header('Content-Length', '0'); self.end_headers()\n"
        "    do_GET = do_POST = _any\n"
        "server = http.server.HTTPServer(('127.0.0.1', 0), H)\n"
        "print(server.server_port, flush=True)\n"
        "server.serve_forever()\n"
    )
    server = subprocess.Popen([*AS_NOBODY, PYTHON, "-I", "-u", "-c", code], stdout=log.open("w"))
    for _ in range(100):
        if log.read_text().strip():
            return server, int(log.read_text().split()[0])
        time.sleep(0.1)
    server.kill()
    raise AssertionError("the other user's server did not start")


@needs_nobody
def test_publish_sends_the_index_its_password_from_any_folder_and_to_no_one_else(index, wheel, tmp_path, monkeypatch):
    """`publish --index <the local index's URL>` from a folder other than the index's (it failed
    with exit 16, "no username"); a server another user runs on 127.0.0.1 never gets the password."""
    home, state = index
    for name in ("TWINE_USERNAME", "TWINE_PASSWORD", "MODELWHEEL_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = run_cli("publish", "--index", state["url"], "--wheel", str(wheel), cwd=elsewhere)
    assert ran.code == 0, ran.err
    assert f"{wheel.name}: uploaded to the cpu index" in ran.err
    assert (Path(state["data"]) / "cpu" / wheel.name).is_file()
    log = tmp_path / "theirs.log"
    server, port = serve_as_nobody(log)
    try:
        theirs = run_cli("publish", "--index", f"http://127.0.0.1:{port}/", "--wheel", str(wheel), cwd=home)
    finally:
        server.kill()
        server.wait()
    secret = (home / "build" / "index" / "upload.secret").read_text().strip()
    assert theirs.code == 16 and "error: no username to upload to" in theirs.err, theirs.err
    assert secret not in log.read_text() and "Basic" not in log.read_text(), log.read_text()


def answer(url: str) -> tuple[int, str]:
    """Status and Location (or body) of one GET, redirects not followed."""

    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(Keep).open(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location") or exc.read().decode()


def test_names_of_the_models_namespace_never_leave_the_index(index):
    """A model the index does not hold (a typo, another target's model, a new name) answered 303
    to PyPI, where anyone can register that name: now 404, as for the index's own prefix. torch
    and other dependencies still redirect to their upstreams."""
    _, state = index
    simple = state["url"] + "cpu/simple/"
    assert answer(simple + "model-tiyn/") == (
        404,
        "modelwheel index: no model-tiyn here; names starting with model- or acme- are never looked up on "
        "another index\n",
    )
    assert answer(simple + "acme-tools/")[0] == 404
    assert answer(simple + "Model_Tiyn/") == (301, simple + "model-tiyn/")  # pypiserver's own normalisation, then 404
    assert answer(simple + "numpy/") == (303, "https://pypi.org/simple/numpy/")
    assert answer(simple + "torch/") == (303, "https://download.pytorch.org/whl/cpu/torch/")
    with socket.create_connection(("127.0.0.1", state["port"])):
        pass  # the index still runs


@pytest.mark.parametrize("whose", ["nobody's", "everyone's"])
def test_index_start_refuses_a_data_folder_another_user_owns_or_can_write(whose, wheel, tmp_path):
    """`index start --data` with a folder `nobody` owned (a wheel planted in it) started, and
    served that wheel; the folder now passes the check every folder the tool writes passes."""
    if whose == "nobody's" and (os.geteuid() != 0):
        pytest.skip("a folder of another user's (nobody) needs root to make")
    data = tmp_path / "data"
    (data / "cpu").mkdir(parents=True)
    shutil.copy(wheel, data / "cpu" / wheel.name)  # the planted wheel
    if whose == "nobody's":
        for each in (data, data / "cpu"):
            os.chown(each, 65534, 65534)
        owner = f"{data} is owned by nobody (uid 65534)"
    else:
        os.chmod(data / "cpu", 0o777)
        owner = f"{data / 'cpu'} can be written by everyone (mode 777, no sticky bit)"
    home = tmp_path / "home"
    home.mkdir()
    ran = run_cli("index", "start", "--port", "0", "--data", str(data), cwd=home)
    if ran.code == 0:
        run_cli("index", "stop", cwd=home)
    assert ran.code == 10, ran.err
    assert f"error: --data: {owner}" in ran.err, ran.err
    assert (
        "another user could put their own wheels on the index, and every pip install would get them; refused" in ran.err
    )
    assert "hint: give --data a folder only you (or root) can write" in ran.err
    assert not (home / "build").exists()


def test_a_refused_index_start_leaves_nothing_behind(index, tmp_path):
    """A start refused for a port another index holds left an empty build/index/data/."""
    _, state = index
    ran = run_cli("index", "start", "--port", str(state["port"]), cwd=tmp_path)
    assert ran.code == 13 and "Address already in use" in ran.err, ran.err
    assert list(tmp_path.iterdir()) == []
