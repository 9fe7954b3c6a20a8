"""The build matrix CI fans out over: every model spec under models/ times its targets."""

from __future__ import annotations

from pathlib import Path

from .spec import load_spec

# The runner label each target needs (GitHub Actions `runs-on`); CUDA needs a GPU runner.
RUNNERS = {"cpu": "ubuntu-latest", "cuda": ["self-hosted", "linux", "gpu"]}


def build_matrix(models_dir: Path) -> dict:
    include = []
    for spec_path in sorted(models_dir.glob("*/spec.toml")):
        spec = load_spec(spec_path).spec
        for target in spec.build.targets:
            include.append({
                "model": spec.model.name,
                "version": spec.model.version,
                "spec": spec_path.as_posix(),
                "target": target,
                "runner": RUNNERS[target],
            })
    return {"include": include}
