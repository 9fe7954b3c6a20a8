"""A spec is code: its factory is called by the build, so it must be the model's own Python
function or nn.Module class. A factory from the standard library (`os:system`, or one imported
into another module) or a builtin is refused before anything of it is called."""

from __future__ import annotations

import shutil

import pytest

from pipeline.errors import ModelLoadError

from .conftest import TINY_SPEC, run_cli


def spec_with_factory(tmp_path, factory: str, kwargs: str = "{}"):
    folder = tmp_path / "spec"
    shutil.copytree(TINY_SPEC.parent, folder)
    spec = folder / "spec.toml"
    spec.write_text(
        spec.read_text()
        .replace('factory = "tiny_model:build"', f'factory = "{factory}"')
        .replace("kwargs = { channels = 8 }", f"kwargs = {kwargs}")
    )
    return spec


def build(tmp_path, spec):
    return run_cli(
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        cwd=tmp_path,
    )


def test_a_standard_library_factory_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    spec = spec_with_factory(tmp_path, "os:system", f'{{ command = "touch {marker}" }}')
    ran = build(tmp_path, spec)
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "'os:system' is from Python's standard library, not a model" in ran.err
    assert "a spec is code: build only specs you trust" in ran.err
    assert not marker.exists(), "the command ran"


def test_a_standard_library_function_imported_into_another_module_is_refused_before_it_runs(tmp_path):
    """Named through a module that imported it (as packages do: `from subprocess import check_output`)."""
    marker = tmp_path / "ran"
    spec = spec_with_factory(tmp_path, "evil:getoutput", f'{{ cmd = "touch {marker}" }}')
    (spec.parent / "evil.py").write_text("from subprocess import getoutput\n")
    ran = build(tmp_path, spec)
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "evil:getoutput is subprocess.getoutput from Python's standard library, not a model" in ran.err
    assert not marker.exists(), "the command ran"


@pytest.mark.parametrize(
    ("code", "factory", "kind"),
    [
        ("from builtins import exec as build\n", "evil:build", "builtin_function_or_method"),
        (
            "import functools, tiny_model\nbuild = functools.partial(tiny_model.build, channels=8)\n",
            "evil:build",
            "partial",
        ),
        (
            "class Build:\n    def __call__(self, **kwargs):\n        raise SystemExit('called')\nbuild = Build()\n",
            "evil:build",
            "Build",
        ),
    ],
)
def test_a_factory_that_is_not_a_function_or_module_class_is_refused(tmp_path, code, factory, kind):
    spec = spec_with_factory(tmp_path, factory)
    (spec.parent / "evil.py").write_text(code)
    ran = build(tmp_path, spec)
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert f"evil:build is a {kind}, not a Python function or nn.Module class" in ran.err
