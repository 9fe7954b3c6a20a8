"""The build matrix CI fans out over: every model spec times its targets, one job each.

Reads specs only (pydantic, no torch): the release workflow's first job runs it with nothing else
installed. Each target says what its job needs (targets/*.py: runner, container, torch variant).
"""

from __future__ import annotations

from pathlib import Path

from .. import targets
from ..spec import load_spec


def spec_paths(models_dir: Path) -> list[Path]:
    """Every ``<model>/spec.toml`` under ``models_dir``."""
    return sorted(models_dir.glob("*/spec.toml"))


def build_matrix(spec_files: list[Path], *, containers: bool = True) -> dict:
    """``containers=False``: every job on its runner itself (a local run under act, with no Docker)."""
    include = []
    for spec_path in spec_files:
        spec = load_spec(spec_path).spec
        for name in spec.build.targets:
            target = targets.get(name)
            include.append({
                "model": spec.model.name,
                "version": spec.model.version,
                "spec": spec_path.as_posix(),
                "target": name,
                "runner": target.RUNNER,
                "container": target.CONTAINER if containers else "",
                "container_options": target.CONTAINER_OPTIONS if containers else "",
                "torch_variant": target.TORCH_VARIANT,
            })
    return {"include": include}
