"""The corpus of broken models (tests/models/broken): each fails the build with its own message,
hint and exit code, before anything is compiled where possible, and leaves nothing behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import doctor_checks
from pipeline.errors import ExportError, PurityError, VerificationError

from .conftest import BROKEN, REPO, run_cli

SOURCE = (BROKEN / "broken_models.py").read_text().splitlines()
CODES = {check.name: check.exit_code for check in doctor_checks.CHECKS}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "writing-models.md"


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(SOURCE, 1) if text in line)


CORPUS = [
    # spec, exit code, text the error must contain, source line it must name (None: not a line-level problem)
    ("variadic", CODES["args-variadic"], "[args-variadic] forward takes *xs", "def forward(self, *xs"),
    # two findings (args-optional, args-non-tensor): the first in the checks' table order decides
    (
        "optional_argument",
        CODES["args-optional"],
        "[args-optional] forward parameter 'scale' is optional",
        "scale: float = 1.0",
    ),
    (
        "non_tensor_argument",
        CODES["args-non-tensor"],
        "[args-non-tensor] forward parameter 'repeats' is annotated int",
        "repeats: int",
    ),
    ("writes_self", CODES["self-write"], "[self-write] forward writes self.calls", "self.calls += 1"),
    (
        "data_dependent",
        CODES["data-dependent"],
        "[data-dependent] `x.sum() > 0` branches on a tensor value",
        "if x.sum() > 0",
    ),
    (
        "derived_data_dependent",
        CODES["data-dependent"],
        "[data-dependent] torch._dynamo graph break",
        "if h.mean() > 0",
    ),
    ("regex", CODES["graph-break"], "[graph-break] re.sub() uses a regex in forward", "re.sub("),
    ("version_check", CODES["version-check"], "[version-check] forward reads torch.__version__", "torch.__version__"),
    ("mutates_buffer", PurityError.exit_code, "forward changed buffer 'seen' in place", None),
    ("random_forward", PurityError.exit_code, "output 0 differs between two calls on the same input", None),
    ("fixed_batch", ExportError.exit_code, "Constraints violated (batch)", None),
]


@pytest.mark.parametrize(("spec", "code", "says", "line"), CORPUS, ids=[c[0] for c in CORPUS])
def test_broken_model_is_refused_before_compiling(dirs, spec, code, says, line):
    ran = run_cli("build", "--spec", str(BROKEN / f"{spec}.toml"), *dirs.args())
    assert ran.code == code, ran.err
    assert says in ran.err
    if line is not None:
        assert f"broken_models.py:{line_of(line)}:" in ran.err
    assert "\nhint: " in ran.err and "Traceback" not in ran.err
    assert "==> compile" not in ran.err
    assert dirs.leftovers() == []


def test_every_check_is_documented_as_declared():
    """docs/writing-models.md's table of checks is doctor_checks.py's, row for row, in its order."""
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `") and "| error |" in line]
    assert rows == [check.docs_row() for check in doctor_checks.CHECKS]


def test_exit_codes_are_distinct_per_kind():
    codes = list(CODES.values()) + [ExportError.exit_code, VerificationError.exit_code]
    assert len(set(codes)) == len(codes)
    assert CODES["purity"] == PurityError.exit_code  # the purity check is PurityError's


def test_perturbed_compiled_output_fails_verification(dirs):
    ran = run_cli("build", "--spec", str(BROKEN / "perturbed.toml"), *dirs.args())
    assert ran.code == VerificationError.exit_code, ran.err
    # through the search (perturbed.toml's budget stops it after its first candidate): its error is that candidate's
    assert "    candidate spec-options: fails verification, dropped (compiled model differs from eager" in ran.err
    assert "error: compiled model differs from eager" in ran.err
    assert "case seed0: output 'y': max abs diff" in ran.err and "case batch=max(4)" in ran.err
    assert "max rel diff 0.01" in ran.err  # the 1.01 scale the corpus model's Inductor pass applies
    assert "/sources" in ran.err and "/trace" in ran.err, "a failed verification points to sources and trace"
    assert dirs.leftovers() == []


def test_doctor_command_reports_without_building(tmp_path):
    ran = run_cli("doctor", "--spec", str(BROKEN / "writes_self.toml"))
    assert ran.code == CODES["self-write"] and "[self-write] forward writes self.calls" in ran.err
    ok = run_cli("doctor", "unet")  # under the suite's OMP_WAIT_POLICY=PASSIVE (tests/__init__.py)
    assert ok.code == 0 and "unet: no problems that stop compilation" in ok.err
    # what runs, as the build's doctor stage says it (it printed nothing for 9 s)
    lines = ok.err.splitlines()
    assert lines[0] == f"==> doctor: unet ({REPO}/models/unet/spec.toml): the model loaded and called eagerly"
    assert re.fullmatch(r"    doctor done in (\d+\.\ds|\d+ms)", lines[-2]), lines


def test_allowed_check_becomes_a_warning(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text((BROKEN / "regex.toml").read_text() + '\n[doctor]\nallow = ["graph-break"]\n')
    (tmp_path / "broken_models.py").write_text((BROKEN / "broken_models.py").read_text())
    ran = run_cli("doctor", "--spec", str(spec))
    assert ran.code == 0, ran.err
    assert "warning [graph-break] re.sub()" in ran.err
