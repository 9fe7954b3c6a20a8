"""The doctor's checks, each declared once: its name (also its `[doctor] allow` key), its exit
code, and its row in docs/writing-models.md ("The checks"; a test compares them).

The spec's allow list, DoctorError's exit codes and the doctor's findings all come from here.
With several findings, the build exits with the code of the first in this order (the table's),
whatever order the lines come in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    exit_code: int
    finds: str  # the docs' "what it finds"
    why: str  # the docs' "why it matters"

    def docs_row(self) -> str:
        return f"| `{self.name}` | {self.exit_code} | error | {self.finds} | {self.why} |"


ARGS_VARIADIC = Check(
    "args-variadic", 20, "`*args` / `**kwargs` in the top-level forward", "the compiled model has one fixed signature"
)
ARGS_OPTIONAL = Check(
    "args-optional",
    21,
    "a forward parameter with a default",
    "optional behaviour cannot be chosen per call in a compiled graph",
)
ARGS_NON_TENSOR = Check(
    "args-non-tensor",
    22,
    "a forward parameter annotated as something other than a tensor",
    "the compiled model takes tensors only; other values are frozen at export",
)
SELF_WRITE = Check(
    "self-write",
    23,
    "`self.x = ...`, `self.x += ...`, `setattr(self, ...)`, `self.buf.add_(...)` in any user forward",
    "the compiled model has no Python state; writes vanish or corrupt weights",
)
DATA_DEPENDENT = Check(
    "data-dependent",
    24,
    "`if`/`while`/ternary on a forward argument's value, `.item()`, "
    "`.tolist()`, `.numpy()`; and, found by `torch._dynamo.explain`, branches on values computed "
    "inside forward",
    "export needs one graph for every input; a Python branch on a value picks one path forever or fails",
)
GRAPH_BREAK = Check(
    "graph-break",
    25,
    "`re.*`, `time.*`, `platform.*`, `sys.*` calls in forward (`inspect.signature` "
    "and other `inspect` calls are not: they read the code, a constant); any other graph break "
    "`torch._dynamo.explain` reports",
    "these run once at export and are frozen, and they break `torch.compile` graphs",
)
VERSION_CHECK = Check(
    "version-check",
    26,
    "`torch.__version__`, `sys.version_info` read in forward",
    "evaluated once at export: decide it in `__init__`",
)

# Run on the module itself (pipeline/stages/purity.py), after the source checks: PurityError.
PURITY = Check(
    "purity",
    12,
    "forward, run twice on the example inputs, changed a parameter, buffer or plain attribute, "
    "or gave two different outputs (below)",
    "the compiled model keeps no state and draws no numbers: such a forward computes something else once compiled",
)

CHECKS: tuple[Check, ...] = (
    ARGS_VARIADIC,
    ARGS_OPTIONAL,
    ARGS_NON_TENSOR,
    SELF_WRITE,
    DATA_DEPENDENT,
    GRAPH_BREAK,
    VERSION_CHECK,
    PURITY,
)
BY_NAME = {check.name: check for check in CHECKS}
NAMES = tuple(BY_NAME)


def first(names: list[str]) -> Check | None:
    """The check that decides the exit code among several findings: the first in table order."""
    found = [BY_NAME[name] for name in names if name in BY_NAME]
    return min(found, key=CHECKS.index) if found else None
