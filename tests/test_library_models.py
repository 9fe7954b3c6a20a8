"""What models from torchvision, timm, transformers and diffusers need (issue 13): every kind of
state-dict tensor hashed, BatchNorm models built end to end."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from pipeline import doctor_checks, targets
from pipeline.errors import ModelLoadError, VerificationError
from pipeline.spec import load_spec
from pipeline.stages import precision
from pipeline.stages.export import prepare, where_defined
from pipeline.stages.loader import load_model, state_sha256

from .conftest import REPO, TINY_SPEC, make_venv, one_input_spec, pip_install, run_cli

MODELS = REPO / "tests" / "models"
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
]
SHAPES = [(), (0,), (5,), (2, 3, 4)]


def holding(**tensors: torch.Tensor) -> torch.nn.Module:
    """A module whose state is exactly ``tensors``, as buffers."""
    module = torch.nn.Module()
    for name, tensor in tensors.items():
        module.register_buffer(name, tensor)
    return module


def seeded(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * 50
    if dtype == torch.bool:
        return values > 0
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


def layouts(tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same values held in other memory: transposed, at an offset in a bigger storage, expanded."""
    found = {"contiguous": tensor}
    if tensor.dim() >= 2:
        found["transposed"] = tensor.transpose(0, 1).contiguous().transpose(0, 1)
    base = torch.cat([tensor.reshape(-1), tensor.reshape(-1)[:3]])
    found["offset-in-shared-storage"] = base[: tensor.numel()].view(tensor.shape)
    if tensor.dim() >= 1 and tensor.numel():
        row = tensor.reshape(-1)[:1]
        found["expanded"] = row.expand(tensor.numel()).reshape(-1)
        found["expanded-reference"] = row.repeat(tensor.numel())
    return found


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_tensor_kind_hashes_by_value(shape, dtype):
    tensor = seeded(shape, dtype)
    digest = state_sha256(holding(value=tensor))
    assert digest == state_sha256(holding(value=tensor.clone())), "the same values give the same hash"
    held = layouts(tensor)
    expanded = held.pop("expanded", None), held.pop("expanded-reference", None)
    for kind, other in held.items():
        assert torch.equal(other, tensor) and state_sha256(holding(value=other)) == digest, kind
    if expanded[0] is not None:
        assert state_sha256(holding(value=expanded[0])) == state_sha256(holding(value=expanded[1]))
    if tensor.numel():
        changed = tensor.clone()
        changed.view(-1)[-1] = 0 if tensor.reshape(-1)[-1] != 0 else 1
        assert state_sha256(holding(value=changed)) != digest, "other values give another hash"


def test_dtype_and_shape_are_part_of_the_hash():
    zeros = {
        (shape, dtype): state_sha256(holding(value=torch.zeros(shape, dtype=dtype)))
        for shape in SHAPES
        for dtype in DTYPES
    }
    assert len(set(zeros.values())) == len(zeros)


def test_conjugate_and_negative_views_hash_as_their_values():
    z = seeded((3, 2), torch.complex64)
    assert z.conj().is_conj() and state_sha256(holding(v=z.conj())) == state_sha256(holding(v=z.conj().resolve_conj()))
    negative = torch._neg_view(z)
    assert negative.is_neg() and state_sha256(holding(v=negative)) == state_sha256(holding(v=-z))


def test_tied_and_shared_storage_tensors():
    base = seeded((4, 6), torch.float32)
    shared = holding(a=base[:2], b=base[2:], t=base.t())
    separate = holding(a=base[:2].clone(), b=base[2:].clone(), t=base.t().contiguous())
    assert state_sha256(shared) == state_sha256(separate)
    tied = torch.nn.Module()
    tied.embed = torch.nn.Embedding(5, 3)
    tied.head = torch.nn.Linear(3, 5, bias=False)
    tied.head.weight = tied.embed.weight  # counted once, as named_parameters() gives it
    assert len(state_sha256(tied)) == 64


def test_float32_contiguous_weights_keep_the_hash_they_had():
    """The hash before every kind was handled, for the tensors it handled: cache keys stay valid."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GroupNorm(2, 4), torch.nn.Linear(4, 2))
    before = hashlib.sha256()
    for name, tensor in sorted([*module.named_parameters(), *module.named_buffers()]):
        before.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
        before.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    assert state_sha256(module) == before.hexdigest()


def test_sparse_and_quantized_tensors_hash():
    dense = seeded((3, 4), torch.float32)
    sparse = dense.to_sparse()
    assert state_sha256(holding(v=sparse)) == state_sha256(holding(v=dense.to_sparse()))
    assert state_sha256(holding(v=sparse)) != state_sha256(holding(v=dense)), "the layout is named"
    if hasattr(torch, "quantize_per_tensor"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch 2.13
            q = torch.quantize_per_tensor(dense, 0.1, 3, torch.qint8)
            requantized = torch.quantize_per_tensor(dense, 0.2, 3, torch.qint8)
        assert state_sha256(holding(v=q)) == state_sha256(holding(v=q.clone()))
        assert state_sha256(holding(v=q)) != state_sha256(holding(v=requantized))


def test_meta_tensor_is_a_model_load_error():
    with pytest.raises(ModelLoadError, match="value: the model's tensor is on the meta device"):
        state_sha256(holding(value=torch.zeros(3, device="meta")))


def line_of(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def decorated_model(folder: Path, body: str) -> Path:
    """A model whose forward is wrapped by a functools.wraps decorator defined in another file,
    as transformers wraps many; returns the model's file."""
    (folder / "helpers.py").write_text(
        textwrap.dedent("""\
        import functools


        def traced(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper
        """)
    )
    model = folder / "model.py"
    model.write_text(
        textwrap.dedent("""\
        import torch
        from torch import nn

        from helpers import traced


        class Decorated(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 4)

            @traced
            def forward(self, x: torch.Tensor) -> torch.Tensor:
        """)
        + textwrap.indent(textwrap.dedent(body), " " * 8)
        + "\n\ndef build():\n    return Decorated()\n"
    )
    (folder / "spec.toml").write_text(one_input_spec("decorated"))
    return model


def test_doctor_names_the_decorated_forwards_own_file_and_line(tmp_path):
    model = decorated_model(
        tmp_path,
        """\
        y = self.linear(x)
        if y.sum().item() > 0:
            return y
        return -y
        """,
    )
    ran = run_cli("doctor", "--spec", str(tmp_path / "spec.toml"))
    assert ran.code == doctor_checks.DATA_DEPENDENT.exit_code, ran.err
    assert f"{model}:{line_of(model, 'if y.sum().item()')}: error [data-dependent]" in ran.err
    assert "helpers.py" not in ran.err


def test_where_defined_names_the_def_under_its_decorators(tmp_path):
    model = decorated_model(tmp_path, "return self.linear(x)")
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location("decorated_model_under_test", model)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("helpers", None)
    assert where_defined(module.Decorated.forward) == f"{model}:{line_of(model, 'def forward')}"


KEYWORD_ONLY_MODEL = """\
import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * torch.sigmoid(mask)


def build():
    return Masked()
"""


def keyword_only_model(folder: Path) -> Path:
    """x and mask of one shape: given in the wrong order, the compiled model gives other values."""
    (folder / "model.py").write_text(KEYWORD_ONLY_MODEL)
    spec = folder / "spec.toml"
    spec.write_text(
        one_input_spec("masked")
        + textwrap.dedent("""
        [[inputs]]
        name = "mask"
        shape = ["batch", 4]

        [compile]
        search = false
        """)
    )
    return spec


BATCHNORM_KEYWORD_ONLY_MODEL = """\
import torch
from torch import nn

from bn_cnn import BatchNormCNN


class MaskedBatchNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.cnn = BatchNormCNN()

    def forward(self, image: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return self.cnn(image * torch.sigmoid(mask))


def build():
    return MaskedBatchNormCNN()
"""


def test_batchnorm_cnn_with_a_keyword_only_argument_builds_installs_and_verifies(dirs, tmp_path):
    """Two things library models need, in one build (each build's export and compile is most of a
    minute of one core): tests/models/bn_cnn's BatchNorm CNN (its int64 num_batches_tracked
    buffers, running statistics of a trained model), behind a forward whose mask is keyword-only.
    image and mask have one shape: given in the wrong order, the compiled model gives other values,
    so verification in the build and in the installed wheel fails unless mask goes by name."""
    shutil.copyfile(MODELS / "bn_cnn" / "bn_cnn.py", tmp_path / "bn_cnn.py")
    (tmp_path / "model.py").write_text(BATCHNORM_KEYWORD_ONLY_MODEL)
    spec = (MODELS / "bn_cnn" / "spec.toml").read_text()
    spec = spec.replace('name = "bn_cnn"', 'name = "masked_bn_cnn"').replace("bn_cnn:build", "model:build")
    spec = spec.replace("[[outputs]]", '[[inputs]]\nname = "mask"\nshape = ["batch", 3, 8, 8]\n\n[[outputs]]')
    assert spec.count('shape = ["batch", 3, 8, 8]') == 2 and "model:build" in spec
    (tmp_path / "spec.toml").write_text(spec)
    ran = run_cli("build", "--spec", str(tmp_path / "spec.toml"), *dirs.args())
    assert ran.code == 0, ran.err
    assert "verified  logits: 10 cases" in ran.out + ran.err
    wheel = next(dirs.dist.glob("model_masked_bn_cnn-0.1+cpu*.whl"))
    python = make_venv(tmp_path / "env")
    pip_install(python, str(wheel))
    verified = subprocess.run([str(python.parent / "model-masked-bn-cnn"), "verify"], capture_output=True, text=True)
    assert verified.returncode == 0 and "2 golden cases match" in verified.stdout, verified.stdout + verified.stderr


def test_keyword_only_forward_argument_under_autocast(tmp_path):
    """The bfloat16 candidate wraps the model: it too must pass mask by name, in eager and in export."""
    spec_file = load_spec(keyword_only_model(tmp_path))
    sys.path.insert(0, str(tmp_path))
    try:
        exported = prepare(spec_file, load_model(spec_file), targets.get("cpu"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    x, mask = exported.example_inputs
    with torch.no_grad():
        want = exported.module(x, mask=mask)
        assert torch.allclose(precision.wrap(exported)(x, mask), want, atol=0.05)
        program = precision.export_autocast(exported, precision.AUTOCAST_DTYPE)
        assert torch.allclose(program.module()(x, mask), want, atol=0.05)


def test_failed_fp64_verification_writes_its_report_and_gives_eagers_own_error(warm_dirs, tmp_path):
    """A tolerance too tight for float32: the error gives both numbers a tolerance is chosen from.
    The tiny model's compile is in the warm cache: a tolerance is verification's, not part of the
    compile's key, so this build, whose subject is its verification, reuses the .so."""
    dirs = warm_dirs
    tight = TINY_SPEC.read_text().replace('name = "features"\n', 'name = "features"\nrtol = 0.0\natol = 1e-12\n')
    assert tight != TINY_SPEC.read_text()
    spec = tmp_path / "spec.toml"
    spec.write_text(tight + "\n[verify]\nfp64_reference = true\nedge_cases = false\ngolden_cases = 1\n")
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    ran = run_cli("build", "--spec", str(spec), *dirs.args())
    assert ran.code == VerificationError.exit_code, ran.err
    assert "==> export" not in ran.err, "a tighter tolerance reuses the cached compile: no export, no compile"
    assert "error: compiled model differs from eager float64 in " in ran.err
    assert re.search(
        r"case seed0: output 'features': max abs diff \S+, .*\(rtol 0, atol 1e-12\); "
        r"eager's own max abs error against float64: \d",
        ran.err,
    ), ran.err
    worst = re.search(
        r"worst over all cases, output 'features': compiled (\S+), eager (\S+) max abs error against float64", ran.err
    )
    assert worst, ran.err
    report_file = Path(re.search(r"every case is in (\S+)", ran.err).group(1))
    report = json.loads(report_file.read_text())
    verification = report["verification"]
    assert report["model"] == "tiny" and verification["passed"] is False
    assert verification["reference"] == "eager float64"
    features = verification["worst"]["features"]
    assert f"{features['max_abs']:.3g}" == worst.group(1) and f"{features['eager_vs_fp64_max_abs']:.3g}" == worst.group(
        2
    )
    assert 0 < features["eager_vs_fp64_max_abs"] < 1e-3
    assert not any(case["outputs"]["features"]["passed"] for case in verification["cases"])
    assert all(set(case["eager_vs_fp64_max_abs"]) == {"features", "logits"} for case in verification["cases"])
    assert dirs.leftovers() == [], "a failed build leaves nothing in dist/ or under the root"
