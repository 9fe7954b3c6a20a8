"""Publishing's output: a password nobody percent-encoded never reaches output, logs or files,
and reaches the index intact; twine's output has no colour codes."""

from __future__ import annotations

import base64
import http.server
import re
import socket
import threading

import pytest

from .conftest import TINY_SPEC, run_cli

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


@pytest.mark.parametrize(
    "source", ["index-env", "index-flag", "index-env-with-target", "twine-env", "spec-and-index-env"]
)
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
        env.update(
            MODELWHEEL_INDEX_URL=f"http://127.0.0.1:{port}/{{target}}/", TWINE_USERNAME="alice", TWINE_PASSWORD=PASSWORD
        )
    else:  # the spec's wheel found in --dist, as `make publish` runs it
        env["MODELWHEEL_INDEX_URL"] = with_userinfo
        args = [
            "-v",
            "publish",
            "--spec",
            str(TINY_SPEC),
            "--dist",
            str(build_dirs.dist),
            "--build-dir",
            str(tmp_path / "build"),
        ]
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
        ran = run_cli(
            "publish",
            "--wheel",
            str(wheel),
            cwd=tmp_path,
            env={"MODELWHEEL_INDEX_URL": url, "MODELWHEEL_SIMPLE_URL": ""},
        )
    finally:
        server.shutdown()
        server.server_close()
    assert ran.code in (13, 16), ran.err
    assert not leaked(ran.out + ran.err), ran.err
    expected = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert (method, expected) in _RefusingIndex.seen, _RefusingIndex.seen


def test_twine_output_has_no_colour_codes(tiny_build, tmp_path):
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    server = _server_on_a_port_holding_409()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # no existence check with {target}: twine's upload meets the 403 and its output is shown
        url = f"http://127.0.0.1:{server.server_port}/{{target}}/"
        ran = run_cli(
            "publish",
            "--wheel",
            str(wheel),
            cwd=tmp_path,
            env={
                "MODELWHEEL_INDEX_URL": url,
                "MODELWHEEL_SIMPLE_URL": "",
                "NO_COLOR": "1",
                "TWINE_USERNAME": "someone",
                "TWINE_PASSWORD": "something",
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    # twine's status line, not any "403": the port (409xx) or a temp path may hold those digits
    assert ran.code == 16 and re.search(r"HTTPError:\s+403\b", ran.err), ran.err
    assert "\x1b[" not in ran.out + ran.err, ran.err
