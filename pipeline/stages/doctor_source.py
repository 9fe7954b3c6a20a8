"""The doctor's source checks: every forward the model holds, read with ast (file:line for each
problem), and its signature; with one eager run's trace (doctor_trace.py), only the lines that ran
and branches on parameters that held tensors there. doctor.py judges what they find.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import torch

from ..doctor_checks import (
    ARGS_NON_TENSOR,
    ARGS_OPTIONAL,
    ARGS_VARIADIC,
    DATA_DEPENDENT,
    GRAPH_BREAK,
    SELF_WRITE,
    VERSION_CHECK,
)
from .doctor_trace import ForwardRun, trace_forwards

VALUE_READS = {"item", "tolist", "numpy"}
SHAPE_ATTRS = {"shape", "ndim", "dtype", "device", "is_floating_point"}
SHAPE_CALLS = {"size", "dim", "numel", "isinstance", "len"}
# Python calls in forward run once, at export, and are frozen into the graph (or break torch.compile).
# (inspect is not among them: a signature look-up is a constant of the code, as a trace resolves it.)
FROZEN_MODULES = {"re": "a regex", "time": "the clock", "platform": "the platform", "sys": "sys"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    severity: str  # "error" stops a build; "warning" does not
    check: str
    message: str
    fix: str

    def format(self) -> str:
        return f"{self.path}:{self.line}: {self.severity} [{self.check}] {self.message}\n    fix: {self.fix}"


def _user_classes(module: torch.nn.Module) -> list[type[torch.nn.Module]]:
    seen: dict[type[torch.nn.Module], None] = {}
    for sub in module.modules():
        cls = type(sub)
        if not cls.__module__.startswith("torch.") and "forward" in vars(cls):
            seen.setdefault(cls, None)
    return list(seen)


def _forward_function(cls: type[torch.nn.Module]) -> Any:
    """A function, or what a decorator left of one (read by its __code__ where it has one)."""
    return inspect.unwrap(cls.forward)  # a decorator's wrapper lives in the decorator's file


def _parse_forward(cls: type[torch.nn.Module]) -> tuple[ast.FunctionDef, str, int] | None:
    forward = _forward_function(cls)
    try:
        lines, start = inspect.getsourcelines(forward)
        path = inspect.getsourcefile(forward) or "?"
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0]
    return (node, path, start - 1) if isinstance(node, ast.FunctionDef) else None


class _ForwardVisitor(ast.NodeVisitor):
    def __init__(self, path: str, offset: int, params: set[str]) -> None:
        self.path, self.offset, self.params = path, offset, params
        self.findings: list[Finding] = []
        self.spans: list[tuple[int, int]] = []  # per finding, the lines of the code it is about

    def add(
        self,
        node: ast.stmt | ast.expr,
        severity: str,
        check: str,
        message: str,
        fix: str,
        span: ast.stmt | ast.expr | None = None,
    ) -> None:
        self.findings.append(Finding(self.path, node.lineno + self.offset, severity, check, message, fix))
        span = span or node
        self.spans.append((span.lineno + self.offset, (span.end_lineno or span.lineno) + self.offset))

    def _self_target(self, target: ast.expr) -> str | None:
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                return target.attr
            target = target.value
        return None

    def _check_write(self, node: ast.stmt, targets: list[ast.expr]) -> None:
        for target in targets:
            name = self._self_target(target)
            if name:
                self.add(
                    node,
                    "error",
                    SELF_WRITE.name,
                    f"forward writes self.{name}",
                    "keep state outside the model: return the value and let the caller keep it",
                )

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_write(node, node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_write(node, [node.target])
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_write(node, [node.target])
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
        ):
            self.add(
                node, "error", SELF_WRITE.name, "forward calls setattr(self, ...)", "set attributes in __init__ only"
            )
        if isinstance(func, ast.Attribute):
            owner = self._self_target(func.value) if isinstance(func.value, (ast.Attribute, ast.Subscript)) else None
            if owner and func.attr.endswith("_") and not func.attr.startswith("_"):
                self.add(
                    node,
                    "error",
                    SELF_WRITE.name,
                    f"forward changes self.{owner} in place ({func.attr}())",
                    "compute a new tensor instead of updating a parameter or buffer",
                )
            if func.attr in VALUE_READS:
                self.add(
                    node,
                    "error",
                    DATA_DEPENDENT.name,
                    f".{func.attr}() reads a tensor's value into Python",
                    "keep values as tensors; a Python number from a tensor is frozen at export or fails it",
                )
            root = func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in FROZEN_MODULES:
                self.add(
                    node,
                    "error",
                    GRAPH_BREAK.name,
                    f"{root.id}.{func.attr}() uses {FROZEN_MODULES[root.id]} in forward",
                    "do it in __init__: it breaks torch.compile graphs and is evaluated only once at export",
                )
            if isinstance(root, ast.Name) and root.id in {"logging", "log", "logger"}:
                self.add(
                    node,
                    "warning",
                    "side-effect",
                    "logging in forward",
                    "remove it: it runs once at export, never in the compiled model",
                )
        if isinstance(func, ast.Name) and func.id == "print":
            self.add(
                node,
                "warning",
                "side-effect",
                "print() in forward",
                "remove it: it runs once at export, never in the compiled model",
            )
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in {"__version__", "version_info"}:
            self.add(
                node,
                "error",
                VERSION_CHECK.name,
                f"forward reads {ast.unparse(node)}",
                "decide version-dependent behaviour in __init__",
            )
        self.generic_visit(node)

    def _reads_value(self, test: ast.AST) -> bool:
        """Whether a condition uses a forward argument other than through its shape or type."""
        if isinstance(test, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops):
            return False
        static: set[int] = set()
        for node in ast.walk(test):
            if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                static.update(id(inner) for inner in ast.walk(node))  # `mask is not None`: a Python fact
            called = node.func if isinstance(node, ast.Call) else None
            call_name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)
            if (isinstance(node, ast.Attribute) and node.attr in SHAPE_ATTRS) or call_name in SHAPE_CALLS:
                static.update(id(inner) for inner in ast.walk(node))
        return any(isinstance(n, ast.Name) and n.id in self.params and id(n) not in static for n in ast.walk(test))

    def _check_branch(self, node: ast.If | ast.While | ast.IfExp) -> None:
        if self._reads_value(node.test):
            self.add(
                node,
                "error",
                DATA_DEPENDENT.name,
                f"`{ast.unparse(node.test)}` branches on a tensor value",
                "use torch.where(cond, a, b), or torch.cond for whole branches",
                span=node.test,
            )

    def visit_If(self, node: ast.If) -> None:
        self._check_branch(node)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._check_branch(node)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._check_branch(node)
        self.generic_visit(node)


def _signature_findings(func: ast.FunctionDef, path: str, offset: int) -> list[Finding]:
    findings = []
    line = func.lineno + offset
    args = func.args
    starred = args.vararg or args.kwarg
    if starred:
        star = ("*" if args.vararg else "**") + starred.arg
        findings.append(
            Finding(
                path,
                line,
                "error",
                ARGS_VARIADIC.name,
                f"forward takes {star}",
                "give forward one named tensor parameter per input",
            )
        )
    with_defaults = args.args[len(args.args) - len(args.defaults) :] if args.defaults else []
    for arg in with_defaults + [a for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]:
        findings.append(
            Finding(
                path,
                line,
                "error",
                ARGS_OPTIONAL.name,
                f"forward parameter {arg.arg!r} is optional",
                "remove the default; decide optional behaviour in __init__",
            )
        )
    for arg in args.args[1:] + args.kwonlyargs:
        if arg.annotation is not None and "Tensor" not in ast.unparse(arg.annotation):
            findings.append(
                Finding(
                    path,
                    line,
                    "error",
                    ARGS_NON_TENSOR.name,
                    f"forward parameter {arg.arg!r} is annotated {ast.unparse(arg.annotation)}, not a tensor",
                    "pass tensors only; make other settings constructor arguments",
                )
            )
    return findings


def traced_runs(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict | None:
    """What one eager forward did, per forward's code (None when it raised)."""
    forwards = [f for f in map(_forward_function, _user_classes(module)) if hasattr(f, "__code__")]
    return trace_forwards(module, inputs, forwards)


def static_findings(module: torch.nn.Module, runs: dict | None = None) -> list[Finding]:
    """Source findings of every forward; with ``runs`` (traced_runs()), only on lines that ran, and
    for branches only on parameters that held a tensor there."""
    findings = []
    for index, cls in enumerate(_user_classes(module)):
        parsed = _parse_forward(cls)
        if parsed is None:
            continue
        func, path, offset = parsed
        if index == 0 and cls is type(module):  # the top-level signature is the compiled model's signature
            findings += _signature_findings(func, path, offset)
        run: ForwardRun | None = None
        if runs is not None:
            run = runs.get(getattr(_forward_function(cls), "__code__", None), ForwardRun())
        params = {a.arg for a in [*func.args.args[1:], *func.args.kwonlyargs, func.args.vararg, func.args.kwarg] if a}
        visitor = _ForwardVisitor(path, offset, params if run is None else params & run.tensor_params)
        for statement in func.body:
            visitor.visit(statement)
        findings += [f for f, span in zip(visitor.findings, visitor.spans) if run is None or run.ran_any(*span)]
    return findings
