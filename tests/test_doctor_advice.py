"""The doctor is advice (issue 13 item 2): what it says about code outside the spec's folder never
stops a build, its source checks name only what the traced forward did, and `[doctor] allow`
turns no other check off."""

from __future__ import annotations

import textwrap
from pathlib import Path

from pipeline import doctor_checks

from .conftest import REPO, one_input_spec, run_cli

CODES = {check.name: check.exit_code for check in doctor_checks.CHECKS}
SPEC = one_input_spec("advice")

# Written as library code is: options passed as Python flags, training-only code, introspection.
LIBRARY_STYLE_BLOCK = """\
import inspect
import re

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.steps = 0

    def forward(self, x, scale=None, return_dict=True, output_hidden_states=False):
        accepts = set(inspect.signature(self.lin.forward).parameters)  # resolved once, at export
        if self.training:
            self.steps += 1  # never runs: the build calls eval()
            x = x + x.sum().item()
        y = self.lin(x) if "input" in accepts else x
        if scale is not None and scale.ndim == 0:
            y = y * scale
        if output_hidden_states:
            y = y + 1
        if not return_dict:
            return (y,)
        return {"y": y}
"""


def write_model(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(body))
    spec = folder / "spec.toml"
    spec.write_text(SPEC)
    return spec


def test_flags_training_code_and_inspect_are_no_findings(tmp_path):
    """Each line of the block was an error before: `not return_dict` and `output_hidden_states`
    as data-dependent branches, inspect.signature as a graph break, the training-only write."""
    spec = write_model(
        tmp_path,
        LIBRARY_STYLE_BLOCK
        + """

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, return_dict=False)[0]


def build():
    return Model()
""",
    )
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == 0, ran.err
    assert "advice: no problems that stop compilation (0 warning(s))" in ran.err, ran.err


def test_a_branch_on_a_tensor_parameter_is_still_found(tmp_path):
    """The same block given a tensor where the flag was: now the branch reads a tensor value."""
    spec = write_model(
        tmp_path,
        LIBRARY_STYLE_BLOCK
        + """

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, return_dict=False, output_hidden_states=x.mean() > 0)[0]


def build():
    return Model()
""",
    )
    model = tmp_path / "model.py"
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == CODES["data-dependent"], ran.err
    line = next(n for n, text in enumerate(model.read_text().splitlines(), 1) if "if output_hidden_states:" in text)
    assert f"{model}:{line}: error [data-dependent] `output_hidden_states` branches on a tensor value" in ran.err
    assert "return_dict" not in ran.err and "inspect" not in ran.err and "self.steps" not in ran.err


def test_findings_outside_the_spec_folder_are_warnings(tmp_path):
    """A package beside the spec's folder (as transformers is in site-packages) with a regex call
    in forward: an error in the spec's own code, a warning in the package's; the build goes on."""
    package = tmp_path / "site" / "vendorlib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent("""\
        import re

        import torch
        from torch import nn


        class Scaled(nn.Module):
            def __init__(self, name="layer_2"):
                super().__init__()
                self.name = name

            def forward(self, x):
                return x * float(re.sub(r"\\D", "", self.name))
        """)
    )
    spec = write_model(
        tmp_path / "spec",
        """\
        import torch
        from torch import nn

        from vendorlib import Scaled


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
                self.scaled = Scaled()

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.scaled(self.lin(x))


        def build():
            return Model()
        """,
    )
    env = {"PYTHONPATH": str(tmp_path / "site")}
    ran = run_cli("doctor", "--spec", str(spec), env=env)
    assert ran.code == 0, ran.err
    library = package / "__init__.py"
    assert (
        f"{library}:13: warning [graph-break] re.sub() uses a regex in forward (code outside the spec's folder: "
        "advice only; torch.export and verification decide)" in ran.err
    ), ran.err
    assert "advice: no problems that stop compilation (1 warning(s))" in ran.err
    # The same code inside the spec's folder is the user's to fix: an error, as before.
    (tmp_path / "spec" / "vendorlib.py").write_text(library.read_text())
    own = run_cli("doctor", "--spec", str(spec))
    assert own.code == CODES["graph-break"], own.err
    assert f"{tmp_path / 'spec' / 'vendorlib.py'}:13: error [graph-break] re.sub()" in own.err


def test_allow_does_not_turn_the_dynamo_check_off(tmp_path):
    """An allowed source finding used to skip torch._dynamo.explain, which alone sees a branch on
    a value computed inside forward."""
    spec = write_model(
        tmp_path,
        """\
        import re

        import torch
        from torch import nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
                self.name = "layer_1"

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                h = self.lin(x) * float(re.sub(r"\\D", "", self.name))
                if h.mean() > 0:
                    return h
                return -h


        def build():
            return Model()
        """,
    )
    spec.write_text(SPEC + '\n[doctor]\nallow = ["graph-break"]\n')
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == CODES["data-dependent"], ran.err
    assert "warning [graph-break] re.sub()" in ran.err
    assert "error [data-dependent] torch._dynamo graph break" in ran.err, ran.err


def test_transformers_model_passes_the_doctor_without_allow():
    """A real library model (transformers' ViT, the zoo's spec: no [doctor] section) had two
    findings on plain flags; the doctor has none now."""
    ran = run_cli("doctor", "--spec", str(REPO / "tests" / "zoo" / "hf_vit" / "spec.toml"))
    assert ran.code == 0, ran.err
    assert "zoo_hf_vit: no problems that stop compilation (0 warning(s))" in ran.err, ran.err
