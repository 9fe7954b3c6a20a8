"""load_numpy(): every array the C interface cannot take as it is is converted or refused, naming the input."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from .conftest import REPO
from .test_end_to_end import run_in

# --- load_numpy(): every array the C interface cannot take as it is is converted or refused ---

# One process runs every case against the installed wheel; each case is compared with the same
# numbers passed as a plain native, C-ordered, writable array.
NUMPY_CASES = r"""
import json, numpy as np, model_tiny
m = model_tiny.load_numpy()
rng = np.random.default_rng(7)
x = rng.standard_normal((2, 3, 8, 8), dtype=np.float32)
t = (rng.random(2) * 1000).astype(np.float32)

def read_only(a):
    frozen = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)  # memory that cannot be written at all
    assert not frozen.flags.writeable
    return frozen

def misaligned(a):
    raw = np.zeros(a.nbytes + 1, np.uint8)
    shifted = raw[1:].view(a.dtype).reshape(a.shape)
    shifted[...] = a
    assert not shifted.flags.aligned
    return shifted

def strided(a):
    wide = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]

cases = {
    "big_endian": (x.astype(">f4"), t.astype(">f4")),
    "fortran": (np.asfortranarray(x), t),
    "strided": (strided(x), strided(t)),
    "reversed": (x[::-1], t[::-1]),
    "broadcast": (np.broadcast_to(x[:1], x.shape), np.broadcast_to(t[:1], t.shape)),
    "read_only": (read_only(x), read_only(t)),
    "misaligned": (misaligned(x), misaligned(t)),
    "big_endian_fortran_read_only": (read_only(np.asfortranarray(x.astype(">f4"))), t.astype(">f4")),
    "float64": (x.astype(np.float64), t),
    "int32": (x, t.astype(np.int32)),
    "object": (x.astype(object), t),
    "masked": (np.ma.masked_array(x, mask=x > 0), t),
    "zero_d": (x, np.array(t[0])),
    "rank_3": (x[0], t),
    "rank_5": (x[None], t),
}
results = {}
for name, args in cases.items():
    before = [np.array(a, copy=True) for a in args]
    try:
        got = m(*args)
    except ValueError as exc:
        results[name] = {"error": str(exc)}
        continue
    want = m(*[np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")) for a in args])
    results[name] = {
        "error": None,
        "equal": all(np.array_equal(g, w) for g, w in zip(got, want)),
        "finite": all(bool(np.isfinite(g).all()) for g in got),
        "outputs_writeable": all(g.flags.writeable for g in got),
        "inputs_unchanged": all(np.array_equal(a, b) for a, b in zip(args, before)),
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def numpy_cases(installed) -> dict[str, dict]:
    ran = run_in(installed, NUMPY_CASES)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def _correct(result: dict) -> None:
    assert result["error"] is None, result["error"]
    assert result["equal"] and result["finite"], "the model must see the same numbers as from a plain array"
    assert result["outputs_writeable"] and result["inputs_unchanged"]


def test_big_endian_arrays_are_converted(numpy_cases):
    _correct(numpy_cases["big_endian"])


@pytest.mark.parametrize("case", ["fortran", "strided", "reversed", "broadcast"])
def test_non_contiguous_and_fortran_arrays_are_copied_to_c_order(numpy_cases, case):
    _correct(numpy_cases[case])


def test_read_only_arrays_are_read_in_place_and_give_writable_outputs(numpy_cases):
    _correct(numpy_cases["read_only"])


def test_misaligned_arrays_are_copied(numpy_cases):
    _correct(numpy_cases["misaligned"])


def test_every_fault_at_once_is_converted(numpy_cases):
    _correct(numpy_cases["big_endian_fortran_read_only"])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("float64", "input 'x': expected dtype float32, got float64"),
        ("int32", "input 't': expected dtype float32, got int32"),
        ("object", "input 'x': expected dtype float32, got object"),
        ("masked", "input 'x': expected a plain numpy.ndarray, got a masked array: pass a.filled(value)"),
    ],
)
def test_wrong_dtype_or_masked_array_is_refused_naming_the_input(numpy_cases, case, message):
    assert numpy_cases[case] == {"error": message}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("zero_d", "input 't': expected 1 dims ['batch'], got 0 dims [] (a 0-d scalar)"),
        ("rank_3", "input 'x': expected 4 dims ['batch', 3, 8, 8], got 3 dims [3, 8, 8]"),
        ("rank_5", "input 'x': expected 4 dims ['batch', 3, 8, 8], got 5 dims [1, 2, 3, 8, 8]"),
    ],
)
def test_zero_d_or_wrong_rank_is_refused_with_expected_and_got(numpy_cases, case, message):
    assert numpy_cases[case] == {"error": message}


# --- docs/wheel-and-runtime.md's load_numpy() examples run as written ---


def load_numpy_examples() -> list[str]:
    """The python blocks of the page's load_numpy() section: the unet's, then any wheel's from its manifest."""
    text = (REPO / "docs" / "wheel-and-runtime.md").read_text()
    section = re.split(r"\n##+ ", text.split("### Without importing torch: `load_numpy()`")[1])[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, blocks
    return blocks


# after the page's block, in the same process: what it made, then load()'s outputs for the wheel's own example
AFTER_EXAMPLE = """
import json, sys
outputs = outputs if isinstance(outputs, tuple) else (outputs,)
made = {"torch_imported": "torch" in sys.modules, "shapes": [list(o.shape) for o in outputs],
        "dtypes": [str(o.dtype) for o in outputs]}
eager = model_tiny.load()(*model_tiny.example_inputs())
made["load_shapes"] = [list(o.shape) for o in eager]
print(json.dumps(made))
"""


def test_the_docs_manifest_example_runs_on_an_installed_wheel(installed):
    """The page's example called the model with `sample, timestep, context`, defined nowhere."""
    code = load_numpy_examples()[1].replace("model_unet", "model_tiny")
    ran = run_in(installed, code + AFTER_EXAMPLE)
    assert ran.returncode == 0, ran.stderr
    made = json.loads(ran.stdout.splitlines()[-1])
    assert made["torch_imported"] is False  # load_numpy(): no torch, as the page says
    assert made["shapes"] == made["load_shapes"]  # the same sizes as the wheel's own example inputs
    assert made["dtypes"] == ["float32", "float32"]


def test_the_docs_unet_example_makes_the_inputs_the_unet_spec_declares():
    """The unet's block (a unet build takes minutes: its arrays are checked, not run) makes each
    input the spec declares, in order, at the batch's example size and within low/high."""
    import numpy as np

    block = load_numpy_examples()[0]
    arrays = [line for line in block.splitlines() if "model" not in line and "noise" not in line]
    arrays_only = "\n".join(["import numpy as np", *arrays])
    made: dict = {}
    exec(arrays_only, made)  # noqa: S102 (the page's own code)
    spec = tomllib.loads((REPO / "models" / "unet" / "spec.toml").read_text())
    sizes = {name: dim.get("example", 2) for name, dim in spec["dims"].items()}
    called = re.search(r"model\(([^)]*)\)", block)[1].split(", ")
    assert called == [i["name"] for i in spec["inputs"]]
    for declared in spec["inputs"]:
        array = made[declared["name"]]
        assert isinstance(array, np.ndarray)
        assert list(array.shape) == [sizes.get(d, d) for d in declared["shape"]], declared["name"]
        assert array.dtype == np.dtype(declared.get("dtype", "float32")), declared["name"]
        if "low" in declared:
            assert declared["low"] <= array.min() and array.max() < declared["high"], declared["name"]


# --- example_arrays(): load_numpy()'s example inputs, made without torch ---

EXAMPLE_ARRAYS = r"""
import json, sys, numpy as np, model_tiny
made = model_tiny.example_arrays()
again = model_tiny.example_arrays(seed=0)
other_seed = model_tiny.example_arrays(3)
at_max = model_tiny.example_arrays(batch=4)
outputs = model_tiny.load_numpy()(*made)
result = {
    "torch_imported": "torch" in sys.modules,
    "types": [type(a).__name__ for a in made],
    "shapes": [list(a.shape) for a in made],
    "dtypes": [str(a.dtype) for a in made],
    "at_max": [list(a.shape) for a in at_max],
    "same_seed_equal": all(np.array_equal(a, b) for a, b in zip(made, again)),
    "other_seed_differs": not np.array_equal(made[0], other_seed[0]),
    "t_range": [float(made[1].min()), float(made[1].max())],
    "outputs_finite": all(bool(np.isfinite(o).all()) for o in outputs),
    "errors": [],
}
for sizes in ({"batch": 5}, {"height": 3}):
    try:
        model_tiny.example_arrays(**sizes)
    except ValueError as exc:
        result["errors"].append(str(exc))
tensors = model_tiny.example_inputs()
result["tensor_shapes"] = [list(t.shape) for t in tensors]
result["tensor_dtypes"] = [str(t.dtype).removeprefix("torch.") for t in tensors]
print(json.dumps(result))
"""


def test_example_arrays_make_load_numpys_inputs_without_torch(installed):
    """A newcomer read `load_numpy()` in the README but found only example_inputs(), whose torch
    tensors load_numpy() refuses: example_arrays() makes the same shapes and dtypes as numpy arrays."""
    ran = run_in(installed, EXAMPLE_ARRAYS)
    assert ran.returncode == 0, ran.stderr
    made = json.loads(ran.stdout.splitlines()[-1])
    assert made["torch_imported"] is False
    assert made["types"] == ["ndarray", "ndarray"]
    assert made["shapes"] == made["tensor_shapes"] and made["dtypes"] == made["tensor_dtypes"]
    assert made["at_max"] == [[4, 3, 8, 8], [4]]
    assert made["same_seed_equal"] and made["other_seed_differs"]
    assert 0 <= made["t_range"][0] and made["t_range"][1] < 1000  # the spec's low and high for t
    assert made["outputs_finite"]
    assert made["errors"] == [
        "input 'x': dim 0 (batch) is 5, outside the built range [1, 4]",
        "unknown dims ['height']; this model's dynamic dims are ['batch']",
    ]


def test_example_arrays_keep_integer_and_bool_inputs_in_bounds_and_refuse_bfloat16():
    import numpy as np

    from pipeline.wheel_template.runtime import _inputs

    specs = [
        {"name": "ids", "shape": ["batch", 5], "dtype": "int64", "low": 3, "high": 9},
        {"name": "mask", "shape": ["batch", 5], "dtype": "bool", "low": 0, "high": 2},
        {"name": "half", "shape": [2], "dtype": "float16"},
    ]
    ids, mask, half = _inputs.make_arrays(specs, {"batch": 64}, seed=0)
    assert ids.dtype == np.int64 and ids.shape == (64, 5) and ids.min() == 3 and ids.max() == 8
    assert mask.dtype == np.bool_ and mask.any() and not mask.all()
    assert half.dtype == np.float16 and half.shape == (2,)
    with pytest.raises(ValueError, match=r"input 'h' is bfloat16, which numpy has no type for: use example_inputs\(\)"):
        _inputs.make_arrays([{"name": "h", "shape": [2], "dtype": "bfloat16"}], {}, seed=0)


# --- README.md's python one-liners run on an installed wheel ---


def readme_python_lines() -> list[str]:
    from .test_docs_commands import commands

    return [words[2] for words in commands(REPO / "README.md") if words[:2] == ["python", "-c"]]


def test_the_readmes_python_one_liners_run_on_an_installed_wheel(installed):
    """The README's lines (for the unet: a build takes minutes) run on the tiny wheel, its second
    output's shape printed where the unet's one output's is; load_numpy()'s without torch."""
    lines = readme_python_lines()
    assert any("load_numpy" in line for line in lines) and any("load()" in line for line in lines), lines
    for line in lines:
        assert line.count(").shape)") == 1, line
        on_tiny = line.replace("model_unet", "model_tiny").replace(").shape)", ")[1].shape)")
        ran = run_in(installed, on_tiny + "\nimport sys; print('torch' in sys.modules)")
        assert ran.returncode == 0, f"{line}\n{ran.stderr}"
        printed, torch_imported = ran.stdout.splitlines()
        assert "2, 4" in printed, printed  # the tiny model's logits at its example batch
        assert torch_imported == str("load_numpy" not in line), line
