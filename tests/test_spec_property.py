"""Property (issue 14): any spec file a user can write, malformed TOML, wrong types, unicode and
control characters, huge and negative numbers, either builds or ends in one clear refusal: a
documented exit code and a one-paragraph `error: … hint: …`, never a traceback, never exit 1.

The spec stage runs in-process through the CLI's own main() (argument parsing, spec loading and
validation, the folder checks, the target check, and the error printing), with a stop where the
build itself would begin; a handful of examples go through the real CLI in a subprocess.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import math
import os
import re
import signal
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import build as build_module
from pipeline import cli
from pipeline.stages.loader import load_model

from .conftest import REPO, TINY_SPEC, run_cli

EXAMPLES = 500
BASE = tomllib.loads(TINY_SPEC.read_text())
# The exit codes docs/how-a-build-works.md documents ("| 11, 20-26 | doctor |" and the like).
DOC = (REPO / "docs" / "how-a-build-works.md").read_text()
DOCUMENTED = {
    code
    for cell in re.findall(r"^\| ([\d, -]+) \| \w", DOC, re.M)
    for part in cell.split(",")
    for code in (range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [int(part)])
}
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ReachedBuild(Exception):
    """The spec stage accepted the spec: the build would start here."""


# --- writing TOML (the standard library only reads it) ---


def toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + re.sub(r"[\x00-\x08\x0a-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", escaped) + '"'


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(spec: dict) -> str:
    return "".join(f"{toml_string(str(key))} = {toml_value(value)}\n" for key, value in spec.items())


# --- generating specs ---

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e-308, 5e-324]),
)
SCALARS = st.one_of(NUMBERS, st.booleans(), TEXT, st.datetimes(timezones=st.just(datetime.UTC)), st.dates())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


def paths(tree, prefix=()):
    """Every place in the spec a value sits, tables and lists included."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from paths(value, prefix + (index,))


def put(tree, path, value):
    for step in path[:-1]:
        tree = tree.setdefault(step, {}) if isinstance(tree, dict) else tree[step]
    tree[path[-1]] = value


@st.composite
def changed_specs(draw) -> dict:
    """The tiny model's spec with a few values replaced, removed or added anywhere in it."""
    spec = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from([p for p in paths(spec) if p]))
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "replace":
            put(spec, where, draw(VALUES))
        elif action == "remove":
            parent = spec
            for step in where[:-1]:
                parent = parent[step]
            del parent[where[-1]]
        else:
            parent = spec
            for step in where[:-1]:
                parent = parent[step]
            if isinstance(parent, dict):
                parent[draw(TEXT)] = draw(VALUES)
            else:
                parent.append(draw(VALUES))
    return spec


NAMED_NUMBERS = [
    ("dims", "batch", "min"),
    ("dims", "batch", "max"),
    ("verify", "golden_cases"),
    ("weights", "seed"),
    ("model", "kwargs", "channels"),
    ("compile", "search_budget_s"),
    ("verify", "large_magnitude"),
]
NAMED_TEXTS = [("model", "name"), ("model", "version"), ("model", "factory"), ("model", "description")]


@st.composite
def edge_specs(draw) -> dict:
    """Numbers and text where the spec has numbers and text: huge, negative, unicode, control characters."""
    spec = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["number", "text", "shape", "dim-name"]))
        if kind == "number":
            put(spec, draw(st.sampled_from(NAMED_NUMBERS)), draw(NUMBERS))
        elif kind == "text":
            put(spec, draw(st.sampled_from(NAMED_TEXTS)), draw(TEXT))
        elif kind == "shape":
            shape = spec["inputs"][0]["shape"]
            shape[draw(st.integers(0, len(shape) - 1))] = draw(st.one_of(NUMBERS, TEXT))
        else:
            name = draw(TEXT)
            spec["dims"] = {name: spec["dims"].pop("batch", {"min": 1, "max": 4})}
            spec["inputs"][0]["shape"][0] = name
    return spec


@st.composite
def spec_files(draw) -> bytes:
    kind = draw(st.sampled_from(["changed", "edge", "corrupted", "bytes"]))
    if kind == "changed":
        return toml_document(draw(changed_specs())).encode()
    if kind == "edge":
        return toml_document(draw(edge_specs())).encode()
    text = TINY_SPEC.read_text()
    if kind == "bytes":  # not UTF-8, or cut anywhere
        return text.encode()[: draw(st.integers(0, len(text)))] + draw(st.binary(max_size=4))
    for _ in range(draw(st.integers(1, 3))):  # TOML broken by hand: a character changed, added or removed
        at = draw(st.integers(0, len(text)))
        text = (
            text[:at]
            + draw(st.text(st.characters(exclude_categories=["Cs"]), max_size=3))
            + text[at + draw(st.integers(0, 2)) :]
        )
    return text.encode()


# --- running the CLI's spec stage in-process ---


def load_then_stop(spec_file, **_kwargs):
    """The build's first stage (import the factory, seed, build the module, hash its weights),
    then the stop. Models too big to build in a test's time are not built (the factory's own
    refusals of bad kwargs are covered by any small value)."""
    channels = spec_file.spec.model.kwargs.get("channels", 8)
    if isinstance(channels, int) and not isinstance(channels, bool) and 0 < channels <= 64:
        load_model(spec_file)
    raise ReachedBuild


@contextlib.contextmanager
def cli_in_process():
    """main() sets signal handlers, the unraisable hook and TORCH_TRACE for its process: put them back."""
    saved = (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        sys.unraisablehook,
        os.environ.get("TORCH_TRACE"),
    )
    real_build = build_module.build
    build_module.build = load_then_stop
    try:
        yield
    finally:
        build_module.build = real_build
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
        sys.unraisablehook = saved[2]
        if saved[3] is None:
            os.environ.pop("TORCH_TRACE", None)
        else:
            os.environ["TORCH_TRACE"] = saved[3]


def one_paragraph_refusal(code: int, err: str) -> None:
    assert code != 1 and code in DOCUMENTED, f"exit {code} is not a documented exit code:\n{err}"
    assert "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    # Before it, only the build's progress: a stage begun ("==> start: importing torch") and ended.
    begun = next((place for place, line in enumerate(lines) if line.startswith("error: ")), 0)
    progress, lines = lines[:begun], lines[begun:]
    assert all(line.startswith("==> ") or line.startswith("    ") for line in progress), err
    assert lines[0].startswith("error: "), err
    assert lines[-1].startswith("hint: ") and sum(line.startswith("hint: ") for line in lines) == 1, err
    assert all(line.strip() for line in lines), f"a blank line splits the message:\n{err}"
    assert len(lines) <= 30, err
    assert not CONTROL.search(err), f"raw control characters in the message: {err!r}"


def check_spec(folder: Path, content: bytes) -> str:
    """What the CLI does with one spec file in ``folder`` (beside the tiny model's code)."""
    spec = folder / "spec.toml"
    spec.write_bytes(content)
    err = io.StringIO()
    args = [
        "build",
        "--spec",
        str(spec),
        "--root",
        str(folder / "opt"),
        "--dist",
        str(folder / "dist"),
        "--build-dir",
        str(folder / "build"),
    ]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(args)
    except ReachedBuild:
        return "builds"
    one_paragraph_refusal(code, err.getvalue())
    return f"exit {code}"


def test_documented_exit_codes_are_read_from_the_docs():
    assert {2, 3, 4, 10, 17, 130} <= DOCUMENTED and 1 not in DOCUMENTED and {20, 26} <= DOCUMENTED


def test_every_generated_spec_builds_or_is_refused_in_one_paragraph(tmp_path):
    outcomes: dict[str, int] = {}
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(spec_files())
    def builds_or_refuses(content: bytes) -> None:
        outcome = check_spec(tmp_path, content)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    with cli_in_process():
        builds_or_refuses()
    assert sum(outcomes.values()) >= EXAMPLES, outcomes
    assert outcomes.get("exit 3", 0) > EXAMPLES // 2 and outcomes.get("builds", 0) > 0, outcomes


CLI_EXAMPLES = {
    "malformed TOML": b'[model\nname = "tiny"\n',
    "not UTF-8": TINY_SPEC.read_bytes() + b"\xff\xfe",
    "wrong type": TINY_SPEC.read_bytes().replace(b"max = 4", b'max = "four"'),
    "control characters": TINY_SPEC.read_bytes().replace(b"[weights]", b'"\\u001b[31mred" = 1\n[weights]'),
    "huge number": TINY_SPEC.read_bytes().replace(b"seed = 0", b"seed = 99999999999999999999999"),
    "negative number": TINY_SPEC.read_bytes().replace(b"min = 1", b"min = -3"),
    "unicode name": TINY_SPEC.read_bytes().replace(b'name = "tiny"', 'name = "tïny\u200b"'.encode()),
}


@pytest.mark.parametrize("content", CLI_EXAMPLES.values(), ids=CLI_EXAMPLES.keys())
def test_examples_through_the_real_cli(tmp_path, content):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(content)
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
    one_paragraph_refusal(ran.code, ran.err)
    assert ran.code == 3, ran.err
    assert not (tmp_path / "opt").exists() and not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()
