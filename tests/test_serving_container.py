"""docs/serving/Dockerfile built and run for real (slow): podman (which builds with buildah's own
code) builds it as docs/serving.md says, against a local index holding the tiny wheel, with its
`RUN model-tiny verify` step; the image then runs as the Dockerfile's header says (`--read-only
--tmpfs /tmp`, the CMD's uvicorn) and answers /health and /predict as eager PyTorch does, as uid
10001.

No Docker daemon is needed: podman runs as root on storage of its own (vfs, in tmp_path), the build
in `--isolation chroot` on the host's network, so it reaches the index on 127.0.0.1. The base image
is python:3.12-slim where podman can pull it; elsewhere a stand-in made here: `debootstrap
bookworm` (Python 3.11) with a virtualenv on PATH, so `pip` works as in python:3.12-slim. torch
comes from PyTorch's CPU index where this machine reaches it; elsewhere from a local copy of that
index holding the pinned torch wheel that this machine's pip finds for the image's Python. Skipped,
with the reason, where podman is missing or cannot run a container here (CI has no podman).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import REPO, run_cli
from .test_serving import assert_matches_eager, client, free_port, requests_of

# Checked before any fixture runs (the tiny wheel's build among them).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed (apt-get install podman runc): the Dockerfile is not built",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="building the Dockerfile with podman is tested as root only"),
]

SERVING = REPO / "docs" / "serving"
PYTHON_SLIM = "docker.io/library/python:3.12-slim"  # the Dockerfile's default BASE
STANDIN = "localhost/modelwheel-test-base:bookworm"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # the Dockerfile's default TORCH_INDEX_URL
IMAGE = "localhost/modelwheel-test-serve:tiny"
# Tried in turn until one runs a container: podman's defaults, then runc (crun refuses cgroups in
# hybrid mode) with limits a root without CAP_SYS_RESOURCE may set (podman's defaults exceed them).
RUN_FLAGS = (
    [],
    ["--runtime", "runc"],
    ["--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"],
)


def sh(*cmd: str, timeout: float = 600, merged: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``cmd``'s result; ``merged``: its stderr in its stdout, in the order written."""
    err = subprocess.STDOUT if merged else subprocess.PIPE
    try:
        return subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(list(cmd), 124, "", f"timed out after {timeout}s: {exc}")


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> Iterator[list[str]]:
    """podman on storage of its own, removed afterwards, whatever happened."""
    home = tmp_path_factory.mktemp("podman")
    command = ["podman", "--root", str(home / "storage"), "--runroot", str(home / "run"), "--storage-driver", "vfs"]
    try:
        yield command
    finally:
        sh(*command, "rm", "--all", "--force", timeout=120)
        sh(*command, "rmi", "--all", "--force", timeout=120)
        shutil.rmtree(home, ignore_errors=True)  # gigabytes: vfs copies every layer


def standin_base(podman: list[str], work: Path) -> str:
    """Debian bookworm's own Python in a virtualenv on PATH, imported as an image; python:3.12-slim
    is Debian too. The host's added CA certificates come along, so the image's pip trusts what the
    host's does (a proxy's)."""
    if shutil.which("debootstrap") is None:
        pytest.skip(f"cannot pull {PYTHON_SLIM} and no debootstrap (apt-get install debootstrap) for a stand-in")
    rootfs = work / "rootfs"
    made = sh(
        "debootstrap",
        "--variant=minbase",
        "--include=python3,python3-venv,ca-certificates",
        "bookworm",
        str(rootfs),
        "http://deb.debian.org/debian",
        timeout=900,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot pull {PYTHON_SLIM}, and debootstrap failed: {last_line(made)}")
    for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(cert, rootfs / "usr" / "local" / "share" / "ca-certificates")
    path = "/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    for step in (
        ["update-ca-certificates"],
        ["python3", "-m", "venv", "/opt/python"],
        ["/opt/python/bin/pip", "install", "--quiet", "--no-cache-dir", "--upgrade", "pip"],
    ):
        done = sh("chroot", str(rootfs), "/usr/bin/env", "-i", f"PATH={path}", "LANG=C.UTF-8", *step)
        assert done.returncode == 0, f"stand-in base: {' '.join(step)}: {done.stdout}{done.stderr}"
    sh("tar", "-C", str(rootfs), "-cf", str(work / "rootfs.tar"), ".", check=True)
    shutil.rmtree(rootfs)
    done = sh(
        *podman,
        "import",
        "--change",
        f"ENV PATH={path}",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        'CMD ["python3"]',
        str(work / "rootfs.tar"),
        STANDIN,
    )
    assert done.returncode == 0, done.stderr
    (work / "rootfs.tar").unlink()
    return STANDIN


@pytest.fixture(scope="module")
def base(podman, tmp_path_factory) -> tuple[str, list[str], str]:
    """(base image, the flags `podman run` needs here, the image's Python as 3.N)."""
    pulled = sh(*podman, "pull", "--quiet", PYTHON_SLIM, timeout=600)
    image = PYTHON_SLIM if pulled.returncode == 0 else standin_base(podman, tmp_path_factory.mktemp("base"))
    tried = []
    for flags in RUN_FLAGS:
        done = sh(
            *podman,
            "run",
            "--rm",
            *flags,
            "-p",
            f"127.0.0.1:{free_port()}:9",
            image,
            "python",
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
            timeout=300,
        )
        if done.returncode == 0:
            return image, flags, done.stdout.strip()
        tried.append(f"[{' '.join(flags) or 'defaults'}] {last_line(done)}")
    pytest.skip("podman cannot run a container here: " + "; ".join(tried))


@contextlib.contextmanager
def torch_index(wheel: Path, python: str, work: Path) -> Iterator[str]:
    """PyTorch's CPU index where it answers; elsewhere a local one (PEP 503: a folder per project,
    served by http.server) holding the torch wheel the tiny wheel pins, for the image's Python."""
    try:
        if httpx.head(f"{TORCH_INDEX}/torch/", timeout=10, follow_redirects=True).status_code == 200:
            yield TORCH_INDEX
            return
    except httpx.HTTPError:
        pass
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    pin = re.search(r"^Requires-Dist: (torch==\S+)$", metadata, re.M).group(1)
    got = sh(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "--dest",
        str(work / "torch"),
        pin,
    )
    if got.returncode != 0:
        pytest.skip(
            f"{TORCH_INDEX} does not answer, and this machine's pip has no {pin} for Python {python}: {last_line(got)}"
        )
    port = free_port()
    served = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(work)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/torch/", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "http.server did not answer"
            time.sleep(0.2)
        yield url
    finally:
        served.terminate()
        served.wait(timeout=30)


@contextlib.contextmanager
def index_with(wheel: Path, torch_url: str, home: Path) -> Iterator[str]:
    """The local index (`make index`) with the tiny wheel published to it; torch redirected to ``torch_url``."""
    home.mkdir(parents=True, exist_ok=True)
    started = run_cli(
        "index", "start", "--port", "0", "--data", str(home / "data"), "--torch-url", torch_url + "/", cwd=home
    )
    assert started.code == 0, started.err
    try:
        published = run_cli("publish", "--wheel", str(wheel), cwd=home)
        assert published.code == 0, published.err
        yield json.loads((home / "build" / "index" / "state.json").read_text())["url"] + "cpu/simple"
    finally:
        run_cli("index", "stop", cwd=home)


@contextlib.contextmanager
def running(podman: list[str], flags: list[str], port: int) -> Iterator[str]:
    """The image as the Dockerfile's header runs it, until /health answers; removed afterwards."""
    name = f"modelwheel-test-serve-{port}"
    started = sh(
        *podman,
        "run",
        "--detach",
        "--name",
        name,
        *flags,
        "--read-only",
        "--tmpfs",
        "/tmp",
        "-p",
        f"127.0.0.1:{port}:8000",
        IMAGE,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            state = sh(*podman, "inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            logs = lambda: sh(*podman, "logs", name).stderr[-3000:]  # noqa: E731
            assert state == "true", f"the container exited:\n{logs()}"
            assert time.monotonic() < deadline, f"no answer on /health in 120 s:\n{logs()}"
            time.sleep(0.5)
        yield name
    finally:
        sh(*podman, "rm", "--force", "--time", "10", name, timeout=120)


def test_the_dockerfile_builds_verifies_and_serves_as_uid_10001_on_a_read_only_root(podman, base, wheel, tmp_path):
    image, flags, python = base
    with (
        torch_index(wheel, python, tmp_path / "torch-index") as torch_url,
        index_with(wheel, torch_url, tmp_path / "index") as index_url,
    ):
        built = sh(
            *podman,
            "build",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--layers=false",
            "--build-arg",
            f"BASE={image}",
            "--build-arg",
            f"INDEX_URL={index_url}",
            "--build-arg",
            f"TORCH_INDEX_URL={torch_url}",
            "--build-arg",
            "MODEL=tiny",
            "--build-arg",
            "VERSION=0.1",
            "-t",
            IMAGE,
            str(SERVING),
            timeout=1800,
            merged=True,
        )
    log = built.stdout
    assert built.returncode == 0, log[-5000:]
    # the build-time health check ran, as uid 10001, and passed
    verified = re.search(
        r"STEP \d+/\d+: RUN model-\$\{MODEL\} verify\n(ok  case .*\n)+model-tiny 0\.1\+cpu\.torch\S+: "
        r"\d+ golden cases match",
        log,
    )
    assert verified, log[-3000:]
    print(f"built on {image} ({python}), podman run {' '.join(flags)}, torch from {torch_url}:\n{verified.group(0)}")
    assert "SYS_UID_MAX" not in log, "useradd warned of a system user's uid above the system range"

    port = free_port()
    with running(podman, flags, port) as name:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health", timeout=10).json()["model"] == "model_tiny"
        requests = requests_of(16, seed=31)
        answers = asyncio.run(client.load_test(f"{url}/predict", requests, 4, 120, keep_alive=False))
        assert_matches_eager(requests, answers, wheel)
        bad = asyncio.run(
            client.load_test(f"{url}/predict", [{"x": requests[0]["x"][:, :2], "t": requests[0]["t"]}], 1)
        )
        assert (bad[0].status, bad[0].detail) == (422, "input 'x': dim 1 must be 3, got 2")

        # every process of the container (uvicorn, its 2 workers) is uid 10001 on the host too
        top = sh(*podman, "top", name, "huser", "user", "args").stdout.strip().splitlines()[1:]
        assert len(top) >= 3 and all(row.split()[:2] == ["10001", "serve"] for row in top), top
        print("podman top (host uid, user, command):", *top, sep="\n  ")
        assert sh(*podman, "exec", name, "id", "-u").stdout.strip() == "10001"
        written = sh(*podman, "exec", name, "touch", "/srv/probe")
        assert written.returncode != 0 and "Read-only file system" in written.stderr, written
        # the integrity stamp, the one thing the wheel writes, went to the tmpfs
        stamps = sh(*podman, "exec", name, "find", "/tmp/cache", "-type", "f")
        assert stamps.returncode == 0 and stamps.stdout.strip(), stamps
