"""Stage 2: AOTInductor compiles the exported program into a .so at its absolute output path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import targets
from ..errors import CompileError, SpecError, ToolchainError
from ..services import cache, proc
from ..wheel_template.runtime import _weights as wheel_weights
from . import constants, precision, same_bytes
from .export import Exported
from .loader import forward_arguments, weight_tensors

LIBRARY_NAME = "model.so"
INDUCTOR_LOG = "inductor.log"  # in the candidate's work folder


@dataclass(frozen=True)
class Compiled:
    target: str
    output_dir: Path
    library: Path
    artifacts: tuple[Path, ...]
    sources_dir: Path
    options: dict[str, object] = field(hash=False)
    cache_key: str
    from_cache: bool
    constants: Path | None = None  # the folder of its constants store (static sizes, embedded weights: constants.py)
    debug_info: str = "kept"  # "stripped": the shipped .so files hold no debug sections (strip --strip-debug)


def find_cxx() -> str:
    """The C++ compiler Inductor will use (``CXX`` or g++), checked to run; returns its version line."""
    compiler = os.environ.get("CXX", "g++")
    version = proc.run(
        [compiler, "--version"],
        error=ToolchainError,
        what=f"C++ compiler check ({compiler})",
        hint="AOTInductor needs a C++ compiler: install g++ (apt-get install g++) or set CXX to one",
    )
    return (version.splitlines() or [compiler])[0]


def find_strip() -> str:
    """The ``strip`` that removes the .so files' debug info (``STRIP`` or strip), checked to run."""
    tool = os.environ.get("STRIP", "strip")
    proc.run([tool, "--version"], error=ToolchainError, what=f"strip check ({tool})", hint=STRIP_HINT)
    return tool


STRIP_HINT = (
    "the build strips debug info from the shipped .so with binutils' strip: install it (apt-get install binutils) "
    "or set STRIP to one, or build with --keep-debug to ship the .so as compiled"
)


def strip_debug(libraries: list[Path]) -> None:
    """Remove debug sections in place (a quarter of the size of the tiny .so is what is left);
    the code, symbols and embedded weights are untouched."""
    if libraries:
        tool = os.environ.get("STRIP", "strip")
        proc.run(
            [tool, "--strip-debug", *map(str, libraries)],
            error=ToolchainError,
            what=f"stripping debug info ({tool})",
            hint=STRIP_HINT,
        )


def inductor_options(exported: Exported) -> dict[str, object]:
    """The spec's compile options as torch._inductor.config settings (the output path is added per compile)."""
    spec_file = exported.spec_file
    compile_spec = spec_file.spec.compile
    options: dict[str, object] = {"freezing": compile_spec.freezing, "max_autotune": compile_spec.max_autotune}
    options.update(exported.target.compile_options(spec_file.spec))
    if compile_spec.autocast:
        options[precision.AUTOCAST_OPTION] = compile_spec.autocast
    if spec_file.spec.weights.external:
        # Weights stay out of the .so and every parameter stays a swappable constant: what
        # compile would fold from them is folded again at run time from the loaded weights.
        options["aot_inductor.package_constants_in_so"] = False
        options["aot_inductor.use_runtime_constant_folding"] = True
    elif constants.shared(exported.target, spec_file.spec):
        # The build's models share one store of their constants, made from what each compile folds.
        options[constants.OPTION] = False
    known = torch._inductor.config.get_config_copy()
    for key, value in compile_spec.inductor.items():
        if key not in known:
            raise SpecError(
                f"{spec_file.path}: key 'compile.inductor.{key}': not an option of torch._inductor.config",
                "see torch/_inductor/config.py for the option names",
            )
        options[key] = value
    return options


def _move_sources(output_dir: Path, sources_dir: Path, target: str, options: dict) -> tuple[Path, ...]:
    """Keep only what ships (the .so, kernels) in the output folder; move generated sources aside."""
    shutil.rmtree(sources_dir, ignore_errors=True)
    sources_dir.mkdir(parents=True)
    shipped = []
    for entry in sorted(output_dir.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and targets.get(target).ships(entry, options):
            shipped.append(entry)
        else:
            shutil.move(str(entry), sources_dir / entry.name)
    return tuple(shipped)


@dataclass(frozen=True)
class CompilePlan:
    """What a compile would use, known before exporting: its options, folder and cache key."""

    target: str
    options: dict[str, object] = field(hash=False)  # without the output path
    compile_dir: Path  # where AOTInductor writes: the .so may record this path
    key: str
    cxx_version: str
    overrides: dict[str, object] = field(hash=False)  # the candidate's options beyond the spec's
    # Not in the key: the cache keeps the .so as AOTInductor wrote it, each copy taken out is stripped.
    keep_debug: bool = False


def plan_compile(
    exported: Exported,
    cxx_version: str,
    compile_dir: Path,
    overrides: dict[str, object] | None = None,
    keep_debug: bool = False,
) -> CompilePlan:
    """``cxx_version``: find_cxx()'s answer, part of the cache key (the compiler shapes the .so)."""
    options = {**inductor_options(exported), **(overrides or {})}
    target = exported.target.NAME
    spec = exported.spec_file.spec
    weights_key = (
        json.dumps(wheel_weights.describe(weight_tensors(exported.module)))
        if spec.weights.external
        else exported.weights_sha256
    )
    key = cache.compile_key(
        # An output's name, not its tolerances (verification's, not the compiler's): a build
        # that loosens a tolerance after a failed verification reuses the .so and verifies again.
        spec_json=spec.model_dump_json(
            include={
                "model": {"factory", "kwargs"},
                "dims": True,
                "inputs": True,
                "outputs": {"__all__": {"name"}},
                "compile": True,
            },
            exclude={"compile": set(spec.compile.SEARCH_KEYS)},
        ),
        sources_sha256=exported.sources_sha256,
        weights_key=weights_key,
        options=options,
        target=target,
        cxx_version=cxx_version,
        target_facts=exported.target.key_facts(compile_dir),
    )
    return CompilePlan(
        target=target,
        options=options,
        compile_dir=compile_dir,
        key=key,
        cxx_version=cxx_version,
        overrides=dict(overrides or {}),
        keep_debug=keep_debug,
    )


def plan_in(exported: Exported, plan: CompilePlan, compile_dir: Path) -> CompilePlan:
    """The same compile, in another folder."""
    return plan_compile(exported, plan.cxx_version, compile_dir, plan.overrides, plan.keep_debug)


def compile_model(exported: Exported, plan: CompilePlan, work_dir: Path, store: cache.Cache) -> Compiled:
    """The .so (in ``plan.compile_dir``) from the cache when it has the plan's key, else from
    AOTInductor (then cached). Stripped of debug info unless ``plan.keep_debug``, before anything
    opens or hashes it: what is verified and timed is what ships."""
    output_dir = plan.compile_dir
    library = output_dir / LIBRARY_NAME
    restored = store.restore(plan.key, output_dir)
    if restored is None:
        if exported.program is None:
            raise CompileError("no exported program to compile", "report this: export must run on a cache miss")
        options = {**plan.options, "aot_inductor.output_path": str(library)}
        artifacts = _aot_compile(exported, plan.target, options, work_dir, library)
        store.store(plan.key, artifacts)
    files = restored or artifacts
    if not plan.keep_debug:
        strip_debug([path for path in files if path.suffix == ".so"])
    constant_files = [path for path in files if path.name in (constants.INDEX_FILE, constants.BLOB_FILE)]
    return Compiled(
        target=plan.target,
        output_dir=output_dir,
        library=library,
        artifacts=tuple(path for path in files if path not in constant_files),
        constants=output_dir if constant_files else None,
        sources_dir=work_dir / "sources",
        options=plan.options,
        cache_key=plan.key,
        from_cache=restored is not None,
        debug_info="kept" if plan.keep_debug else "stripped",
    )


# Where a compile sees torch's headers and libraries (a link beside the .so it compiles, removed
# after), and what it writes for their paths (__FILE__ in the runtime's error messages).
TORCH_ALIAS = ".torch"
TORCH_PATH_IN_LIBRARY = "torch"
COMPILE_FOLDER = "<compile folder>"  # the folder, as the hash of the sources' names sees it


@contextlib.contextmanager
def torch_seen_at(compile_dir: Path) -> Iterator[None]:
    """Inductor compiles against torch at ``compile_dir/.torch``, a link to this torch, and
    writes ``torch`` for that path: the .so holds no path of the venv that built it. Torch's
    path was in it twice: in the headers' __FILE__ strings, and in the generated sources' names
    (a hash of the compiler's command line, with its -I and -L), which the .so keeps. So the same
    commit built in another folder (every job of a release run under act has a random one) made
    other bytes; the compile folder is the same in every build of a model version.
    The compile folder itself is kept out the same way (H48: a new version's build took its .so from
    the build cache, compiled under the older version's folder, and `reproduce`, compiling under
    the new one, made other bytes): the sources' names hash the command line with that folder
    written as a placeholder, and __FILE__ strings have it mapped to ".".
    Private hooks, like constants.captured(): a torch without them is named in the error."""
    from torch._inductor import codecache, config, cpp_builder
    from torch.utils import cpp_extension

    original = cpp_builder.__dict__.get("_get_optimization_cflags")
    original_write = codecache.__dict__.get("write")
    if (
        original is None
        or original_write is None
        or not hasattr(cpp_extension, "_TORCH_PATH")
        or not hasattr(cpp_extension, "TORCH_LIB_PATH")
    ):
        raise CompileError(
            f"cannot keep torch's install path out of the compiled model with torch {torch.__version__} "
            "(torch._inductor.cpp_builder._get_optimization_cflags, torch._inductor.codecache.write or "
            "torch.utils.cpp_extension's _TORCH_PATH is gone): its wheels would not be reproducible",
            "build with a torch this pipeline supports (2.11 to 2.14)",
        )
    real = cpp_extension._TORCH_PATH
    alias = compile_dir / TORCH_ALIAS
    compile_dir.mkdir(parents=True, exist_ok=True)
    alias.unlink(missing_ok=True)
    alias.symlink_to(real, target_is_directory=True)
    # Only the link's path: the real one in a flag would put it in the sources' names again. A
    # path with a space would split the compiler's command line (Inductor joins flags with spaces).
    # The folder's map first: GCC takes the last map that matches, so torch's own is said as torch.
    # (as given, and resolved: /tmp is a link on some machines)
    folders = sorted({str(compile_dir), str(compile_dir.resolve())}, key=len)
    maps = [f"ffile-prefix-map={folder}=." for folder in folders]
    maps.append(f"ffile-prefix-map={alias}={TORCH_PATH_IN_LIBRARY}")
    flags = [] if any(c.isspace() for c in str(alias) + "".join(folders)) else maps

    def with_map(*args: Any, **kwargs: Any) -> tuple[list[str], list[str]]:
        cflags, ldflags = original(*args, **kwargs)
        return [*cflags, *flags], ldflags

    def left_out(text: str) -> str:
        for folder in reversed(folders):  # the longer first: one may hold the other
            text = text.replace(folder, COMPILE_FOLDER)
        return text

    def write(content: str | bytes, extension: str, extra: str = "", *args: Any, **kwargs: Any) -> Any:
        # the sources' names: a hash of their code and this command line, the compile folder left out
        # of both; of the code, only from a first line that is a comment (the kernels' file names the
        # wrapper's path there), never from code that may use the folder (nor from a binary kernel)
        if isinstance(content, str):
            first, newline, rest = content.partition("\n")
            if first.startswith("//"):
                content = left_out(first) + newline + rest
        return original_write(content, extension, left_out(extra), *args, **kwargs)

    # Inductor keys its precompiled headers by the compiler's command line, which names this link,
    # so every compile folder (each model version, each search candidate) made its own: two
    # headers, 12.5 s of CPU on a 2-core machine, against the 2.6 s one saves the wrapper's compile.
    no_headers = (
        {"aot_inductor.precompile_headers": False} if hasattr(config.aot_inductor, "precompile_headers") else {}
    )
    saved = (cpp_extension._TORCH_PATH, cpp_extension.TORCH_LIB_PATH)
    cpp_builder._get_optimization_cflags = with_map
    codecache.write = write
    cpp_extension._TORCH_PATH, cpp_extension.TORCH_LIB_PATH = str(alias), str(alias / "lib")
    try:
        with config.patch(no_headers):
            yield
    finally:
        cpp_builder._get_optimization_cflags = original
        codecache.write = original_write
        cpp_extension._TORCH_PATH, cpp_extension.TORCH_LIB_PATH = saved
        alias.unlink(missing_ok=True)


def _aot_compile(exported: Exported, target: str, options: dict, work_dir: Path, library: Path) -> tuple[Path, ...]:
    output_dir = library.parent
    sources_dir = work_dir / "sources"
    autocast, options = precision.split_options(options)
    program = precision.export_autocast(exported, autocast) if autocast else exported.program
    assert program is not None  # compile_model compiles only with an exported program
    # The autocast wrapper takes every input by position; the model itself, as it was exported.
    args, kwargs = (
        (exported.example_inputs, {}) if autocast else forward_arguments(exported.module, exported.example_inputs)
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    # Inductor prints to stderr itself (max-autotune's AUTOTUNE tables): keep that in the log.
    capture = options.get(constants.OPTION) is False and not exported.spec_file.spec.weights.external
    capturing: contextlib.AbstractContextManager[dict[str, torch.Tensor]] = (
        constants.captured() if capture else contextlib.nullcontext({})
    )
    try:
        with (
            (work_dir / INDUCTOR_LOG).open("a") as log,
            contextlib.redirect_stderr(log),
            contextlib.redirect_stdout(log),
            torch.no_grad(),
            torch_seen_at(output_dir),
            same_bytes.op_names_without_addresses(),
            same_bytes.mkldnn_metadata_without_padding(),
            capturing as captured,
        ):
            produced = torch._inductor.aot_compile(
                program.module(), args, kwargs, options={**options, **targets.get(target).graph_passes(options)}
            )
    except Exception as exc:  # Inductor's failures come in many types; all mean "did not compile"
        if type(exc).__name__ == "InvalidCxxCompiler":
            raise ToolchainError(f"AOTInductor found no working C++ compiler: {exc}", "install g++ or set CXX") from exc
        _move_sources(output_dir, sources_dir, target, options)
        lines = str(exc).strip().splitlines()
        raise CompileError(
            f"AOTInductor failed: {type(exc).__name__}: " + "\n".join(lines[-15:]),
            f"the generated sources are kept in {sources_dir}, Inductor's own output in {work_dir / INDUCTOR_LOG} "
            f"and the compile trace in {os.environ.get('TORCH_TRACE', 'build/<model>/trace')}; "
            "run with --verbose for the full traceback",
        ) from exc
    if not isinstance(produced, str) or Path(produced) != library or not library.is_file():
        raise CompileError(
            f"AOTInductor wrote {produced}, expected {library}", "report this: the torch version may be unsupported"
        )
    shipped = _move_sources(output_dir, sources_dir, target, options)
    if not capture:
        return shipped
    writer = constants.Writer()
    writer.add(library.name, captured, targets.get(target))
    return shipped + writer.write(output_dir)
