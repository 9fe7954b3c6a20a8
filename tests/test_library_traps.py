"""Library models' traps (issue 30): a purity false alarm on modules kept in plain lists, a missing
package's hint, integer inputs past an embedding's end, and a library's shape error."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from pipeline.errors import ModelLoadError, PurityError, SpecError

from .conftest import REPO, one_input_spec, run_cli

ZOO = REPO / "tests" / "zoo"

# As transformers' pixel decoders keep their convolutions: a plain list, each item also registered.
LISTED_MODULES = """\
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lateral = []
        for index in range(2):
            conv = nn.Linear(4, 4)
            self.add_module(f"lateral_{index}", conv)
            self.lateral.append(conv)
        self.scales = (torch.ones(4), 2.0)  # a tuple holding a tensor: `==` on it raises
        self.history = []

    def forward(self, x):
        for conv in self.lateral:
            x = conv(x) * self.scales[0]
        self._remember(x)
        return x

    def _remember(self, x):  # a helper, out of the static check's sight
        WRITE


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = Decoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(x)


def build():
    return Model()
"""


def write(folder: Path, source: str, spec: str = one_input_spec("listed")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source)
    (folder / "spec.toml").write_text(spec)
    return folder / "spec.toml"


def test_modules_kept_in_a_plain_list_are_not_a_write(tmp_path):
    spec = write(tmp_path, LISTED_MODULES.replace("WRITE", "pass"))
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == 0, ran.err


def test_a_write_into_a_list_is_found_and_shown_on_one_line(tmp_path):
    spec = write(tmp_path, LISTED_MODULES.replace("WRITE", "self.history.append(x.shape[0])"))
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == PurityError.exit_code, ran.err
    model = tmp_path / "model.py"
    line = next(n for n, text in enumerate(model.read_text().splitlines(), 1) if "class Decoder" in text)
    # (the doctor has run forward before: the list is longer than 0 by then)
    assert re.search(
        rf"\n  forward wrote self\.decoder\.history: list of (\d+) items -> (\d+) items \(an attribute of "
        rf"Decoder, {re.escape(str(model))}:{line}\)\n",
        ran.err,
    ), ran.err
    assert "lateral" not in ran.err and "scales" not in ran.err


def test_replacing_a_listed_module_is_a_write(tmp_path):
    # (a module made in forward is a graph break as well: allowed, so that the purity check runs)
    spec = write(
        tmp_path,
        LISTED_MODULES.replace("WRITE", "self.lateral[1] = nn.Linear(4, 4)"),
        one_input_spec("listed") + '\n[doctor]\nallow = ["graph-break"]\n',
    )
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == PurityError.exit_code, ran.err
    assert "forward wrote self.decoder.lateral: item [1]: <Linear object> -> another <Linear object>" in ran.err


def library_write(tmp_path: Path, allow: str) -> tuple[Path, dict[str, str]]:
    """A model whose library (outside the spec's folder, on PYTHONPATH) caches a value on first call."""
    library = tmp_path / "site" / "somelib.py"
    library.parent.mkdir(parents=True)
    library.write_text(LISTED_MODULES.replace("WRITE", "self.history.append(x.shape[-1])"))
    source = "from somelib import build\n"
    spec = write(tmp_path / "spec", source, one_input_spec("libwrite") + allow)
    return spec, {"PYTHONPATH": str(library.parent)}


def test_a_purity_finding_in_library_code_can_be_allowed(tmp_path):
    spec, env = library_write(tmp_path, "")
    ran = run_cli("doctor", "--spec", str(spec), env=env)
    assert ran.code == PurityError.exit_code, ran.err
    assert "forward wrote self.decoder.history: list of " in ran.err and "(an attribute of Decoder, " in ran.err
    assert "1 of these are in library code, outside the spec's folder" in ran.err
    assert 'add [doctor] allow = ["purity"] to the spec' in ran.err

    allowed, env = library_write(tmp_path / "allowed", '\n[doctor]\nallow = ["purity"]\n')
    ran = run_cli("doctor", "--spec", str(allowed), env=env)
    assert ran.code == 0, ran.err
    assert "warning [purity] forward wrote self.decoder.history" in ran.err


@pytest.mark.slow  # 35 s here; the mechanism is test_modules_kept_in_a_plain_list_are_not_a_write's
def test_mask2formers_pixel_decoder_passes_the_doctor():
    ran = run_cli("doctor", "--spec", str(ZOO / "hf_mask2former" / "spec.toml"))
    assert ran.code == 0, ran.err
    assert "no problems that stop compilation" in ran.err


# -- a package the model needs ---------------------------------------------------------------------


def test_a_package_missing_when_the_factory_runs_is_named_with_pip_install(tmp_path):
    spec = write(tmp_path, "def build():\n    import no_such_package_xyz\n")
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "model:build(**model.kwargs) needs the package 'no_such_package_xyz', which is not installed" in ran.err
    assert "hint: install it where the build runs: pip install no_such_package_xyz" in ran.err
    assert "model.kwargs against" not in ran.err


def test_a_factory_error_without_kwargs_does_not_blame_kwargs(tmp_path):
    spec = write(
        tmp_path, "def build():\n    raise ValueError('num_channels (16) must be divisible by num_groups (32)')\n"
    )
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "ValueError: num_channels (16) must be divisible by num_groups (32)" in ran.err
    assert "hint: the factory was called with no arguments (the spec has no [model.kwargs])" in ran.err


@pytest.mark.skipif(importlib.util.find_spec("scipy") is not None, reason="scipy is installed here")
def test_mask2former_for_segmentation_without_scipy_names_scipy(tmp_path):
    source = (ZOO / "hf_mask2former" / "zoo_hf_mask2former.py").read_text()
    source = source.replace("Mask2FormerModel", "Mask2FormerForUniversalSegmentation")
    (tmp_path / "zoo_hf_mask2former.py").write_text(source)
    (tmp_path / "spec.toml").write_text((ZOO / "hf_mask2former" / "spec.toml").read_text())
    ran = run_cli("doctor", "--spec", str(tmp_path / "spec.toml"))
    assert ran.code == ModelLoadError.exit_code, ran.err
    assert "zoo_hf_mask2former:build(**model.kwargs) needs the package 'scipy', which is not installed" in ran.err
    assert "Mask2FormerLoss requires the scipy library" in ran.err
    assert "hint: install it where the build runs: pip install scipy" in ran.err


# -- integer inputs and embeddings -----------------------------------------------------------------


def bert_with_high(tmp_path: Path, high: int) -> Path:
    spec = (ZOO / "hf_bert" / "spec.toml").read_text()
    assert "\nhigh = 100\n" in spec
    (tmp_path / "spec.toml").write_text(spec.replace("\nhigh = 100\n", f"\nhigh = {high}\n"))
    (tmp_path / "zoo_hf_bert.py").write_text((ZOO / "hf_bert" / "zoo_hf_bert.py").read_text())
    return tmp_path / "spec.toml"


@pytest.mark.parametrize("high", [1000, 101])  # 101: the example draw may well miss id 100
def test_ids_past_the_vocabulary_are_a_spec_error_naming_low_and_high(tmp_path, high):
    ran = run_cli("doctor", "--spec", str(bert_with_high(tmp_path, high)))
    assert ran.code == SpecError.exit_code, ran.err
    assert (
        f"key 'inputs': input 'input_ids' has low = 0, high = {high} (ids 0 to {high - 1}), but it indexes "
        "model.embeddings.word_embeddings, an embedding of 100 rows (ids 0 to 99)"
    ) in ran.err
    assert "hint: set low = 0 and high = 100 (or less) in the [[inputs]] table named 'input_ids'" in ran.err


# -- a library's shape error -----------------------------------------------------------------------

OWL = """\
import torch
from torch import nn
from transformers import OwlViTVisionConfig, OwlViTVisionModel


class Vision(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


def build():
    return Vision(OwlViTVisionModel(OwlViTVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=128,
        patch_size=16)))
"""

WHISPER = """\
import torch
from torch import nn
from transformers import WhisperConfig, WhisperModel


class Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(input_features).last_hidden_state


def build():
    return Encoder(WhisperModel(WhisperConfig(
        vocab_size=100, num_mel_bins=16, encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=30,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)))
"""


@pytest.mark.parametrize(
    ("source", "name", "shape", "says"),
    [
        (
            OWL,
            "pixel_values",
            '["batch", 3, 64, 64]',
            "most likely: input 'pixel_values' dim 2 is 64, but model.config.image_size = 128",
        ),
        (
            WHISPER,
            "input_features",
            '["batch", 80, 60]',
            "most likely: input 'input_features' dim 1 is 80, but model.config.num_mel_bins = 16",
        ),
    ],
    ids=["owlvit-image-size", "whisper-mel-bins"],
)
def test_a_library_shape_error_names_the_spec_input_and_dim(tmp_path, source, name, shape, says):
    spec = write(tmp_path, source, one_input_spec("shapes", shape=shape, input_name=name))
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == SpecError.exit_code, ran.err
    assert says in ran.err
    assert "hint: make the [[inputs]] shape fit the model's config (the dim named above)" in ran.err
