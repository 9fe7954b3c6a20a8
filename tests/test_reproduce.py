"""`modelwheel reproduce WHEEL`: the wheel rebuilt from the spec its report names, with the options,
CPU kind and root it records, into a temporary folder, and compared file by file. Two tiny builds:
the session's wheel against its own source, and against a copy whose model code changed."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import torch

from pipeline.errors import NotReproducedError

from .conftest import GOOD, TINY_SPEC, one_input_spec, run_cli, spec_copy


def test_the_session_wheel_is_identical_to_its_rebuild(wheel):
    ran = run_cli("reproduce", str(wheel))
    assert ran.code == 0, ran.err
    assert "the compile options the wheel records (spec-options): no option search" in ran.err
    # the CPU kind as the build's lines say it, not only the --cpu-isa word (H48: "CPU kind native")
    kind = torch.backends.cpu.get_cpu_capability()
    assert f"; cpu, CPU kind {kind} (native: the build machine's own), root " in ran.err.splitlines()[0], ran.err
    assert ran.err.splitlines()[-1] == f"identical: {wheel.name} is byte for byte its rebuild from {TINY_SPEC}"
    # no install lines for the throwaway rebuild: they read as an invitation to install it
    assert "  install   " not in ran.err and "  import    " not in ran.err
    rebuilt_in = re.search(r" in (\S+modelwheel-reproduce-\S+) \(removed if identical, ", ran.err)[1]
    assert not Path(rebuilt_in).exists(), "an identical rebuild leaves nothing behind"
    # and its summary names no file there: a newcomer looked for the wheel and report it had removed
    assert [line for line in ran.err.splitlines() if rebuilt_in in line] == [ran.err.splitlines()[0]]
    assert "  wheel     the rebuild, compared below  " in ran.err and "  report    " not in ran.err
    # no rough timing for a report that is thrown away (14 s of a newcomer's unet reproduce)
    assert "in 1 round" not in ran.err and "one round here" not in ran.err, ran.err


def test_a_changed_model_source_names_the_files_that_differ(wheel, tmp_path):
    """The copy also turns the option search on: the rebuild still compiles the options the wheel
    records, and no other candidate."""
    spec = spec_copy(tmp_path / "src", GOOD.replace("search = false", "search = true"))
    code = spec.parent / "tiny_model.py"
    code.write_text(code.read_text().replace("nn.functional.silu(", "nn.functional.gelu("))
    # the rebuild that differs is kept for a look, in the temporary folder: this test's, not /tmp
    # (each suite run left one there)
    ran = run_cli("reproduce", str(wheel), "--spec", str(spec), env={"TMPDIR": str(tmp_path)})
    assert ran.code == NotReproducedError.exit_code == 28, ran.err
    assert f"(the rebuild is kept: {tmp_path}/modelwheel-reproduce-" in ran.err
    assert "candidate freezing" not in ran.err and "search:" not in ran.err
    error, hint = ran.err.splitlines()[-2:]
    # every file that differs, where the first alone named the manifest or the goldens and hid the .so
    assert error.startswith(
        f"error: {wheel.name} is not identical to its rebuild from {spec}: the files that differ: "
        "model_tiny/golden.safetensors, model_tiny/manifest.json, model_tiny/artifacts/model.so, "
        f"model_tiny-0.1+cpu.torch{torch.__version__.split('+')[0]}.dist-info/RECORD (the rebuild is kept: "
    ), error
    assert hint.startswith(
        "hint: a changed spec, model code or weights, or another modelwheel (the runtime files every "
        "wheel carries), make another wheel; else compare what must match: torch, the compiler ("
    )


def test_the_compiled_model_holds_no_path_of_the_torch_that_built_it(wheel):
    """Torch's install path (this checkout's venv) was in the .so, in the runtime headers' __FILE__
    strings and in the generated sources' names, so the same commit built in another folder, as
    every release job under act is, made another wheel. The compile sees torch through a link
    beside the .so, written as 'torch' (issue 45)."""
    torch_dir = str(Path(torch.__file__).parent).encode()
    with zipfile.ZipFile(wheel) as archive:
        libraries = [name for name in archive.namelist() if name.endswith(".so")]
        assert libraries, archive.namelist()
        for name in libraries:
            data = archive.read(name)
            assert b"torch/include/torch/csrc/inductor/aoti_runtime/model_container.h" in data, name
            assert torch_dir not in data, f"{name} holds {torch_dir.decode()}"
            assert b"/.torch/" not in data, f"{name} holds the path of the link it was compiled through"


# Linear then ReLU: with freezing, oneDNN's linear with the ReLU fused in, a kernel of freezing's
# pattern matcher.
FUSED_MODEL = """
from torch import nn


def build():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
"""


def test_a_frozen_model_holds_no_python_address_so_its_rebuild_is_identical(dirs, tmp_path):
    """Freezing's pattern matcher makes kernels that Inductor names, in its size asserts, by the
    repr of a functools.partial: '<function …fn at 0x7f722ca3b2e0>', another address in every
    process. The generated sources are named by a hash of their text, so every compile of a frozen
    unet gave a .so of other bytes and `reproduce` failed on a wheel just built (exit 28)."""
    (tmp_path / "model.py").write_text(FUSED_MODEL)
    spec = tmp_path / "spec.toml"
    spec.write_text(one_input_spec("fused", '["batch", 8]') + "\n[compile]\nsearch = false\nfreezing = true\n")
    ran = run_cli("build", "--spec", str(spec), *dirs.args())
    assert ran.code == 0, ran.err
    with zipfile.ZipFile(next(dirs.dist.glob("*.whl"))) as archive:
        library = archive.read("model_fused/artifacts/model.so")
    assert b"functools.partial(<function " in library, "no kernel of freezing's pattern matcher to check"
    assert not re.search(rb" at 0x[0-9a-fA-F]{6,}", library), "the .so holds a Python object's address"


# Sixteen sums of 65536 numbers each: a CPU splits each over its threads, so what eager gives depends
# on how many it runs on.
SUMS_MODEL = """
import torch
from torch import nn


class Sums(nn.Module):
    def forward(self, x):
        return torch.stack([part.sum() for part in x.chunk(16, dim=1)])


def build():
    return Sums()
"""
SUMS_SPEC = """
[model]
name = "sums"
version = "0.1"
factory = "model:build"

[weights]
seed = 0

[[inputs]]
name = "x"
shape = [1, 1048576]

[[outputs]]
name = "y"
rtol = 1e-3  # sums of 65536 numbers, each summed in another order
atol = 1e-2

[compile]
search = false
"""


def test_a_wheel_built_on_one_thread_is_identical_to_its_rebuild_on_two(dirs, tmp_path):
    """The search's busy-machine line advises OMP_NUM_THREADS=1 for the build; the wheel it gave
    carried eager's golden outputs of one thread, and `reproduce` run without it (two threads)
    said golden.safetensors differed (exit 28). The goldens are eager's on one thread, always."""
    from safetensors.torch import load

    (tmp_path / "model.py").write_text(SUMS_MODEL)
    spec = tmp_path / "spec.toml"
    spec.write_text(SUMS_SPEC)
    ran = run_cli("build", "--spec", str(spec), *dirs.args(), env={"OMP_NUM_THREADS": "1"})
    assert ran.code == 0, ran.err
    wheel = next(dirs.dist.glob("*.whl"))
    # the model is one whose eager outputs differ with the threads, else this test could not fail
    with zipfile.ZipFile(wheel) as archive:
        golden = load(archive.read("model_sums/golden.safetensors"))
    inputs = next(t for name, t in golden.items() if name.endswith("/inputs/x"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.stack([part.sum() for part in inputs.chunk(16, dim=1)])
        torch.set_num_threads(2)
        two = torch.stack([part.sum() for part in inputs.chunk(16, dim=1)])
    finally:
        torch.set_num_threads(threads)
    assert not torch.equal(one, two), "these sums came out the same on one thread and two"
    again = run_cli("reproduce", str(wheel), env={"OMP_NUM_THREADS": "2"})
    assert again.code == 0, again.err
    assert again.err.splitlines()[-1].startswith(f"identical: {wheel.name} is byte for byte its rebuild"), again.err


def test_a_wheel_name_that_is_not_there_gets_the_wheels_beside_it(wheel):
    """The docs' example named a manylinux_2_28 wheel; this machine tags manylinux_2_35: 'not a
    readable wheel: [Errno 2]' and 'give a wheel modelwheel built' left a newcomer to find the name."""
    missing = wheel.with_name(re.sub(r"manylinux_\d+_\d+", "manylinux_2_1", wheel.name))
    ran = run_cli("reproduce", str(missing))
    assert ran.code == 2, ran.err  # a usage error, as publish's (H60 read 15 as "an altered wheel")
    assert ran.err.splitlines()[-2:] == [
        f"error: {missing}: no such file",
        f"hint: the wheels in {wheel.parent}: {', '.join(p.name for p in sorted(wheel.parent.glob('*.whl')))}",
    ]


def test_packed_weights_descriptors_lose_their_padding_bytes():
    """A frozen unet's packed weights' oneDNN descriptors, which the sources carry byte for byte,
    held whatever memory held in two 4-byte padding holes (0x7f8f in the search's worker, 0x7f71 in
    reproduce's process): 33 of 202 differed, and so did the .so. The holes are where torch's
    serialization puts them (checked on a real descriptor), and are written as 0."""
    from pipeline.stages import same_bytes

    real = torch.ops.mkldnn._get_mkldnn_serialized_md(torch.randn(8, 3, 3, 3).to_mkldnn()).tolist()
    assert len(real) == same_bytes.MKLDNN_MD_SIZE
    assert real[4] == 4 and real[104] == 3 and real[312] == 2  # ndims, data_type f32, format_kind blocked
    garbage = real[:108] + [143, 127, 0, 0] + real[112:316] + [199, 92, 146, 198] + real[320:]
    line = f"    constants_info_[7].opaque_metadata = {{{', '.join(f'{v}L' for v in garbage)}}};"
    cleaned = same_bytes._without_padding(line)
    values = [int(v.rstrip("L")) for v in cleaned.split(" = {")[1].removesuffix("};").split(", ")]
    assert values[108:112] == values[316:320] == [0, 0, 0, 0]
    assert values[:108] == real[:108] and values[112:316] == real[112:316] and values[320:] == real[320:]
    assert same_bytes._without_padding(line.replace("{1L, ", "{")) == line.replace("{1L, ", "{")  # another size


def test_a_checkpoint_wheels_rebuild_is_said_to_be_from_its_folder():
    """H47: `identical: … its rebuild from …/overrides-nosearch.toml` named a two-line override spec,
    and not the checkpoint folder that holds the model."""
    from types import SimpleNamespace

    from pipeline.commands.reproduce import source_said

    folder = Path("/data/bert-nopool")
    hf = {"path": str(folder), "task": "feature-extraction"}
    assert source_said(SimpleNamespace(checkpoint=hf, spec=folder / "config.json")) == str(folder)
    overrides = Path("/data/overrides.toml")
    assert source_said(SimpleNamespace(checkpoint=hf, spec=overrides)) == (
        "/data/bert-nopool (with the override spec /data/overrides.toml)"
    )
    assert source_said(SimpleNamespace(checkpoint=None, spec=TINY_SPEC)) == str(TINY_SPEC)


def test_a_wheel_built_with_version_is_rebuilt_at_that_version(tmp_path):
    """H48: `reproduce` of a wheel built with `--version 1.4` rebuilt the spec's 1.3, and every file
    differed (exit 28). The .so of a new version's build, from the build cache or compiled fresh, is
    the same (tests/test_build_stops.py's two versions built at once)."""
    from types import SimpleNamespace

    from pipeline.commands.reproduce import source

    spec = spec_copy(tmp_path / "m", GOOD)
    built = SimpleNamespace(checkpoint=None, spec=spec, manifest={"version": "0.7"})
    assert source(built).spec.model.version == "0.7"
    built.manifest["version"] = "0.1"  # the spec's own: loaded as it is
    assert source(built).spec.model.version == "0.1"
