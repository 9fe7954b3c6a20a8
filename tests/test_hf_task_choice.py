"""Which task builds which checkpoint class (issue 44 part 3, issue 46 item 7): the unconditional
UNet under `--task denoising`, a hint's wrapper written for the saved class, `--task help`, and
"did you mean" for a typo; the refusals of --hf's arguments come before torch's import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.errors import CheckpointError, UnsupportedTaskError
from pipeline.spec import load_spec

from .conftest import REPO, run_cli
from .test_hf_build import build_without_search, save_vit


def save_unconditional_unet(folder: Path) -> Path:
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    ).save_pretrained(folder)
    return folder


def save_audio_classifier(folder: Path) -> Path:
    from transformers import ASTConfig, ASTForAudioClassification

    torch.manual_seed(0)
    ASTForAudioClassification(
        ASTConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_length=64,
            num_mel_bins=16,
        )
    ).save_pretrained(folder)
    return folder


def spec_for(tmp_path: Path, folder: Path, task: str) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[model]\nname = "m"\nversion = "1"\nhf = "{folder.name}"\ntask = "{task}"\n')
    return spec


def test_denoising_takes_an_unconditional_unet(tmp_path):
    save_unconditional_unet(tmp_path / "ddpm")
    spec = load_spec(spec_for(tmp_path, tmp_path / "ddpm", "denoising")).spec
    assert [(i.name, i.shape, i.dtype, i.high) for i in spec.inputs] == [
        ("sample", ["batch", 3, 16, 16], "float32", None),
        ("timestep", ["batch"], "int64", 1000),
    ]
    assert [(o.name, o.atol) for o in spec.outputs] == [("noise_pred", 1e-3)]


def test_denoising_names_the_classes_it_takes_and_a_wrapper_for_the_one_saved(tmp_path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2, sample_size=16).save_pretrained(
        tmp_path / "vae"
    )
    with pytest.raises(CheckpointError) as refused:
        load_spec(spec_for(tmp_path, tmp_path / "vae", "denoising"))
    assert refused.value.message == (
        f"{tmp_path / 'vae'}: holds a AutoencoderKL, but task 'denoising' builds "
        "UNet2DConditionModel or UNet2DModel only"
    )
    assert "    from diffusers import AutoencoderKL\n" in refused.value.hint
    assert (
        "        def forward(self, sample: torch.Tensor) -> torch.Tensor:\n"
        "            return self.model(sample, return_dict=False)[0]\n" in refused.value.hint
    )


def test_a_class_no_task_covers_gets_a_wrapper_for_its_own_inputs(tmp_path):
    folder = save_audio_classifier(tmp_path / "ast")
    ran = run_cli("build", "--hf", str(folder), "--task", "audio-classification", "--name", "a", "--version", "1")
    assert ran.code == UnsupportedTaskError.exit_code, ran.err
    assert "task 'audio-classification' is not one modelwheel builds from a checkpoint folder" in ran.err
    assert (
        "    from transformers import ASTForAudioClassification\n"
        "\n"
        "    class Wrapped(torch.nn.Module):\n"
        "        def __init__(self) -> None:\n"
        "            super().__init__()\n"
        f'            self.model = ASTForAudioClassification.from_pretrained("{folder}", local_files_only=True)\n'
        "\n"
        "        def forward(self, input_values: torch.Tensor) -> torch.Tensor:\n"
        "            return self.model(input_values=input_values).logits\n"
    ) in ran.err
    hint = ran.err[ran.err.index("hint: ") :]
    assert "input_ids" not in hint and "TokenClassification" not in hint


def test_task_help_lists_the_tasks_and_exits_0():
    ran = run_cli("build", "--task", "help")
    assert ran.code == 0, ran.err
    assert ran.out.startswith(
        "the tasks `build --hf DIR --task TASK` builds from a save_pretrained folder:\n"
        "  image-classification   pixel_values -> logits"
    )
    assert "  denoising              sample, timestep[, encoder_hidden_states] -> noise_pred" in ran.out


def test_a_task_typo_gets_did_you_mean(tmp_path):
    folder = save_vit(tmp_path / "vit")
    ran = run_cli("build", "--hf", str(folder), "--task", "image-classifcation", "--name", "v", "--version", "1")
    assert ran.code == UnsupportedTaskError.exit_code, ran.err
    assert (
        "error: task 'image-classifcation' is not one modelwheel builds; did you mean 'image-classification'? "
        "The tasks it builds:\n"
    ) in ran.err
    assert ran.err.rstrip().endswith("hint: --task image-classification")


def test_a_task_typo_on_a_folder_of_another_task_names_the_task_that_fits(tmp_path):
    """'did you mean image-classification?' sent a newcomer with a text model to transformers' own
    refusal of its class: the folder's config.json says which task builds it."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    ran = run_cli("build", "--hf", str(tmp_path), "--task", "image-classifcation", "--name", "v", "--version", "1")
    assert ran.code == UnsupportedTaskError.exit_code, ran.err
    assert (
        "did you mean 'image-classification'? But its config.json names LlamaForCausalLM, which --task "
        "text-generation builds. The tasks it builds:\n"
    ) in ran.err
    assert ran.err.rstrip().endswith("hint: --task text-generation")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    ran = run_cli("build", "--hf", str(tmp_path), "--task", "image-classifcation", "--name", "v", "--version", "1")
    assert (
        "did you mean 'image-classification'? Its config.json names BertForSequenceClassification: check that "
        "the task builds that class. The tasks it builds:\n"
    ) in ran.err
    # a text model's base class is feature-extraction's: a typo of that task gets no doubt
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "vocab_size": 100}))
    ran = run_cli("build", "--hf", str(tmp_path), "--task", "feature-extractoin", "--name", "v", "--version", "1")
    assert "did you mean 'feature-extraction'? The tasks it builds:\n" in ran.err
    ran = run_cli("build", "--hf", str(tmp_path))
    assert "its config.json names BertModel: add --task feature-extraction" in ran.err


# Runs the CLI on each argv in one process, then says which exit codes it gave and whether torch got imported.
REFUSALS_WITHOUT_TORCH = """
import json, sys
from pipeline.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


def test_hf_argument_refusals_come_before_torchs_import(tmp_path):
    """Importing torch took seconds of a refusal that reads only the arguments and the folder."""
    checkpoint = ["--name", "v", "--version", "1"]
    argvs = [
        ["build", "--task", "help"],
        ["build", "--hf", str(tmp_path / "missing"), "--task", "image-classification", *checkpoint],
        ["build", "--hf", str(tmp_path), "--task", "image-classifcation", *checkpoint],
        ["build", "--hf", str(tmp_path)],
        ["build", "--task", "image-classification"],
        ["build", "--hf", str(tmp_path), "--task", "image-classification", "--weights", "w.safetensors", *checkpoint],
    ]
    ran = subprocess.run(
        [sys.executable, "-c", REFUSALS_WITHOUT_TORCH, json.dumps(argvs)], capture_output=True, text=True, cwd=REPO
    )
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout.splitlines()[-1])
    assert said["codes"][0] == 0 and all(code != 0 for code in said["codes"][1:]), ran.stderr
    assert "is not one modelwheel builds; did you mean 'image-classification'?" in ran.stderr
    assert said["torch"] is False, "a refusal of --hf's arguments imported torch"


@pytest.mark.slow
def test_an_unconditional_unet_builds_as_denoising(tmp_path):
    ran = build_without_search(save_unconditional_unet(tmp_path / "ddpm"), "denoising", "ddpm", tmp_path)
    assert ran.code == 0, ran.err
    assert "verified  noise_pred: 10 cases" in ran.out + ran.err
