"""The verification gate's first question (issue 44): can the comparison tell anything at all?

An output whose eager reference is the same for every seeded input (a zero-initialised output
layer, norm scales near zero, a model that ignores its inputs) passes any comparison with a
compiled model that returns that same constant: "verified" would mean nothing. So before export
(seconds of eager calls, not minutes of compiling), each output must differ beyond its tolerance
between the seeded verification inputs, and each input must change some output when only it
changes. ``[[outputs]] allow_constant`` and ``[[inputs]] allow_unused`` (with a reason) let a
spec say where that is intended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import NoSignalError
from ..wheel_template.runtime import _inputs as wheel_inputs
from .export import Exported, export_sizes, spec_inputs
from .loader import call_forward
from .verify import as_tuple
from .verify_cases import SEEDS, tolerances

# A trained model's norm scales are near 1; library inits that draw them at std 0.02 give a
# largest |scale| well under this, and outputs that barely move.
NEAR_ZERO_SCALE = 0.1
MAX_SUSPECTS = 6


@dataclass(frozen=True)
class OutputSignal:
    name: str
    spread: float  # largest |difference| of its reference between the seeded cases
    low: float  # its values' range over those cases
    high: float
    distinct: bool  # the seeded cases' references differ beyond its tolerance
    allowed: str | None  # [[outputs]] allow_constant, the spec's reason


@dataclass(frozen=True)
class InputEffect:
    name: str
    changed: tuple[str, ...]  # the outputs that changed beyond tolerance with only this input changed
    varied: bool  # False: the seeds give it the same values (a one-value range), so it could not be tried
    allowed: str | None  # [[inputs]] allow_unused, the spec's reason


@dataclass(frozen=True)
class Signal:
    outputs: tuple[OutputSignal, ...]
    inputs: tuple[InputEffect, ...]

    def record(self) -> dict:
        """The report's verification.signal section."""
        return {
            "cases": [f"seed{seed}" for seed in SEEDS],
            "outputs": [asdict(o) for o in self.outputs],
            "inputs": [asdict(i) for i in self.inputs],
        }


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> bool:
    if got.shape != want.shape:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    return bool(torch.isclose(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True).all())


def _spread(references: list[torch.Tensor]) -> tuple[float, float, float]:
    """(largest |ref_i - ref_0|, lowest value, highest value), over finite values."""
    first = references[0].detach().double()
    spread = max(
        (float(torch.nan_to_num((r.detach().double() - first).abs()).max()) if r.numel() else 0.0) for r in references
    )
    values = torch.cat([r.detach().double().flatten() for r in references])
    values = values[torch.isfinite(values)]
    return spread, (float(values.min()) if values.numel() else 0.0), (float(values.max()) if values.numel() else 0.0)


def _run(exported: Exported, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return as_tuple(call_forward(exported.module, inputs), exported.returns_tuple)


def eager_calls(spec_inputs_count: int) -> int:
    """The eager calls measure() makes, as most models go: one per seed, then one per input taken
    from another seed (the first that moves an output ends that input's check)."""
    return len(SEEDS) + spec_inputs_count


def measure(exported: Exported) -> Signal:
    """Eager outputs on the seeded cases, and with one input at a time taken from another seed."""
    spec = exported.spec_file.spec
    sizes = export_sizes(exported.spec_file)
    cases = [
        tuple(t.to(exported.device) for t in wheel_inputs.make_inputs(spec_inputs(exported.spec_file), sizes, seed))
        for seed in SEEDS
    ]
    refs = [_run(exported, inputs) for inputs in cases]
    tols = tolerances(exported)
    outputs = []
    for index, out in enumerate(spec.outputs):
        mine = [ref[index] for ref in refs]
        spread, low, high = _spread(mine)
        distinct = any(not _close(r, mine[0], *tols[out.name]) for r in mine[1:])
        outputs.append(OutputSignal(out.name, spread, low, high, distinct, out.allow_constant))
    judged = [i for i, o in enumerate(outputs) if o.distinct]
    effects = []
    for position, given in enumerate(spec.inputs):
        if not judged or any(not o.distinct and o.allowed is None for o in outputs):
            break  # outputs without signal say more than inputs would; an input check needs an output that moves
        changed, varied = set(), False
        for other in cases[1:]:
            if torch.equal(other[position], cases[0][position]):
                continue
            varied = True
            mixed = cases[0][:position] + (other[position],) + cases[0][position + 1 :]
            got = _run(exported, mixed)
            changed |= {
                spec.outputs[i].name for i in judged if not _close(got[i], refs[0][i], *tols[spec.outputs[i].name])
            }
            if changed:
                break
        effects.append(InputEffect(given.name, tuple(sorted(changed)), varied, given.allow_unused))
    return Signal(tuple(outputs), tuple(effects))


def _is_norm(module: torch.nn.Module) -> bool:
    norms = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)
    return isinstance(module, norms) or "norm" in type(module).__name__.lower()


def suspects(module: torch.nn.Module) -> list[str]:
    """What in the weights explains outputs that do not move: all-zero weights, norm scales near zero."""
    found = []
    for name, sub in module.named_modules():
        weight = getattr(sub, "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or not weight.numel():
            continue
        largest = float(weight.detach().abs().max())
        if largest == 0:
            found.append(f"{name}.weight ({type(sub).__name__}) is all zeros")
        elif _is_norm(sub) and largest < NEAR_ZERO_SCALE:
            found.append(
                f"{name}.weight, the scale of a {type(sub).__name__}, is near zero (largest |value| "
                f"{largest:.2g}; a trained model's are near 1)"
            )
    return found


def _output_line(o: OutputSignal, tols: dict[str, tuple[float, float]]) -> str:
    rtol, atol = tols[o.name]
    seen = (
        f"every value is {o.low:.6g}"
        if o.low == o.high
        else f"values in [{o.low:.6g}, {o.high:.6g}], but the largest change between cases is {o.spread:.3g}"
    )
    return (
        f"  output {o.name!r}: its eager reference is the same for the {len(SEEDS)} seeded inputs within its "
        f"tolerance (atol {atol:g}, rtol {rtol:g}): {seen}"
    )


def _input_line(effect: InputEffect) -> str:
    return (
        f"  input {effect.name!r} changed nothing: with only it changed (another seed's values), every output "
        f"stayed within its tolerance; a model that ignores an input is verified on nothing for it"
    )


def _spec_to_edit(exported: Exported) -> str:
    """Where an allowance goes: the spec, or for `--hf` without one an override spec (never config.json)."""
    spec_file = exported.spec_file
    hf = spec_file.spec.model.hf
    if hf is not None and spec_file.path == Path(hf) / "config.json":
        return (
            "an override spec (--spec overrides.toml; its [[inputs]] and [[outputs]] replace the generated lists whole)"
        )
    return str(spec_file.path)


def _hint(exported: Exported, found: list[str], flat: bool, unused: bool) -> str:
    path = _spec_to_edit(exported)
    parts = []
    if found and exported.spec_file.spec.model.hf is not None:
        parts.append(
            "the checkpoint folder's weights are the ones that ship: save it from a trained model, or set "
            "these tensors as a trained model has them (torch.nn.init.normal_(w, std=0.02) for a zero layer, "
            "torch.nn.init.ones_(w) for a norm's scale) before save_pretrained()"
        )
    elif found:
        parts.append(
            "seed the weights the way a trained model has them: in the factory, give these tensors "
            "trained-like values (torch.nn.init.normal_(w, std=0.02) for a zero layer, torch.nn.init.ones_(w) "
            "for a norm's scale) and keep [weights] seed, or ship trained weights with [weights] file = "
            f'"trained.safetensors" in {path}'
        )
    elif flat:
        parts.append("check the model's output layers and its weights")
    if unused:
        parts.append("check that forward uses that input")
    if flat:
        parts.append(
            f'where an output is meant to be constant, add allow_constant = "<why>" under its [[outputs]] '
            f"table in {path}"
        )
    if unused:
        parts.append(
            f"where an input is meant not to matter (a mask the model may ignore, say), add allow_unused = "
            f'"<why>" under its [[inputs]] table in {path}'
        )
    return "; ".join(parts)


def check_signal(exported: Exported) -> Signal:
    """The measurement, or NoSignalError naming each output without signal and each input that changed nothing."""
    signal = measure(exported)
    tols = tolerances(exported)
    flat = [o for o in signal.outputs if not o.distinct and o.allowed is None]
    unused = [i for i in signal.inputs if i.varied and not i.changed and i.allowed is None]
    if not flat and not unused:
        return signal
    lines = [_output_line(o, tols) for o in flat] + [_input_line(i) for i in unused]
    found = suspects(exported.module)[:MAX_SUSPECTS]
    why = ("\n  why, as far as the weights tell:\n    " + "\n    ".join(found)) if found else ""
    raise NoSignalError(
        f"{exported.spec_file.path}: verification would compare nothing:\n" + "\n".join(lines) + why,
        _hint(exported, found, bool(flat), bool(unused)),
    )
