"""A text checkpoint's sequence limits (issue 44 part 3, issue 46 item 1): the config's position
table and sliding window decide [dims.sequence] before export; an override past them is refused
with the config key, its value and the override that works; torch's guard text is kept where
export still fails on a range."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.errors import ExportError, SpecError
from pipeline.spec import load_spec

from .conftest import one_input_spec, run_cli
from .test_hf_build import NO_SEARCH, build_without_search, save_bert


def save_mistral(folder: Path) -> Path:
    """A decoder whose sliding window (16) is shorter than its positions (4096, capped at 2048)."""
    from transformers import MistralConfig, MistralModel

    torch.manual_seed(0)
    MistralModel(
        MistralConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            sliding_window=16,
        )
    ).save_pretrained(folder)
    return folder


def hf_spec(tmp_path: Path, folder: Path, task: str, extra: str = "") -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[model]\nname = "m"\nversion = "1"\nhf = "{folder.name}"\ntask = "{task}"\n{extra}')
    return spec


def test_the_docs_override_past_max_position_embeddings_is_refused_before_export(tmp_path, dirs):
    """docs/library-models.md's `[dims.sequence] max = 128` on a BERT with 64 positions."""
    folder = save_bert(tmp_path / "bert")
    overrides = tmp_path / "overrides.toml"
    overrides.write_text("[dims.sequence]\nmax = 128\n")
    ran = run_cli(
        "build",
        "--hf",
        str(folder),
        "--task",
        "feature-extraction",
        "--name",
        "enc",
        "--version",
        "1.0",
        "--spec",
        str(overrides),
        *dirs.args(),
    )
    assert ran.code == SpecError.exit_code, ran.err
    assert (
        f"error: {overrides}: key 'dims.sequence.max': 128 is over the checkpoint's max_position_embeddings = 64 "
        f"({folder / 'config.json'}): the model has positions for 64 tokens, so it cannot take a longer sequence\n"
        "hint: use this range in the override spec (--spec), which builds:\n"
        "    [dims.sequence]\n    min = 1\n    max = 64\n"
    ) in ran.err
    assert "==> export" not in ran.err and "hf_tasks.py" not in ran.err
    assert dirs.leftovers() == []


def test_a_sliding_window_decoder_gets_a_sequence_range_from_its_window(tmp_path):
    save_mistral(tmp_path / "mistral")
    spec = load_spec(hf_spec(tmp_path, tmp_path / "mistral", "feature-extraction")).spec
    sequence = spec.dims["sequence"]
    assert (sequence.min, sequence.max, sequence.export_size) == (16, 2048, 16)
    # a max under the window, without a min, asks for short sequences: they start at 1
    spec = load_spec(hf_spec(tmp_path, tmp_path / "mistral", "feature-extraction", "[dims.sequence]\nmax = 8\n")).spec
    assert (spec.dims["sequence"].min, spec.dims["sequence"].max) == (1, 8)


@pytest.mark.parametrize(
    ("dims", "message", "works"),
    [
        (
            "min = 1\nmax = 64",
            "key 'dims.sequence.min': the range [1, 64] crosses the checkpoint's sliding_window = 16",
            (16, 64),
        ),
        (
            "max = 15",
            "key 'dims.sequence.min': the range [1, 15] crosses the checkpoint's sliding_window = 16",
            (1, 14),
        ),
    ],
)
def test_a_range_across_the_sliding_window_is_refused_with_one_that_works(tmp_path, dims, message, works):
    save_mistral(tmp_path / "mistral")
    spec = hf_spec(tmp_path, tmp_path / "mistral", "feature-extraction", f"[dims.sequence]\n{dims}\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert refused.value.message.startswith(
        f"{spec}: {message} ({tmp_path / 'mistral' / 'config.json'}): the attention "
        "mask is made one way for sequences shorter than the window"
    )
    assert refused.value.hint.endswith(f"[dims.sequence]\n    min = {works[0]}\n    max = {works[1]}")


# A position table of 14 rows, as a library model has one: sequences past 14 cannot be added to it.
POSITIONS = """\
import torch
from torch import nn


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(14, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[1]]


def build():
    return Positions()
"""


def test_an_export_that_fails_on_a_range_keeps_torchs_guard_and_suggestion(tmp_path, dirs):
    (tmp_path / "model.py").write_text(POSITIONS)
    spec = one_input_spec("positions", '["batch", "seq", 4]').replace(
        "[[inputs]]", "[dims.seq]\nmin = 2\nmax = 64\nexample = 8\n\n[[inputs]]"
    )
    (tmp_path / "spec.toml").write_text(spec + NO_SEARCH)
    ran = run_cli("build", "--spec", str(tmp_path / "spec.toml"), *dirs.args())
    assert ran.code == ExportError.exit_code, ran.err
    assert "torch.export failed: UserError: Constraints violated (seq)!" in ran.err
    assert (
        "    - Not all values of seq = L['x'].size()[1] in the specified range seq <= 64 satisfy the generated guard "
        "2 <= L['x'].size()[1] and L['x'].size()[1] <= 14\n"
    ) in ran.err
    assert "  Suggested fixes:\n    seq = Dim('seq', max=14)" in ran.err
    assert "; torch's suggestion, as spec keys: [dims.seq] max = 14" in ran.err


def test_a_checkpoint_export_hint_asks_for_an_override_not_code(tmp_path):
    from pipeline.stages.export import _export_hint

    seq = torch.export.Dim("seq", min=2, max=64)
    with pytest.raises(Exception) as failed:
        torch.export.export(_Wrapped(), (torch.zeros(1, 8, 4),), dynamic_shapes=({1: seq},), strict=False)
    hint = _export_hint(failed.value, checkpoint=True)
    assert hint == (
        "the checkpoint's model code takes only part of a [dims] range (torch's guard above): narrow that "
        "dim's min/max in an override spec (--spec overrides.toml); torch's suggestion, as spec keys: "
        "[dims.seq] max = 14"
    )


class _Wrapped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(14, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[1]]


@pytest.mark.slow
def test_the_sliding_window_decoder_builds_as_feature_extraction(tmp_path):
    """The issue's decoder, with no spec of the user's but the search off: builds and verifies."""
    ran = build_without_search(save_mistral(tmp_path / "mistral"), "feature-extraction", "mistral", tmp_path)
    assert ran.code == 0, ran.err
    assert "verified  last_hidden_state: 13 cases" in ran.out + ran.err


@pytest.mark.parametrize("dims", ["min = 1\nmax = 32", "max = 32"])
def test_a_misspelt_dim_in_an_override_is_refused_with_the_one_meant(tmp_path, dims):
    """H50: `[dims.sequnce]` in an --hf override was added as a dim no input names: the build ended 0
    with the sequence range left as the config's (the cap of 32 lost); with only `max` it said
    'dims.sequnce.min': required, a key the user never wrote."""
    save_mistral(tmp_path / "mistral")
    spec = hf_spec(tmp_path, tmp_path / "mistral", "feature-extraction", f"[dims.sequnce]\n{dims}\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert refused.value.message == (
        f"{spec}: key 'dims.sequnce': the feature-extraction task's inputs name no dim 'sequnce' (theirs: "
        f"{', '.join(load_spec(hf_spec(tmp_path, tmp_path / 'mistral', 'feature-extraction')).spec.dims)}); "
        "did you mean [dims.sequence]?"
    )
    assert refused.value.hint == "rename it [dims.sequence]"


def test_a_missing_override_spec_is_said_as_an_override_with_the_path_looked_at(tmp_path):
    """H53: `build --hf … --spec nosuchfile.toml` said "pass --spec PATH to a model's spec.toml, or the
    folder that holds it", where --hf's --spec is an override file, with the path only as typed."""
    ran = run_cli(
        "build", "--hf", str(tmp_path), "--task", "feature-extraction", "--name", "m", "--version", "1",
        "--spec", "nosuchfile.toml", cwd=tmp_path,
    )  # fmt: skip
    assert ran.code == SpecError.exit_code, ran.err
    assert f"error: nosuchfile.toml: no such override spec ({tmp_path / 'nosuchfile.toml'} does not exist)" in ran.err
    assert "hint: with --hf, --spec takes a TOML file of only the keys that differ from those made from the" in ran.err
