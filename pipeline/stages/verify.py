"""Stage 3: compare the compiled .so with eager PyTorch.

Cases (verify_cases.py, with each output's tolerance): three seeded inputs, each dynamic dim at
its min, middle and max, all-zero and large-magnitude inputs, and the golden cases the wheel will
carry (their eager outputs are recorded so the installed wheel can re-check itself).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import targets
from ..errors import VerificationError
from ..services.progress import StepClock, estimate, expected_s, step
from ..wheel_template.runtime import _compare as wheel_compare
from ..wheel_template.runtime import _constants as wheel_constants
from ..wheel_template.runtime import _integrity as wheel_integrity
from ..wheel_template.runtime import _targets as wheel_targets
from ..wheel_template.runtime import _weights as wheel_weights
from .compile import Compiled
from .export import Exported
from .loader import call_forward, weight_tensors
from .verify_cases import Case, Tolerance, applied_to, verification_cases

OutputDiff = wheel_compare.OutputDiff
GOLDEN_FILE = "golden.safetensors"
WEIGHTS_FILE = "weights.safetensors"
REPORT_FILE = "verification.json"  # every verification's, passed or failed, in its work folder
# The large-magnitude case saturates softmax, exp and the like: float32 rounding there gives
# errors far above any tolerance, in eager as much as in the compiled model. Where that case
# misses the usual comparison, both are judged against float64 instead: the compiled model's
# max abs error may be at most this many times eager's own, plus the output's atol.
LARGE_CASE = "large"
LARGE_ERROR_FACTOR = 4.0


@dataclass(frozen=True)
class CaseResult:
    case: str
    sizes: dict[str, int]
    outputs: tuple[OutputDiff, ...]
    eager_vs_fp64: dict[str, float] | None = None  # eager's own max abs error, with an fp64 reference
    against_fp64: dict[str, Fp64Judgement] | None = None  # the large case, judged against float64

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


@dataclass(frozen=True)
class Fp64Judgement:
    """One output of the large-magnitude case against float64: compiled and eager max abs errors."""

    compiled: float
    eager: float
    bound: float  # LARGE_ERROR_FACTOR * eager + atol
    passed: bool

    def describe(self) -> str:
        verdict = "within" if self.passed else "over"
        return (
            f"against float64: compiled max abs error {self.compiled:.3g}, eager's own {self.eager:.3g}: {verdict} "
            f"the bound {self.bound:.3g} ({LARGE_ERROR_FACTOR:g} x eager's + atol)"
        )


@dataclass(frozen=True)
class Verified:
    cases: tuple[CaseResult, ...]
    tolerances: dict[str, Tolerance]
    golden_file: Path
    golden_cases: tuple[str, ...]
    reference: str
    weights_file: Path | None  # external weights, exactly as verified
    # The sha256 of the .so's bytes as verification loaded them: the manifest's hash of the file
    # must be the same (stages/manifest.py), so the wheel ships what was verified.
    library_sha256: str

    def worst(self) -> dict[str, dict[str, float]]:
        return worst(self.cases)

    def report(self) -> dict:
        """The build report's "verification" section."""
        return verification_report(self.cases, self.tolerances, self.reference, self.golden_cases)


def worst(cases: Iterable[CaseResult]) -> dict[str, dict[str, float]]:
    """Per output, the largest abs and rel diff over all cases (and eager's own error, with fp64_reference)."""
    summary: dict[str, dict[str, float]] = {}
    for case in cases:
        for diff in case.outputs:
            entry = summary.setdefault(diff.name, {"max_abs": 0.0, "max_rel": 0.0})
            entry["max_abs"] = max(entry["max_abs"], diff.max_abs)
            entry["max_rel"] = max(entry["max_rel"], diff.max_rel)
            if case.eager_vs_fp64 is not None:
                entry["eager_vs_fp64_max_abs"] = max(
                    entry.get("eager_vs_fp64_max_abs", 0.0), case.eager_vs_fp64[diff.name]
                )
    return summary


def verification_report(
    cases: Sequence[CaseResult], tolerances: dict[str, Tolerance], reference: str, golden_cases: Iterable[str]
) -> dict[str, Any]:
    return {
        "passed": all(case.passed for case in cases),
        "reference": reference,
        "golden_cases": list(golden_cases),
        "worst": worst(cases),
        "tolerances": {name: dataclasses.asdict(t) for name, t in tolerances.items()},
        "cases": [
            {
                "case": case.case,
                "sizes": case.sizes,
                "outputs": {
                    d.name: {"max_abs": d.max_abs, "max_rel": d.max_rel, "passed": d.passed} for d in case.outputs
                },
                **({"eager_vs_fp64_max_abs": case.eager_vs_fp64} if case.eager_vs_fp64 is not None else {}),
                **(
                    {"against_fp64": {n: dataclasses.asdict(j) for n, j in case.against_fp64.items()}}
                    if case.against_fp64
                    else {}
                ),
            }
            for case in cases
        ],
    }


def as_tuple(outputs: Any, returns_tuple: bool) -> tuple[torch.Tensor, ...]:
    return tuple(outputs) if returns_tuple else (outputs,)


def _fp64_module(exported: Exported) -> torch.nn.Module:
    return copy.deepcopy(exported.module).double()


def _to_fp64(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() if t.dtype.is_floating_point else t for t in tensors]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Eager on one thread, for the outputs the wheel carries: how a CPU sums over threads follows
    their number, and a wheel built under OMP_NUM_THREADS=1 (as the search's busy-machine line
    advises) carried other golden outputs than its rebuild on 2 threads, so `reproduce` said it
    differed. One thread gives the same bytes on a machine of any size."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def open_runner(compiled: Compiled, weights_file: Path | None) -> Any:
    """The compiled model as the wheel opens it: the .so, plus external weights (memory-mapped) if
    any. The .so is opened once, hashed through that descriptor and loaded through it."""
    return open_hashed(compiled, weights_file)[0]


def open_hashed(compiled: Compiled, weights_file: Path | None) -> tuple[Any, str]:
    """open_runner's runner, and the sha256 of the bytes it loaded (Verified.library_sha256)."""
    target = targets.get(compiled.target)
    fd = os.open(compiled.library, os.O_RDONLY | os.O_CLOEXEC)
    sha256 = wheel_integrity.sha256_fd(fd)
    # held open as the wheel's loaders hold theirs (dlopen knows a library by its name first)
    runner = targets.open_runner(target, Path(wheel_integrity.hold(fd)), kernels=compiled.library.parent)
    if weights_file is not None:
        tensors = {name: t.to(target.TORCH_DEVICE) for name, t in wheel_weights.read_weights(weights_file).items()}
        wheel_weights.load_into(runner, tensors, inactive=False)
    if compiled.constants is not None:  # static batch sizes: constants outside the .so (pipeline/stages/constants.py)
        store = wheel_constants.Store(compiled.constants, wheel_targets.constant_layouts(targets.runtime(target)))
        runner.update_constant_buffer(store.tensors(compiled.library.name), False, True, True)
        return _WithStore(runner, store), sha256
    return runner, sha256


class _WithStore:
    """A runner whose constants read a mapped constants file: keeps the mapping as long as the runner."""

    def __init__(self, runner: Any, store: wheel_constants.Store) -> None:
        self._runner, self._store = runner, store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


def _run_compiled(runner: Any, case: Case, exported: Exported) -> list[torch.Tensor]:
    try:
        outputs: list[torch.Tensor] = runner.run(list(case.inputs))
        return outputs
    except RuntimeError as exc:  # a kernel the compiler got wrong for these sizes, say
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise VerificationError(
            f"the compiled model raised on case {case.name} (sizes {case.sizes}) where eager did not: {first}",
            f"a compiler bug for these options or sizes: pin other options under [compile] in "
            f"{exported.spec_file.path} (search = false), or narrow the dims; the compile trace is in "
            f"{os.environ.get('TORCH_TRACE', 'build/<model>/trace')}",
        ) from exc


def _max_error(got: torch.Tensor, ref64: torch.Tensor) -> float:
    """Max abs error against float64; NaN or inf where the reference is finite counts as infinite."""
    diff = (got.detach().double().cpu() - ref64.cpu()).abs()
    return float(torch.nan_to_num(diff, nan=float("inf")).max()) if diff.numel() else 0.0


def judge_against_fp64(
    names: Sequence[str],
    diffs: Sequence[OutputDiff],
    got: Sequence[torch.Tensor],
    eager: Sequence[torch.Tensor],
    ref64: Sequence[torch.Tensor],
    tols: dict[str, tuple[float, float]],
) -> dict[str, Fp64Judgement]:
    """The outputs that missed the usual comparison, each judged by the float64 rule (floating outputs only)."""
    judged: dict[str, Fp64Judgement] = {}
    for name, diff, g, e, r in zip(names, diffs, got, eager, ref64):
        if diff.passed or diff.problem.startswith("got ") or not e.dtype.is_floating_point:
            continue
        compiled_error, eager_error = _max_error(g, r), _max_error(e, r)
        bound = LARGE_ERROR_FACTOR * eager_error + tols[name][1]
        judged[name] = Fp64Judgement(compiled_error, eager_error, bound, compiled_error <= bound)
    return judged


def _large_case_against_fp64(
    exported: Exported,
    case: Case,
    diffs: tuple[OutputDiff, ...],
    got: list[torch.Tensor],
    eager: tuple[torch.Tensor, ...],
    ref64: tuple[torch.Tensor, ...] | None,
    tols: dict[str, tuple[float, float]],
) -> tuple[tuple[OutputDiff, ...], dict[str, Fp64Judgement]]:
    """(diffs, judgements): a large case's misses re-judged against float64 (run here unless given)."""
    names = [d.name for d in diffs]
    if ref64 is None:
        try:
            with torch.no_grad(), targets.reference(exported.target):
                ref64 = as_tuple(call_forward(_fp64_module(exported), _to_fp64(case.inputs)), exported.returns_tuple)
        except (RuntimeError, TypeError, NotImplementedError):  # an op without float64: the miss stands as it is
            return diffs, {}
    judged = judge_against_fp64(names, diffs, got, eager, ref64, tols)
    diffs = tuple(
        dataclasses.replace(d, passed=True) if d.name in judged and judged[d.name].passed else d for d in diffs
    )
    return diffs, judged


def verify_model(
    exported: Exported,
    compiled: Compiled,
    work_dir: Path,
    weights_file: Path | None,
    doing: str = "",
    stage: str | None = None,
    basis: str = StepClock.BASIS,
    then_s: float = 0.0,
    pending: bool = False,
) -> Verified:
    """``weights_file``: write_weights()'s file for a model with external weights, else None.
    The status names each case as it runs, ``doing`` before it (``1/4 spec-options: verifying ``):
    the unet's ten cases took 100 s that said only what ran, not how far along it was. ``stage``:
    the stage verifying is the whole of, which then estimates what is left from the cases (StepClock),
    ``basis`` said beside that figure, and ``then_s`` added to it: what the stage has left after this
    verification. ``pending``: its figure replaces the stage's own, which is said to be pending
    until it comes (else only where the stage has no figure)."""
    spec = exported.spec_file.spec
    work_dir.mkdir(parents=True, exist_ok=True)
    runner, library_sha256 = open_hashed(compiled, weights_file)
    target = targets.get(compiled.target)
    applied = applied_to(exported)
    tols = {name: (t.rtol, t.atol) for name, t in applied.items()}
    names = [o.name for o in spec.outputs]
    reference_module = _fp64_module(exported) if spec.verify.fp64_reference else None
    reference = "eager float64" if reference_module is not None else target.REFERENCE
    results, golden = [], {}
    cases = verification_cases(exported)
    sizes = [float(sum(getattr(t, "numel", lambda: 1)() for t in case.inputs)) for case in cases]  # batch 8 is slower
    clock = StepClock(stage, len(cases), basis, sizes=sizes, then_s=then_s) if stage else None
    if clock is not None and (pending or expected_s(clock.stage) is None):  # H66: a first verify said no time left
        estimate(None, clock.pending())
    for number, case in enumerate(cases, 1):
        step(f"{doing}case {number}/{len(cases)} {case.name}")
        with torch.no_grad(), targets.reference(target):
            with one_thread() if case.golden else contextlib.nullcontext():
                eager = as_tuple(call_forward(exported.module, case.inputs), exported.returns_tuple)
            got = _run_compiled(runner, case, exported)
            eager_error, ref64 = None, None
            if reference_module is not None:
                ref64 = as_tuple(call_forward(reference_module, _to_fp64(case.inputs)), exported.returns_tuple)
                eager_error = {n: float((e.double() - r).abs().max()) for n, e, r in zip(names, eager, ref64)}
                want = tuple(r.to(e.dtype) for r, e in zip(ref64, eager))
            else:
                want = eager
        diffs = tuple(wheel_compare.compare(n, g, w, *tols[n]) for n, g, w in zip(names, got, want))
        judged = None
        if case.name == LARGE_CASE and not all(d.passed for d in diffs):
            diffs, judged = _large_case_against_fp64(exported, case, diffs, got, eager, ref64, tols)
        results.append(CaseResult(case.name, dict(case.sizes), diffs, eager_error, judged or None))
        if case.golden:
            golden.update({f"{case.name}/inputs/{i.name}": t.cpu() for i, t in zip(spec.inputs, case.inputs)})
            golden.update({f"{case.name}/outputs/{n}": t.contiguous().cpu() for n, t in zip(names, eager)})
        if clock is not None:
            clock.done(number)
    golden_cases = tuple(r.case for r in results if r.case.startswith("golden"))
    report_file = work_dir / REPORT_FILE
    report = verification_report(results, applied, reference, golden_cases)
    report_file.write_text(
        json.dumps(
            {"model": spec.model.name, "target": exported.target.NAME, "verification": report}, indent=2, sort_keys=True
        )
        + "\n"
    )
    _raise_on_failures(exported, results, reference, report_file)
    golden_file = work_dir / GOLDEN_FILE
    from safetensors.torch import save_file

    save_file(golden, str(golden_file))
    return Verified(
        cases=tuple(results),
        tolerances=applied,
        golden_file=golden_file,
        golden_cases=golden_cases,
        reference=reference,
        weights_file=weights_file,
        library_sha256=library_sha256,
    )


def write_weights(exported: Exported, work_dir: Path) -> Path | None:
    """The external weights file the wheel will ship, written once per build (None when the
    weights are compiled into the .so); every verification loads this same file."""
    if not exported.spec_file.spec.weights.external:
        return None
    from safetensors.torch import save_file

    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / WEIGHTS_FILE
    tensors = {name: t.contiguous().cpu() for name, t in weight_tensors(exported.module).items()}
    try:
        save_file(tensors, str(path))
    except RuntimeError:  # tensors sharing storage (tied weights) must be saved as copies
        save_file({name: t.clone() for name, t in tensors.items()}, str(path))
    return path


def _eager_error(case: CaseResult, output: str) -> str:
    if case.eager_vs_fp64 is None:
        return ""
    return f"; eager's own max abs error against float64: {case.eager_vs_fp64[output]:.3g}"


def _fp64_judgement(case: CaseResult, output: str) -> str:
    judged = (case.against_fp64 or {}).get(output)
    return f"; {judged.describe()}" if judged else ""


def _raise_on_failures(exported: Exported, results: list[CaseResult], reference: str, report_file: Path) -> None:
    failures = [(c, d) for c in results for d in c.outputs if not d.passed]
    if not failures:
        return
    lines = [
        f"  case {c.case}: {d.describe()}{_eager_error(c, d.name)}{_fp64_judgement(c, d.name)}" for c, d in failures
    ]
    checks = sum(len(c.outputs) for c in results)
    failed_outputs = {d.name for _, d in failures}
    if results[0].eager_vs_fp64 is not None:  # the numbers a tolerance is chosen from
        lines += [
            f"  worst over all cases, output {name!r}: compiled {w['max_abs']:.3g}, "
            f"eager {w['eager_vs_fp64_max_abs']:.3g} max abs error against float64"
            for name, w in worst(results).items()
            if name in failed_outputs
        ]
    work_dir = report_file.parent
    raise VerificationError(
        f"compiled model differs from {reference} in {len(failures)} of {checks} checks:\n"
        + "\n".join(lines)
        + f"\nevery case is in {report_file}",
        f"if the forward is deterministic and these diffs are acceptable, raise rtol/atol under [[outputs]] in "
        f"{exported.spec_file.path}; else read the generated sources in {work_dir / 'sources'} and the compile "
        f"trace in {os.environ.get('TORCH_TRACE', 'build/<model>/trace')}",
    )
