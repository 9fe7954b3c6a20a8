"""A built wheel installs on a stock machine with only the commands the docs give.

"Stock" means this machine's pip settings switched off (no local mirror, no find-links), and
the two indexes a user reaches stood in for by local ones: PyTorch's CPU index, which holds the
pinned torch (`torch==<version>+cpu`), and PyPI, which holds the rest. The commands are the
generated wheel README's (`--extra-index-url <PyTorch's CPU index>`) and the local index's
(`--index-url <index>/cpu/simple` alone: it sends pip to PyTorch's index for torch).
"""

from __future__ import annotations

import email
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import make_venv, run_cli

STOCK_PIP = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
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
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(downloads),
                              f"torch=={importlib.metadata.version('torch')}", "filelock", "safetensors", "numpy"],
                             capture_output=True, text=True)
    if fetched.returncode != 0:
        pytest.skip(f"cannot download the wheels the stand-in indexes hold: {fetched.stderr.strip()[-300:]}")
    torch_files = sorted(downloads.glob("torch-*.whl"))
    rest = sorted(set(downloads.iterdir()) - set(torch_files))
    homes = [base / name for name in ("pytorch", "pypi", "models")]
    pytorch = start_index(homes[0], torch_files, "--fallback-url", "")
    pypi = start_index(homes[1], rest + [wheel], "--fallback-url", "")
    models = start_index(homes[2], [wheel], "--fallback-url", pypi + "cpu/simple/",
                         "--torch-url", pytorch + "{variant}/simple/")
    yield pytorch + "cpu/simple", pypi + "cpu/simple", models + "cpu/simple"
    for home in homes:
        run_cli("index", "stop", cwd=home)


def readme_install_line(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        description = email.message_from_bytes(archive.read(metadata)).get_payload()
    return next(line.strip() for line in description.splitlines() if line.strip().startswith("pip install "))


def install_and_run(tmp_path: Path, command: str) -> str:
    python = make_venv(tmp_path / "env")
    pip = subprocess.run([str(python), "-m", *command.split()[0:], "--quiet"], capture_output=True, text=True,
                         env=STOCK_PIP, cwd="/", timeout=600)
    assert pip.returncode == 0, f"{command}\n{pip.stdout}{pip.stderr}"
    ran = subprocess.run([str(python), "-c", "import model_tiny as m; print(m.load()(*m.example_inputs())[1].shape)"],
                         capture_output=True, text=True, cwd="/", env=STOCK_PIP)
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
    lines = [(page.name, line) for page in pages
             for line in re.sub(r"\\\n\s*", "", page.read_text()).splitlines()
             if re.search(r"pip install [\"']?(\S*/)?model[-_]", line) and (line.lstrip().startswith("pip ") or "--index-url" in line)]
    assert lines, "the docs show how to install a model wheel"
    for page, line in lines:
        assert "download.pytorch.org/whl/" in line or "127.0.0.1:8765" in line, (page, line)
