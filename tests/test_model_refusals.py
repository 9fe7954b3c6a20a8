"""A model the build cannot load or run as the spec says is refused with the file and line:
factory modules that cannot be imported, factories that exit, inputs that do not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ModelLoadError, SpecError
from pipeline.spec import load_spec

from .conftest import GOOD, TINY_SPEC, Ran, run_cli, spec_copy

# -- factory modules that cannot be imported, and factories that exit --------------------


def factory_fault(tmp_path: Path, source: str, factory: str = "faulty:build") -> Ran:
    spec = spec_copy(tmp_path / "spec", GOOD.replace('factory = "tiny_model:build"', f'factory = "{factory}"'))
    (spec.parent / "faulty.py").write_text(source)
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
    )


TINY_IMPORT = "from tiny_model import build as tiny_build\n"


@pytest.mark.parametrize(
    ("source", "line", "says"),
    [
        ("import torch\n\ndef build(channels=8)\n    return None\n", 3, "SyntaxError: expected ':'"),
        ("from torch import no_such_name\n", 1, "ImportError: cannot import name 'no_such_name'"),
        ("import torch\n\nWIDTH = 8 / 0\n", 3, "ZeroDivisionError: division by zero"),
        ("import sys\nsys.exit(0)\n", 2, "called sys.exit(0)"),
    ],
)
def test_factory_module_that_cannot_be_imported_names_file_and_line(tmp_path, source, line, says):
    ran = factory_fault(tmp_path, source)
    faulty = tmp_path / "spec" / "faulty.py"
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert (
        f"error: {tmp_path / 'spec' / 'spec.toml'}: key 'model.factory': importing module 'faulty' failed at "
        f"{faulty}:{line}: {says}" in ran.err
    ), ran.err
    assert "hint: fix the model's code at the line given" in ran.err
    assert "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


def test_factory_module_importing_a_missing_package_names_the_package(tmp_path):
    ran = factory_fault(tmp_path, "import torch\nimport no_such_package_xyz\n")
    faulty = tmp_path / "spec" / "faulty.py"
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert (
        "key 'model.factory': importing module 'faulty' needs the package 'no_such_package_xyz', which is not "
        "installed in this Python"
    ) in ran.err, ran.err
    assert f"(at {faulty}:2): ModuleNotFoundError: No module named 'no_such_package_xyz'" in ran.err
    assert "hint: install it where the build runs: pip install no_such_package_xyz" in ran.err
    assert "Traceback" not in ran.err


def test_missing_factory_module_still_says_it_cannot_be_found(tmp_path):
    ran = factory_fault(tmp_path, "", factory="no_such_module_xyz:build")
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "cannot import module 'no_such_module_xyz'" in ran.err and "Traceback" not in ran.err


def test_two_specs_in_one_process_each_import_the_factory_beside_them(tmp_path):
    """Two specs, each with its own tiny_model.py, loaded in one process (the library's API, a test
    run): the second got the first's module from sys.modules, and with the first's folder gone,
    failed reading its source ("No such file or directory")."""
    import shutil

    from pipeline.stages.loader import load_model

    first = spec_copy(tmp_path / "a")
    assert load_model(load_spec(first)).module.norm.num_groups == 2
    second = spec_copy(tmp_path / "b")
    code = tmp_path / "b" / "tiny_model.py"
    code.write_text(code.read_text().replace("nn.GroupNorm(2, channels)", "nn.GroupNorm(1, channels)"))
    shutil.rmtree(tmp_path / "a")
    loaded = load_model(load_spec(second))
    assert loaded.module.norm.num_groups == 1, "the second spec's own module"
    assert all(Path(path).is_relative_to(tmp_path / "b") for path in loaded.source_files), loaded.source_files
    # a module with no copy beside the spec (an installed package's) is left as it was imported
    import torch.nn as before

    from pipeline.stages import factory_import

    factory_import._forget_another_copy("torch.nn", [str(tmp_path / "b")])
    import torch.nn as after

    assert after is before


def test_the_installed_command_imports_a_factory_named_from_the_specs_package(tmp_path, monkeypatch):
    """`modelwheel doctor unet` in the checkout failed: 'cannot import module models.unet.model'.
    A spec in the package its factory's dotted name names is now found from any folder; neither
    command imports from the current directory (H45: `python -m pipeline` did, `modelwheel` not)."""
    import subprocess
    import sys

    package = tmp_path / "checkout" / "models" / "mini"
    spec = spec_copy(package, GOOD.replace('factory = "tiny_model:build"', 'factory = "models.mini.tiny_model:build"'))
    command = Path(sys.executable).parent / "modelwheel"
    ran = subprocess.run([str(command), "doctor", "--spec", str(spec)], capture_output=True, text=True, cwd="/")
    assert ran.returncode == 0 and "tiny: no problems that stop compilation" in ran.stderr, ran.stderr
    # the same spec copied out of its package, from the checkout: refused by both commands alike
    copied = spec_copy(tmp_path / "copy", spec.read_text())
    for how in ([str(command)], [sys.executable, "-m", "pipeline"]):
        ran = subprocess.run(
            [*how, "doctor", "--spec", str(copied)], capture_output=True, text=True, cwd=package.parents[1]
        )
        assert ran.returncode == ModelLoadError.exit_code, (how, ran.stderr)
        assert "cannot import module 'models.mini.tiny_model': No module named 'models'" in ran.stderr, ran.stderr
    from pipeline.stages.factory_import import import_factory

    elsewhere = GOOD.replace('factory = "tiny_model:build"', 'factory = "models.mini.x:build"')
    apart = load_spec(spec_copy(tmp_path / "apart", elsewhere))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folders it adds, gone after the test
    with pytest.raises(ModelLoadError) as refused:
        import_factory(apart, "models.mini.x:build")
    assert refused.value.hint == (
        f"put models/mini/x.py beside the spec (in {apart.path.parent}) or, for a dotted name, the spec in its "
        "package (models/unet/spec.toml names models.unet.model), or install the module into the Python that runs "
        "modelwheel"
    )


@pytest.mark.parametrize("code", ["0", "3", "None"])
def test_factory_that_exits_is_refused(tmp_path, code):
    """sys.exit(0) from the factory ended the build with exit 0 and no wheel."""
    ran = factory_fault(tmp_path, f"import sys\n{TINY_IMPORT}\ndef build(channels=8):\n    sys.exit({code})\n")
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert (
        f"faulty:build(**model.kwargs) called sys.exit({code}) at {tmp_path / 'spec' / 'faulty.py'}:5 "
        "instead of returning a module" in ran.err
    ), ran.err
    assert "hint: the factory must return the nn.Module" in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize(
    ("raised", "hint"),
    [
        (
            "RuntimeError('weights server unreachable')",
            "fix the error at the line given (the factory was called with the spec's [model.kwargs])",
        ),
        (
            "TypeError(\"build() got an unexpected keyword argument 'width'\")",
            "check model.kwargs against the factory's parameters",
        ),
    ],
)
def test_a_factory_that_raises_gets_a_hint_for_its_kind_of_error(tmp_path, raised, hint):
    """The hint used to send every error to model.kwargs, even one the factory raised on its own."""
    ran = factory_fault(tmp_path, f"def build(channels=8):\n    raise {raised}\n")
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert f"faulty:build(**model.kwargs) raised {raised.split('(')[0]}: " in ran.err, ran.err
    assert f"(at {tmp_path / 'spec' / 'faulty.py'}:2)" in ran.err
    assert f"hint: {hint}" in ran.err and "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


# -- inputs that do not fit the model ----------------------------------------------------

T_INPUT = '[[inputs]]\nname = "t"\nshape = ["batch"]\nlow = 0\nhigh = 1000\n'
FORWARD_LINE = "def forward(self, x: torch.Tensor, t: torch.Tensor):"


def tiny_line(text: str) -> int:
    source = (TINY_SPEC.parent / "tiny_model.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


def build_spec_text(tmp_path: Path, text: str) -> tuple[Ran, Path]:
    spec = spec_copy(tmp_path / "spec", text)
    ran = run_cli(
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
    )
    return ran, spec


def assert_refused_before_tracing(ran: Ran, tmp_path: Path) -> None:
    assert ran.code == SpecError.exit_code, ran.err
    assert "Traceback" not in ran.err and "torch._dynamo" not in ran.err, ran.err
    assert len(ran.err.splitlines()) <= 10, ran.err  # one paragraph, not a trace
    assert "==> export" not in ran.err and "\nhint: " in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize(
    ("text", "declared", "names"),
    [
        (GOOD.replace(T_INPUT, ""), "1 input(s) declared (x)", "takes 2 (x, t)"),
        (
            GOOD + '\n[[inputs]]\nname = "extra"\nshape = ["batch"]\n',
            "3 input(s) declared (x, t, extra)",
            "takes 2 (x, t)",
        ),
    ],
)
def test_input_count_is_compared_with_forwards_signature_first(tmp_path, text, declared, names):
    """One input fewer than forward takes gave a 53-line TypeError traceback and exit 1."""
    ran, spec = build_spec_text(tmp_path, text)
    assert_refused_before_tracing(ran, tmp_path)
    forward = f"{tmp_path / 'spec' / 'tiny_model.py'}:{tiny_line(FORWARD_LINE)}"
    assert f"error: {spec}: key 'inputs': {declared}, but forward at {forward} {names}" in ran.err, ran.err
    assert "hint: declare one [[inputs]] table per forward parameter" in ran.err


def test_a_shape_the_model_rejects_is_a_spec_error_naming_input_line_and_message(tmp_path):
    """3 channels declared as 5 gave 221 lines of dynamo trace and exit 1."""
    ran, spec = build_spec_text(tmp_path, GOOD.replace('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 5, 8, 8]'))
    assert_refused_before_tracing(ran, tmp_path)
    model = tmp_path / "spec" / "tiny_model.py"
    line = tiny_line("self.norm(self.conv(x))")
    assert (
        f"error: {spec}: key 'inputs': the model does not accept the spec's example inputs "
        "('x' float32[batch=2, 5, 8, 8], 't' float32[batch=2])" in ran.err
    ), ran.err
    assert f"  {model}:{line}: h = nn.functional.silu(self.norm(self.conv(x)))" in ran.err
    assert (
        "RuntimeError: Given groups=1, weight of size [8, 3, 3, 3], expected input[2, 5, 8, 8] to have 3 channels, "
        "but got 5 channels instead" in ran.err
    )
    assert (
        "hint: make the [[inputs]] shapes and dtypes (and [dims] sizes, and low/high of integer inputs) match what "
        f"the model expects at {model}:{line}"
    ) in ran.err


def test_inputs_that_do_not_fit_are_reported_by_doctor_too(tmp_path):
    spec = spec_copy(tmp_path, GOOD.replace('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 8]'))
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'inputs': the model does not accept the spec's example inputs ('x' float32[batch=2, 3, 8]" in ran.err
    assert "Traceback" not in ran.err


def test_keyword_only_parameters_count_as_inputs(tmp_path):
    import torch

    from pipeline.stages.export import check_inputs_fit
    from pipeline.stages.loader import load_model

    # A module name of its own: tiny_model may already be imported by this process.
    spec_path = spec_copy(tmp_path, GOOD.replace(T_INPUT, "").replace("tiny_model:build", "kwonly_model:build"))
    (tmp_path / "kwonly_model.py").write_text(
        (tmp_path / "tiny_model.py")
        .read_text()
        .replace(
            "def forward(self, x: torch.Tensor, t: torch.Tensor):",
            "def forward(self, x: torch.Tensor, *, t: torch.Tensor):",
        )
    )
    spec_file = load_spec(spec_path)
    loaded = load_model(spec_file)
    with pytest.raises(SpecError, match=r"1 input\(s\) declared \(x\), but forward at .* takes 2 \(x, t\)"):
        check_inputs_fit(spec_file, loaded.module, (torch.zeros(2, 3, 8, 8),), loaded.source_files)
