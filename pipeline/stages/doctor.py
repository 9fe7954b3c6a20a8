"""`pipeline doctor`: check a module against the practices that make compilation work.

Static checks read the source of every forward the model holds (file:line for each problem),
keeping only the lines one eager run executed and branches on parameters that held tensors
(doctor_source.py, with doctor_trace.py); dynamic checks run torch._dynamo.explain for graph
breaks and data-dependent branches. The doctor is advice: torch.export and verification judge the
build. Findings in code outside the spec's folder (transformers, diffusers, torch itself) are
warnings, never errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from .. import doctor_checks
from ..doctor_checks import (
    DATA_DEPENDENT,
    GRAPH_BREAK,
)
from ..errors import DoctorError
from ..services.progress import Steps, say
from ..spec import SpecFile
from .doctor_source import Finding, static_findings, traced_runs
from .export import check_inputs_fit, check_signature, example_inputs, where_defined
from .loader import LoadedModel, forward_arguments
from .purity import check_purity

OUTSIDE = " (code outside the spec's folder: advice only; torch.export and verification decide)"


def _inside(path: str, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return False
    return True


def judged(findings: list[Finding], allow: tuple[str, ...], own_folder: Path | None) -> list[Finding]:
    """Checks named in ``allow`` become warnings; so does every finding in code outside ``own_folder``."""
    result = []
    for finding in findings:
        if own_folder is not None and not _inside(finding.path, own_folder):
            finding = dataclasses.replace(finding, severity="warning", message=finding.message + OUTSIDE)
        elif finding.check in allow:
            finding = dataclasses.replace(finding, severity="warning")
        result.append(finding)
    return result


def dynamic_findings(
    module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], source_files: tuple[Path, ...]
) -> list[Finding]:
    """Graph breaks found by torch._dynamo.explain, each placed at the user's line."""
    import torch._dynamo  # heavy: imported by the one check that runs dynamo

    args, kwargs = forward_arguments(module, inputs)
    wanted = {str(p) for p in source_files}
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(module)(*args, **kwargs)
    findings = []
    for reason in explained.break_reasons:
        frames = [f for f in reason.user_stack if str(Path(f.filename).resolve()) in wanted]
        frame = frames[-1] if frames else (reason.user_stack[-1] if reason.user_stack else None)
        text = " ".join(str(reason.reason).split())[:200]
        data_dependent = "data-dependent" in text.lower() or "generic_jump" in text or "jump" in text.lower()
        findings.append(
            Finding(
                frame.filename if frame else "?",
                frame.lineno if frame else 0,
                "error",
                DATA_DEPENDENT.name if data_dependent else GRAPH_BREAK.name,
                f"torch._dynamo graph break: {text}",
                "use torch.where/torch.cond instead of a Python branch on a tensor"
                if data_dependent
                else "move this call to __init__ or replace it with tensor operations",
            )
        )
    return findings


def unique(findings: list[Finding]) -> list[Finding]:
    """Drop repeats of the same check on the same line (a block used twice is reported once)."""
    seen, result = set(), []
    for finding in sorted(findings, key=lambda f: (f.path, f.line, f.check)):
        key = (finding.path, finding.line, finding.check)
        if key not in seen:
            seen.add(key)
            result.append(finding)
    return result


DOCTOR_STEPS = 3  # run_doctor's numbered steps: source, graph breaks (diagnose's), purity
TRACE_STEP = 2  # graph breaks: dynamo traces the model, where the other steps call it eagerly
# Each step's eager calls on the example inputs, what its time left is weighed by (the trace is
# left out of it): source (traced), graph breaks, purity (twice on the same inputs)
DOCTOR_CALLS = (2.0, 1.0, 2.0)


def diagnose(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    source_files: tuple[Path, ...],
    allow: tuple[str, ...] = (),
    before_tracing: Callable[[], None] = lambda: None,
    own_folder: Path | None = None,
    steps: Steps | None = None,
) -> list[Finding]:
    """Static findings, then (unless one of them stops the build anyway) dynamic ones: one report,
    repeats dropped.

    Checks named in ``allow`` (the spec's [doctor] allow), and whatever is found in code outside
    ``own_folder`` (the spec's folder), are reported as warnings; neither turns a check off.
    ``before_tracing`` runs before dynamo sees the model (it checks that the inputs fit it).
    """
    step = steps or Steps(DOCTOR_STEPS - 1)
    step("the forward's source, on the lines one eager call runs")
    findings = judged(static_findings(module, traced_runs(module, inputs)), allow, own_folder)
    if not any(f.severity == "error" for f in findings):
        before_tracing()
        step("graph breaks (torch._dynamo.explain)")
        findings += judged(dynamic_findings(module, inputs, source_files), allow, own_folder)
    return unique(findings)


def raise_on_errors(findings: list[Finding], model: str) -> None:
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise DoctorError(
            f"{model}: {len(errors)} problem(s) that stop compilation:\n" + "\n".join(f.format() for f in errors),
            "fix each line above (docs/writing-models.md explains every check); "
            "`modelwheel doctor --spec SPEC` re-checks without building",
            exit_code=first_check.exit_code
            if (first_check := doctor_checks.first([f.check for f in errors]))
            else None,
        )


def run_doctor(spec_file: SpecFile, loaded: LoadedModel, steps: Steps | None = None) -> list[Finding]:
    """Everything the doctor checks, as the build's first stage and `pipeline doctor` run it:
    source and dynamo findings (warnings shown, errors raised), the signature, then purity.
    ``steps``: the build's count, where its doctor stage has steps of its own after these."""
    steps = steps or Steps(DOCTOR_STEPS)
    inputs = example_inputs(spec_file, None)  # beside the module as it was loaded

    def inputs_fit() -> None:  # before dynamo: a spec error in one paragraph, not a trace of the model
        check_inputs_fit(spec_file, loaded.module, inputs, loaded.source_files)

    findings = diagnose(
        loaded.module,
        inputs,
        loaded.source_files,
        tuple(spec_file.spec.doctor.allow),
        inputs_fit,
        own_folder=spec_file.path.parent,
        steps=steps,
    )
    for finding in findings:
        if finding.severity == "warning":
            say(finding.format())
    raise_on_errors(findings, spec_file.spec.model.name)  # diagnose() ran inputs_fit() unless there is one
    check_signature(spec_file, loaded.module)
    steps("purity: the same inputs, the same outputs, no state kept")  # fits a row of 80 columns
    check_purity(
        loaded.module,
        inputs,
        where_defined(type(loaded.module).forward),
        tuple(spec_file.spec.doctor.allow),
        say,
        own_folder=spec_file.path.parent,
    )
    return findings
