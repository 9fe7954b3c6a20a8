"""The build matrix CI fans out over: every model spec times its targets, one job each.

Reads specs only (pydantic, no torch): the release workflow's first job runs it with nothing else
installed. Each target says what its job needs (targets/*.py: runner, container, torch variant).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .. import targets
from ..errors import UsageError
from ..spec import load_spec


def spec_paths(models_dir: Path) -> list[Path]:
    """Every ``<model>/spec.toml`` under ``models_dir``."""
    return sorted(models_dir.glob("*/spec.toml"))


def refuse_outside_act(environ: dict[str, str]) -> None:
    """The workflow's ``no_containers`` input exists on GitHub too. Ticked there, the jobs would build
    on the runner's own glibc and publish a wheel tagged narrower than the manylinux_2_28 one,
    under the same version, which pip on newer hosts would then prefer: only act's local run may."""
    if environ.get("GITHUB_ACTIONS") == "true" and not environ.get("ACT"):
        raise UsageError(
            "--no-containers (the release's no_containers input) is for a local run under act: on GitHub's runners "
            "it would build on the runner's own glibc and publish wheels tagged narrower than the manylinux_2_28 ones, "
            "under the same version",
            "run the release on GitHub without no_containers; `make release-local` is the run that uses it",
        )


def build_matrix(
    spec_files: list[Path], *, containers: bool = True, note: Callable[[str], None] = lambda _: None
) -> dict:
    """``containers=False``: every job on its runner itself (a local run under act, with no Docker),
    so a target this machine cannot build (cuda without a GPU) is left out, and ``note`` says why."""
    if not containers:
        refuse_outside_act(dict(os.environ))
    include = []
    for spec_path in spec_files:
        spec = load_spec(spec_path).spec
        for name in spec.build.targets:
            target = targets.get(name)
            # What the target's runner must have, asked without torch (the matrix job has none);
            # a target from outside this repository may not say, and is kept.
            missing = getattr(target, "runner_missing", lambda: None)() if not containers else None
            if missing:
                note(
                    f"matrix: build {spec.model.name} ({name}) is left out of this local run: {missing}; on GitHub "
                    f"it runs on its own runner ({_label(target.RUNNER)}: docs/publishing.md)"
                )
                continue
            include.append(
                {
                    "model": spec.model.name,
                    "version": spec.model.version,
                    "spec": spec_path.as_posix(),
                    "target": name,
                    "runner": target.RUNNER,
                    "container": target.CONTAINER if containers else "",
                    "container_options": target.CONTAINER_OPTIONS if containers else "",
                    "torch_variant": target.TORCH_VARIANT,
                }
            )
    return {"include": include}


def _label(runner: str | list[str]) -> str:
    return runner if isinstance(runner, str) else ", ".join(runner)
