"""Every failure the pipeline reports to a user: one class per kind, each with its exit code.

Only the CLI catches these; it prints ``error: <message>`` and ``hint: <hint>``.
"""

from __future__ import annotations

from .doctor_checks import PURITY


class PipelineError(Exception):
    """Base class: a message saying what is wrong and where, plus a hint saying how to fix it."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(PipelineError):
    exit_code = 2
    kind = "usage"


class SpecError(PipelineError):
    """The model spec (TOML) is missing, malformed or names something that does not exist."""

    exit_code = 3
    kind = "spec"


class ModelLoadError(PipelineError):
    """The module factory or weights named by a valid spec could not be loaded."""

    exit_code = 4
    kind = "model"


class ExportError(PipelineError):
    """torch.export could not capture the module's forward."""

    exit_code = 5
    kind = "export"


class ToolchainError(PipelineError):
    """A tool the compile stage needs (a C++ compiler) is missing or broken."""

    exit_code = 6
    kind = "toolchain"


class CompileError(PipelineError):
    """AOTInductor failed to compile the exported program."""

    exit_code = 7
    kind = "compile"


class VerificationError(PipelineError):
    """The compiled model's outputs are outside tolerance of eager PyTorch."""

    exit_code = 8
    kind = "verify"


class NoSignalError(PipelineError):
    """Verification could tell nothing: an output is the same for every seeded input (within its
    tolerance), or an input changes no output (pipeline/stages/signal_check.py)."""

    exit_code = 27
    kind = "no-signal"


class NotReproducedError(PipelineError):
    """``reproduce``: a rebuild from the wheel's source and records gave other bytes."""

    exit_code = 28
    kind = "not-reproduced"


class PackageError(PipelineError):
    """The wheel could not be built."""

    exit_code = 9
    kind = "package"


class OutputDirError(PipelineError):
    """The versioned output folder under the artifact root cannot be created or is in use."""

    exit_code = 10
    kind = "output"


class DoctorError(PipelineError):
    """The module breaks a practice that compilation depends on (found by `pipeline doctor`).

    Each check has its own exit code (doctor_checks.py); with several problems, the code of the
    first in that table's order.
    """

    exit_code = 11
    kind = "doctor"

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code or DoctorError.exit_code


class PurityError(PipelineError):
    """forward wrote state or gave different outputs for the same input."""

    exit_code = PURITY.exit_code
    kind = "purity"
    check = PURITY.name  # its [doctor] allow key: findings become warnings


class IndexServerError(PipelineError):
    """The package index cannot be started, found or reached."""

    exit_code = 13
    kind = "index"


class AlreadyPublishedError(PipelineError):
    """Every wheel asked for is already on the index; nothing was uploaded."""

    exit_code = 14
    kind = "exists"


class UnverifiedWheelError(PipelineError):
    """A wheel lacks a passed verification, or its files differ from its manifest."""

    exit_code = 15
    kind = "unverified"


class UploadError(PipelineError):
    """twine check or twine upload failed."""

    exit_code = 16
    kind = "upload"


class TargetUnavailableError(PipelineError):
    """The spec asks for a target this machine cannot build (a CUDA target without a GPU, say)."""

    exit_code = 17
    kind = "target"


class CheckpointError(PipelineError):
    """A save_pretrained folder (--hf, [model] hf) is missing, incomplete, not safetensors, or does
    not fit the task asked for."""

    exit_code = 18
    kind = "checkpoint"


class UnsupportedTaskError(PipelineError):
    """--task names a task the build does not know for checkpoint folders; the hint shows the wrapper to write."""

    exit_code = 19
    kind = "task"


class BuildInterrupted(PipelineError):
    """The build was stopped by SIGINT or SIGTERM; the message says what it kept (its work files under build/)."""

    exit_code = 130
    kind = "interrupted"
