"""The import contract (.importlinter, issue 47): each layer of pipeline/ imports only the layers
below it, and no package's modules import one another in a circle. lint-imports reads the
imports as written, those inside functions too; its report is printed (pytest -s shows it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300)


def test_the_imports_run_only_downward_and_in_no_circle():
    ran = lint_imports(REPO)
    print(ran.stdout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Contracts: 2 kept, 0 broken." in ran.stdout


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    shutil.copytree(
        REPO / "pipeline", tmp_path / "pipeline", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def add_import(module: Path, line: str) -> None:
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    module.write_text(text.replace(marker, f"{marker}\n{line}\n", 1))


def test_an_upward_import_breaks_the_contract_naming_it(tmp_path):
    root = copy_of_the_package(tmp_path)
    add_import(root / "pipeline" / "services" / "proc.py", "from ..stages import compile  # noqa: F401")
    ran = lint_imports(root)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "pipeline.services is not allowed to import pipeline.stages" in ran.stdout, ran.stdout
    assert "pipeline.services.proc -> pipeline.stages.compile" in ran.stdout, ran.stdout


def test_a_circle_inside_one_layer_breaks_the_contract(tmp_path):
    """stages/verify.py imports stages/export.py; export importing verify back closes a circle,
    which no layer order forbids: the second contract does."""
    root = copy_of_the_package(tmp_path)
    add_import(root / "pipeline" / "stages" / "export.py", "from . import verify  # noqa: F401")
    ran = lint_imports(root)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "No cycles are allowed in pipeline.stages" in ran.stdout, ran.stdout


def test_the_wheels_runtime_imports_nothing_of_the_build():
    """Below every layer (lint-imports does not see it: pipeline/wheel_template is a link): each
    wheel ships the runtime alone, so its modules import one another, relatively, and no pipeline."""
    import ast

    runtime = REPO / "templates" / "wheel" / "runtime"
    found = []
    for path in sorted(runtime.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            )
            found += [f"{path.name}:{node.lineno} imports {name}" for name in names if name.split(".")[0] == "pipeline"]
    assert len(list(runtime.glob("*.py"))) > 20
    assert found == []
