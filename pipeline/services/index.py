"""The embedded package index: pypiserver, one index per target under /<target>/ (as PyTorch's /cpu, /cu130).

    python -m pipeline index start     # in the background; state in build/index/state.json
    python -m pipeline index stop
    python -m pipeline index serve     # in the foreground

It listens on 127.0.0.1 only. Uploads need the index's own password (index_auth: a file only
its owner can read, which `publish` sends to this user's index alone; any other local user is
refused) and never overwrite: pypiserver answers 409 for a file it already has. A package it
does not hold redirects elsewhere, so
`pip install model-x --index-url <index>/cpu/simple` alone resolves every dependency: torch to
PyTorch's index for the variant (a CPU wheel pins torch==2.13.0+cpu, which only PyTorch's CPU
index carries), anything else (safetensors, numpy) to PyPI, pypiserver's fallback. Both
upstreams can be given (``--torch-url``, ``--fallback-url``), e.g. a company mirror; an empty
``--fallback-url ""`` serves only what the index holds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IndexServerError, OutputDirError
from ..wheel_template.runtime import _trust as wheel_trust
from . import index_auth
from .writable import made_folders, remove_if_empty

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

TARGET_RE = re.compile(r"^(cpu|cu\d+)$")
DEFAULT_PORT = 8765
FALLBACK_URL = "https://pypi.org/simple/"
TORCH_URL = "https://download.pytorch.org/whl/{variant}/"  # PyTorch's simple index per build variant
TORCH_PAGE = re.compile(r"^simple/torch/?$")
SIMPLE_PROJECT = re.compile(r"^simple/([^/]+)/?$")
PRIVATE_PREFIXES = ("model-",)  # the models' namespace: every wheel this tool builds is model-<name>
STATE_DIR = Path("build") / "index"


def make_app(
    data_dir: Path,
    secret: str,
    fallback_url: str = FALLBACK_URL,
    torch_url: str = TORCH_URL,
    private: tuple[str, ...] = PRIVATE_PREFIXES,
) -> WSGIApplication:
    """A WSGI app dispatching /<target>/... to a pypiserver app rooted at data_dir/<target>;
    uploads only with ``secret`` (user ``modelwheel``); names starting with a ``private`` prefix
    never redirect elsewhere."""
    import hmac

    import pypiserver

    def owner(username: str, password: str) -> bool:
        return username == index_auth.USERNAME and hmac.compare_digest(password.encode(), secret.encode())

    apps: dict[str, WSGIApplication] = {}

    def dispatch(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        target, _, rest = path.lstrip("/").partition("/")
        if not TARGET_RE.match(target):
            body = b"modelwheel index: one index per target, e.g. /cpu/simple/\n"
            start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        root = data_dir / target
        if TORCH_PAGE.match(rest) and not any(root.glob("torch-*")):
            start_response(
                "303 See Other",
                [("Location", torch_url.format(variant=target).rstrip("/") + "/torch/"), ("Content-Length", "0")],
            )
            return [b""]
        if target not in apps:
            root.mkdir(parents=True, exist_ok=True)
            apps[target] = pypiserver.app(
                roots=[str(root)],
                authenticate=["update"],
                auther=owner,
                overwrite=False,
                disable_fallback=not fallback_url,
                fallback_url=fallback_url or FALLBACK_URL,
            )
        environ = {**environ, "SCRIPT_NAME": environ.get("SCRIPT_NAME", "") + f"/{target}", "PATH_INFO": "/" + rest}
        project = SIMPLE_PROJECT.match(rest)
        if project and _normalized(project[1]).startswith(private):
            return _kept_here(apps[target], environ, start_response, project[1], private)
        return apps[target](environ, start_response)

    return dispatch


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _kept_here(
    app: WSGIApplication,
    environ: WSGIEnvironment,
    start_response: StartResponse,
    project: str,
    private: tuple[str, ...],
) -> Iterable[bytes]:
    """pypiserver's answer for a name of the models' namespace, except that its redirect to the
    fallback (PyPI) becomes 404: a model missing here (a typo, another target's model, a new
    name) must never be installed from whoever registered that name upstream (dependency
    confusion). Redirects within this index (pypiserver's name normalisation) pass."""
    answer: dict[str, Any] = {}
    written: list[bytes] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> Callable[[bytes], object]:
        answer.update(status=status, headers=headers)
        return written.append

    chunks = app(environ, capture)
    try:
        written.extend(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    location = dict((k.lower(), v) for k, v in answer["headers"]).get("location", "")
    where = urllib.parse.urlsplit(location).netloc
    if not answer["status"].startswith("3") or where in ("", environ.get("HTTP_HOST")):
        start_response(answer["status"], answer["headers"])
        return [b"".join(written)]
    body = (
        f"modelwheel index: no {project} here; names starting with {' or '.join(private)} are never looked "
        "up on another index\n"
    ).encode()
    start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def serve(
    data_dir: Path,
    port: int,
    fallback_url: str = FALLBACK_URL,
    torch_url: str = TORCH_URL,
    listening_fd: int | None = None,
    state_dir: Path = STATE_DIR,
    private: tuple[str, ...] = (),
) -> None:
    """In the foreground: on ``port``, or on the socket ``start`` bound and handed over; the
    upload password is the one in ``state_dir`` (made there when missing)."""
    import waitress

    check_data_dir(data_dir)
    secret = index_auth.ensure_secret(state_dir)

    where = (
        {"sockets": [socket.socket(fileno=listening_fd)]}
        if listening_fd is not None
        else {"host": "127.0.0.1", "port": port}
    )
    waitress.serve(
        make_app(data_dir, secret, fallback_url, torch_url, private_prefixes(private)), threads=4, _quiet=True, **where
    )


def _listen(port: int) -> socket.socket:
    """127.0.0.1:port bound here, so a port another program (another index too) holds is refused
    now, before the server starts, and port 0 gets a free port no one can take in between."""
    sock = socket.socket()
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # as waitress binds: a closed index's TIME_WAIT is no obstacle
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise IndexServerError(
            f"the local index cannot listen on 127.0.0.1:{port}: {exc.strerror}",
            "another program holds the port (an index started from another folder, too): "
            "choose another with --port, or --port 0 for a free one",
        ) from None
    return sock


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "cpu/simple/", timeout=2) as response:
            status: int = response.status
            return status == 200
    except OSError:
        return False


LOCAL_URL = re.compile(r"^http://127\.0\.0\.1:\d{1,5}/$")


def read_state(state_dir: Path = STATE_DIR) -> dict[str, Any] | None:
    """The running local index ({url, pid, data}), or None when none is running. The state file
    says where wheels go anonymously and which process `index stop` ends: one another user could
    have written is refused, as is one naming anything but an index on 127.0.0.1."""
    state_file = state_dir / "state.json"
    if not state_file.is_file():
        return None
    found = wheel_trust.chain_problem(state_dir.absolute(), private=True) or _file_problem(state_file)
    if found:
        raise IndexServerError(
            f"{found}: the local index's state file could have been written by another user; refused",
            f"remove {state_dir.absolute()} (and stop any index of yours with kill), then `modelwheel index start`",
        )
    state: dict[str, Any] = json.loads(state_file.read_text())
    if not LOCAL_URL.match(str(state.get("url"))) or not _is_index_process(state.get("pid")):
        return None  # not this tool's index on this machine, or one that is gone (its pid maybe taken since)
    return state


def _file_problem(path: Path) -> str | None:
    info = os.lstat(path)
    if (
        stat.S_ISLNK(info.st_mode)
        or info.st_uid not in {0, os.geteuid()}
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        return (
            f"{path} is not a plain file of this user's that only they can write (mode {stat.S_IMODE(info.st_mode):o})"
        )
    return None


def _index_command(pid: object) -> list[str] | None:
    """The command line of ``pid`` where it is a live `pipeline index serve` (the kernel's record of
    it, not the state file's word), else None."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return command if command[1:5] == ["-m", "pipeline", "index", "serve"] else None


def _is_index_process(pid: object) -> bool:
    return _index_command(pid) is not None


def yours_elsewhere() -> list[tuple[int, Path]]:
    """This user's running local indexes, each (pid, its state folder), from the kernel's record of
    their command lines: `index stop` from another folder said only "no local index was started from
    this folder", and exited 0, with one running (H63)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
        except OSError:  # gone meanwhile
            continue
        command = _index_command(int(entry.name))  # read once: None where it is no index, or gone
        if command is not None and "--state-dir" in command[:-1]:
            found.append((int(entry.name), Path(command[command.index("--state-dir") + 1])))
    return found


def private_prefixes(extra: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """model- and the prefixes given (``--private-prefix``), normalised as pip normalises names."""
    return tuple(dict.fromkeys([*PRIVATE_PREFIXES, *(_normalized(p) for p in extra if p)]))


def start(
    data_dir: Path,
    port: int,
    state_dir: Path = STATE_DIR,
    fallback_url: str = FALLBACK_URL,
    torch_url: str = TORCH_URL,
    private: tuple[str, ...] = (),
) -> dict[str, Any]:
    running = read_state(state_dir)
    if running:
        return running
    check_data_dir(data_dir)
    listening = _listen(port)  # nothing is made before the port is ours: a refused start leaves nothing
    port = listening.getsockname()[1]
    with listening:
        index_auth.ensure_secret(state_dir)  # before the server starts: it reads the same file
        made = made_folders(data_dir.absolute())
        process = _spawn(listening, data_dir, state_dir, fallback_url, torch_url, private)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            remove_if_empty(made)
            raise IndexServerError(
                f"the local index did not start on port {port}", f"its log says why: {state_dir / 'server.log'}"
            )
        time.sleep(0.2)
    state = {
        "url": url,
        "pid": process.pid,
        "data": str(data_dir.resolve()),
        "port": port,
        "fallback_url": fallback_url,
        "torch_url": torch_url,
        "private": list(private_prefixes(private)),
    }
    (state_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    return state


def check_data_dir(data_dir: Path) -> None:
    """The index serves, to every pip install, whatever wheel lies in its folder: so the folder,
    every folder above it and each per-target folder in it (where they exist) are this user's
    or root's and writable by no one else, as every folder the tool writes (--dist, --build-dir)."""
    folders = [data_dir, *(sorted(p for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else [])]
    for folder in folders:
        found = wheel_trust.chain_problem(folder.absolute(), private=True)
        if found:
            raise OutputDirError(
                f"--data: {found}; another user could put their own wheels on the index, and every "
                "pip install would get them; refused",
                "give --data a folder only you (or root) can write, or remove the folder named",
            )


def _spawn(
    listening: socket.socket,
    data_dir: Path,
    state_dir: Path,
    fallback_url: str,
    torch_url: str,
    private: tuple[str, ...],
) -> subprocess.Popen:
    with (state_dir / "server.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "index",
                "serve",
                "--listening-fd",
                str(listening.fileno()),
                "--data",
                str(data_dir),
                "--fallback-url",
                fallback_url,
                "--torch-url",
                torch_url,
                "--state-dir",
                str(state_dir.absolute()),  # publish finds the password from the process
                *[arg for prefix in private for arg in ("--private-prefix", prefix)],
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
            pass_fds=(listening.fileno(),),
        )


def stop(state_dir: Path = STATE_DIR) -> bool:
    state = read_state(state_dir)
    (state_dir / "state.json").unlink(missing_ok=True)
    if not state:
        return False
    os.kill(state["pid"], signal.SIGTERM)
    return True
