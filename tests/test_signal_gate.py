"""The verification gate refuses outputs that carry no signal (issue 44): an output the same for
every seeded input, an input that changes no output. Each build here stops before export, in
seconds; the allowances are checked on the prepared model, without a compile."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from pipeline import targets
from pipeline.errors import NoSignalError, SpecError
from pipeline.spec import load_spec
from pipeline.stages.export import prepare
from pipeline.stages.loader import load_model
from pipeline.stages.signal_check import check_signal

from .conftest import one_input_spec, run_cli

# As diffusers makes a ControlNet's output convolutions and as adapters are made: zeros.
ZERO_HEAD = """\
import torch
from torch import nn


class ZeroHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def build():
    return ZeroHead()
"""

# Norm scales drawn at std 0.02 (a library's default init): each layer shrinks the signal 50-fold.
SMALL_SCALES = """\
import torch
from torch import nn


class Shrinking(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)) for _ in range(4)])
        for block in self.layers:
            nn.init.normal_(block[1].weight, std=0.02)
            nn.init.zeros_(block[1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build():
    return Shrinking()
"""

IGNORES_MASK = """\
import torch
from torch import nn


class IgnoresMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def build():
    return IgnoresMask()
"""

MASK_INPUT = """
[[inputs]]
name = "mask"
shape = ["batch", 4]
dtype = "int64"
low = 0
high = 2
"""


def write(folder: Path, source: str, spec: str) -> Path:
    """The model under a module name of its own (``signal_<folder>``): checked() imports it here."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"signal_{folder.name}.py").write_text(source)
    (folder / "spec.toml").write_text(
        spec.replace('factory = "model:build"', f'factory = "signal_{folder.name}:build"')
    )
    return folder / "spec.toml"


@pytest.fixture
def checked(monkeypatch):
    """The gate's check on a spec's prepared model, in this process; sys.path and sys.modules as they were after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)

    def check(spec: Path):
        spec_file = load_spec(spec)
        return check_signal(prepare(spec_file, load_model(spec_file), targets.get("cpu")))

    yield check
    for name in [name for name in sys.modules if name.startswith("signal_") and name not in before]:
        del sys.modules[name]


def test_a_zero_initialised_output_layer_stops_the_build_naming_it(tmp_path, dirs):
    spec = write(tmp_path / "zero", ZERO_HEAD, one_input_spec("zero_head"))
    ran = run_cli("build", "--spec", str(spec), *dirs.args())
    assert ran.code == NoSignalError.exit_code == 27, ran.err
    assert (
        f"error: {spec}: verification would compare nothing:\n"
        "  output 'y': its eager reference is the same for the 3 seeded inputs within its tolerance (atol 0.0001, "
        "rtol 0.0001): every value is 0\n"
        "  why, as far as the weights tell:\n"
        "    head.weight (Linear) is all zeros\n"
    ) in ran.err
    assert (
        "hint: seed the weights the way a trained model has them: in the factory, give these tensors trained-like "
        "values (torch.nn.init.normal_(w, std=0.02) for a zero layer"
    ) in ran.err
    assert f'add allow_constant = "<why>" under its [[outputs]] table in {spec}' in ran.err
    assert "==> export" not in ran.err + ran.out  # stopped before export, not after a compile
    assert dirs.leftovers() == []


def test_norm_scales_near_zero_are_named_as_the_reason(tmp_path, checked):
    spec = write(tmp_path / "small", SMALL_SCALES, one_input_spec("small_scales"))
    with pytest.raises(NoSignalError) as raised:
        checked(spec)
    message = raised.value.message
    assert "  output 'y': its eager reference is the same for the 3 seeded inputs within its tolerance" in message
    assert "    layers.0.1.weight, the scale of a LayerNorm, is near zero (largest |value| " in message
    assert "; a trained model's are near 1)" in message


def test_a_model_that_ignores_an_input_is_caught_naming_the_input(tmp_path, dirs):
    spec = write(tmp_path / "mask", IGNORES_MASK, one_input_spec("ignores_mask") + MASK_INPUT)
    ran = run_cli("build", "--spec", str(spec), *dirs.args())
    assert ran.code == NoSignalError.exit_code, ran.err
    assert (
        "  input 'mask' changed nothing: with only it changed (another seed's values), every output stayed "
        "within its tolerance"
    ) in ran.err
    assert "input 'x'" not in ran.err
    assert (
        f"hint: check that forward uses that input; where an input is meant not to matter (a mask the model may "
        f'ignore, say), add allow_unused = "<why>" under its [[inputs]] table in {spec}'
    ) in ran.err


def test_the_spec_allows_with_a_reason_and_the_record_keeps_it(tmp_path, checked):
    zero = one_input_spec("zero_head").replace(
        'name = "y"\n', 'name = "y"\nallow_constant = "a ControlNet starts at zero"\n'
    )
    signal = checked(write(tmp_path / "zero", ZERO_HEAD, zero))
    assert signal.record()["outputs"] == [
        {
            "name": "y",
            "spread": 0.0,
            "low": 0.0,
            "high": 0.0,
            "distinct": False,
            "allowed": "a ControlNet starts at zero",
        }
    ]
    mask = one_input_spec("ignores_mask") + MASK_INPUT + 'allow_unused = "padding is not used yet"\n'
    signal = checked(write(tmp_path / "mask", IGNORES_MASK, mask))
    assert [(i["name"], i["changed"], i["allowed"]) for i in signal.record()["inputs"]] == [
        ("x", ("y",), None),
        ("mask", (), "padding is not used yet"),
    ]


def test_an_allowance_needs_a_reason(tmp_path):
    spec = write(
        tmp_path / "zero",
        ZERO_HEAD,
        one_input_spec("zero_head").replace('name = "y"\n', 'name = "y"\nallow_constant = " "\n'),
    )
    with pytest.raises(SpecError, match=r"key 'outputs\[0\]\.allow_constant': String should match pattern"):
        load_spec(spec)


def test_the_build_report_records_what_the_gate_saw(tiny_build):
    dirs, ran = tiny_build
    report = json.loads(next(dirs.dist.glob("*.report.json")).read_text())
    signal = report["verification"]["signal"]
    assert signal["cases"] == ["seed0", "seed1", "seed2"]
    assert [(o["name"], o["distinct"]) for o in signal["outputs"]] == [("features", True), ("logits", True)]
    assert [(i["name"], i["changed"]) for i in signal["inputs"]] == [
        ("x", ["features", "logits"]),
        ("t", ["features", "logits"]),
    ]


def test_a_checkpoint_with_a_zero_head_is_refused_with_the_checkpoints_fix(tmp_path, dirs):
    """`--hf` with no spec: the fix is the folder's weights, and an allowance goes in an override
    spec, not config.json."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    model = ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=5,
        )
    )
    torch.nn.init.zeros_(model.classifier.weight)  # as an adapter or a head before training starts
    torch.nn.init.zeros_(model.classifier.bias)
    model.save_pretrained(tmp_path / "vit")
    ran = run_cli(
        "build",
        "--hf",
        str(tmp_path / "vit"),
        "--task",
        "image-classification",
        "--name",
        "v",
        "--version",
        "1",
        *dirs.args(),
    )
    assert ran.code == NoSignalError.exit_code, ran.err
    assert "  output 'logits': its eager reference is the same for the 3 seeded inputs" in ran.err
    assert "    model.classifier.weight (Linear) is all zeros\n" in ran.err
    assert (
        "hint: the checkpoint folder's weights are the ones that ship: save it from a trained model, or set these "
        "tensors as a trained model has them"
    ) in ran.err
    assert (
        'add allow_constant = "<why>" under its [[outputs]] table in an override spec (--spec overrides.toml; '
        "its [[inputs]] and [[outputs]] replace the generated lists whole)"
    ) in ran.err
    assert dirs.leftovers() == []
