"""`make release-local` (tools/release-local.sh): release.yml run for real under act, on this
machine, from a copy of the checkout with the tiny model, then installed from the index it
published to. It needs local copies of the actions the workflow uses (act cannot fetch them
offline): give their folder in MODELWHEEL_ACT_ACTIONS (docs/publishing.md, "Try the release
before you tag it"); without it the test is skipped. It takes minutes: `make test-slow`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import checkout_copy, run_cli

ACTIONS = os.environ.get("MODELWHEEL_ACT_ACTIONS", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ACTIONS, reason="MODELWHEEL_ACT_ACTIONS (the folder of action copies) not given"),
]


def release_local(workspace: Path) -> tuple[subprocess.CompletedProcess, str]:
    ran = subprocess.run(
        ["tools/release-local.sh", ACTIONS],
        cwd=workspace,
        capture_output=True,
        text=True,
        env={**os.environ, "PY": sys.executable},
        timeout=3600,
    )
    return ran, "\n".join((ran.stdout + ran.stderr).splitlines()[-40:])


def test_a_release_run_twice_publishes_once_beside_the_checkouts_own_index(tmp_path, wheel):
    """The checkout's own index (`make index`, then `make publish`) already holds a native build
    of the same version: the release (avx2) publishes to an index of its own. Run again, it
    rebuilds the same bytes, so its publish job passes over them and succeeds (issue 45)."""
    workspace = checkout_copy(tmp_path / "repo")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=workspace, check=True)  # a fresh clone, as a user has
    subprocess.run(["git", "add", "-A"], cwd=workspace, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"], cwd=workspace, check=True
    )
    started = run_cli("index", "start", "--port", "0", cwd=workspace)
    assert started.code == 0, started.err
    try:
        url = json.loads((workspace / "build" / "index" / "state.json").read_text())["url"]
        earlier = run_cli("publish", "--wheel", str(wheel), cwd=workspace)  # to the checkout's index
        assert earlier.code == 0 and url, earlier.err
        ran, tail = release_local(workspace)
        assert ran.returncode == 0, tail
        published = sorted((workspace / "build" / "release-local" / "index" / "data" / "cpu").glob("*.whl"))
        first = published[0].read_bytes() if published else b""
        again, again_tail = release_local(workspace)
    finally:
        run_cli("index", "stop", cwd=workspace)
    assert "model-tiny 0.1+cpu.torch" in ran.stdout and "from the index runs:" in ran.stdout, tail
    assert f"{wheel.name}: uploaded to the cpu index" in ran.stdout, tail
    assert [w.name for w in published] == [wheel.name], "the same file name: without an index of its own, a collision"
    assert first != wheel.read_bytes()  # the release's avx2 build, not the earlier one
    assert [w.name for w in (workspace / "build" / "index" / "data" / "cpu").glob("*.whl")] == [wheel.name]
    assert (workspace / "build" / "index" / "data" / "cpu" / wheel.name).read_bytes() == wheel.read_bytes()
    state = workspace / "build" / "release-local" / "index" / "build" / "index" / "state.json"
    assert not state.exists(), "the run's index is stopped when it ends"

    assert again.returncode == 0, again_tail
    assert f"{wheel.name}: already on the index (cpu), the same file, left as it is" in again.stdout, again_tail
    assert f"{wheel.name}: uploaded to the cpu index" not in again.stdout, again_tail
    assert "from the index runs:" in again.stdout, again_tail
    assert published[0].read_bytes() == first, "the published file is left as it is"
