"""What `make` shows a newcomer: what it installs, not its shell plumbing, and no setuptools
warning about the editable install of modelwheel itself."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

MAKEFILE = (REPO / "Makefile").read_text()


def echoed_recipe_lines(text: str) -> list[str]:
    """Each recipe line make prints before running it: a tab-led line (with its backslash
    continuations) that does not start with @."""
    lines, logical, pending = text.splitlines(), [], ""
    for line in lines:
        if pending or line.startswith("\t"):
            pending += line.strip() + " "
            if not line.endswith("\\"):
                logical.append(pending.strip())
                pending = ""
    return [line for line in logical if not line.startswith(("@", "-@"))]


def test_make_echoes_no_shell_plumbing():
    """`make build` on a fresh clone printed `… 2>/dev/null || \\` while setting up .venv."""
    noisy = [line for line in echoed_recipe_lines(MAKEFILE) if "2>/dev/null" in line or "||" in line]
    assert noisy == []
    setup = MAKEFILE.split("$(VENV)/.installed: requirements.txt pyproject.toml\n")[1].split("\n\n")[0]
    assert all(line.startswith("\t@") or line.startswith("\t  ") for line in setup.splitlines()), setup
    assert '@echo "==> setting up $(VENV)' in setup


def editable_build(source: Path, out: Path, env_assignment: str | None) -> str:
    """setuptools' editable build of modelwheel, as `pip install -e .` runs it; its stderr."""
    env = {"PATH": "/usr/bin:/bin"}
    if env_assignment:
        name, value = env_assignment.split("=", 1)
        env[name] = value.strip('"')
    ran = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_editable({str(out)!r})"],
        capture_output=True,
        text=True,
        cwd=source,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stderr


def test_the_editable_install_of_modelwheel_shows_no_setuptools_warning(tmp_path):
    quiet = re.search(r"^EDITABLE_QUIET := (\w+=.+)$", MAKEFILE, re.M)
    assert quiet, "the Makefile sets what silences the editable install's warning"
    assert re.search(r"^\t@\$\(EDITABLE_QUIET\) \$\(PY\) -m pip install .*-e \.$", MAKEFILE, re.M)
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for folder in ("pipeline", "templates"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert "Editable installation" in editable_build(source, tmp_path / "loud", None)  # what it silences
    assert "Editable installation" not in editable_build(source, tmp_path / "quiet", quiet.group(1))


def test_an_unreachable_torch_index_ends_with_what_to_do(tmp_path):
    """A fresh clone with pip's own settings off, where PyTorch's index cannot be reached: pip's
    'No matching distribution found for torch==…+cpu' was the last line, with nothing to act on."""
    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    nowhere = (tmp_path / "no-index").as_uri()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": nowhere,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    ran = subprocess.run(
        [
            "make",
            "--no-print-directory",
            ".venv/.installed",
            f"PYTHON={sys.executable}",
            f"TORCH_INDEX={nowhere}/torch",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    torch_pin = re.search(r"^torch==(.+)$", (REPO / "requirements.txt").read_text(), re.M).group(1) + "+cpu"
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"error: torch {torch_pin} could not be installed from {nowhere}/torch (pip's reason is above)" in ran.stdout
    hint = next(line for line in ran.stdout.splitlines() if line.startswith("hint: "))
    assert "TORCH_INDEX=URL" in hint and "PIP_FIND_LINKS=DIR" in hint
    assert f"pip download torch=={torch_pin} --no-deps" in hint
    assert "requirements.txt" not in ran.stdout.split("error: ")[0].split("(no local copy")[1]  # it stopped there
    assert not (tmp_path / ".venv" / ".installed").exists()


def beat(command: str) -> subprocess.CompletedProcess:
    """The Makefile's `beat` (what the .venv setup runs its long pip steps with), one tick a second."""
    rule = f'beat-check: ; @$(BEAT); beat "waiting" {command}'
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", rule, "beat-check", "BEAT_S=1"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def test_a_long_setup_step_prints_a_line_while_it_runs():
    """Setting up .venv printed nothing for 22 s (torch) and then 87 s (requirements.txt): pip --quiet."""
    ran = beat("sleep 2.5")
    assert ran.returncode == 0, ran.stderr
    ticks = ran.stdout.splitlines()
    assert ticks and ticks == [f"    ... waiting: {n}s" for n in range(1, len(ticks) + 1)], ran.stdout
    failed = beat('sh -c "sleep 1.5; exit 3"')
    assert failed.returncode == 2 and "Error 3" in failed.stderr  # the command's status, as make reports it


def test_each_long_setup_step_says_how_long_and_runs_with_a_beat():
    setup = MAKEFILE.split("$(VENV)/.installed: requirements.txt pyproject.toml\n")[1].split("\n\n")[0]
    lines = setup.splitlines()
    long_steps = [i for i, line in enumerate(lines) if "pip install" in line and "-e ." not in line]
    assert len(long_steps) == 3, setup  # torch from a local copy, else from PyTorch's index; requirements.txt
    for i in long_steps:
        assert re.search(r"\bbeat \"[^\"]+\" \$\(PY\) -m pip install", lines[i]), lines[i]
        said = next(line for line in reversed(lines[:i]) if "echo" in line)
        assert re.search(r"\(.*about \d+ (to \d+ )?(s|minutes?)\b", said), said


def test_make_build_echoes_its_command_with_single_spaces():
    """`make build` echoed `--spec models/unet/spec.toml  ` (an empty TARGET_ARGS and ARGS)."""
    for extra, tail in (
        ([], ""),
        (["TARGET=cpu"], " --target cpu"),
        (["ARGS=--root /tmp/r"], " --root /tmp/r"),
        (["TARGET=cpu cuda", "ARGS=--overwrite"], " --target cpu --target cuda --overwrite"),
    ):
        ran = subprocess.run(
            ["make", "-n", "--no-print-directory", "build", "SETUP=", "PY=python", "MODEL=unet", *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == f"python -m pipeline build --spec models/unet/spec.toml{tail}\n", (extra, ran.stdout)
    for extra, tail in (([], ""), (["ARGS=--index http://127.0.0.1:8765/"], " --index http://127.0.0.1:8765/")):
        ran = subprocess.run(  # make publish: the same, and no space left at the end of the line
            ["make", "-n", "--no-print-directory", "publish", "SETUP=", "PY=python", "MODEL=unet", *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert ran.stdout == f"python -m pipeline publish --spec models/unet/spec.toml{tail}\n", (extra, ran.stdout)
