"""A spec's factory imported from beside the spec (model.factory, 'package.module:callable'), and
the errors a model's import or call raises, each naming the spec's key, the user's file:line and
the fix: a missing package (with its pip name), the standard library named as a model, a package
named `pipeline`. loader.py calls the factory.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..spec import SpecFile

# transformers' and diffusers' requires_backends(): "X requires the scipy library but it was not found ..."
REQUIRES_BACKEND = re.compile(r"requires the (\S+) library but it was not found")
PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "pillow", "cv2": "opencv-python", "yaml": "pyyaml"}


def where_raised(exc: BaseException) -> str:
    """``file:line`` in the user's code where ``exc`` arose (a SyntaxError's own position first)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen ")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}" + (f": {exc.text.strip()}" if exc.text else "")
    return f"{type(exc).__name__}: {exc}"


def import_roots(spec_dir: Path, module_name: str) -> list[str]:
    """Where the factory's module is imported from: the spec's folder (specs that live anywhere keep
    their code beside them) and, where the spec sits in the package its dotted name names
    (models/unet/spec.toml naming models.unet.model), the folder that package starts in. Never the
    current directory (pipeline/__main__.py drops the one `python -m` adds): `modelwheel doctor unet`
    in the checkout could not import models.unet.model where `python -m pipeline` could."""
    package = module_name.split(".")[:-1]
    roots = [str(spec_dir)]
    if package and spec_dir.parts[-len(package) :] == tuple(package):
        roots.append(str(spec_dir.parents[len(package) - 1]))
    return roots


def _forget_another_copy(module_name: str, roots: list[str]) -> None:
    """A module of this name imported before in this process from elsewhere, where this spec's folder
    holds its own: dropped, so this spec's is imported, not the other's (two specs loaded in one
    process, each with a tiny_model.py beside it, got the first one's). A package installed
    elsewhere, with no copy beside the spec, is left as it is."""
    top = module_name.split(".")[0]
    cached = sys.modules.get(top)
    if cached is None:
        return
    where = getattr(cached, "__file__", None) or next(iter(getattr(cached, "__path__", None) or ()), None)
    if where and any(Path(where).resolve().is_relative_to(root) for root in roots):
        return
    if not any((Path(root) / f"{top}.py").is_file() or (Path(root) / top).is_dir() for root in roots):
        return
    for name in [name for name in sys.modules if name == top or name.startswith(f"{top}.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def import_factory(spec_file: SpecFile, named: str) -> Callable[..., Any]:
    """``named`` (the spec's model.factory, 'package.module:callable') imported from beside the spec."""
    module_name, _, attr = named.partition(":")
    roots = import_roots(spec_file.path.parent.resolve(), module_name)
    for root in reversed(roots):
        if root not in sys.path:
            sys.path.insert(0, root)
    _forget_another_copy(module_name, roots)
    spec_dir = str(spec_file.path.parent)
    key = f"{spec_file.path}: key 'model.factory'"
    _refuse_a_second_pipeline(key, module_name, Path(spec_dir))
    if module_name.split(".")[0] in sys.stdlib_module_names:  # before importing or calling anything of it
        raise ModelLoadError(
            f"{key}: {spec_file.spec.model.factory!r} is from Python's standard library, not a model: a spec's factory "
            "is called by the build, so it must be your model's own function or nn.Module class",
            "name the function or class that builds your model (package.module:callable); a spec is code: build "
            "only specs you trust",
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and module_name != missing and not module_name.startswith(missing + "."):  # imported by it
            raise _import_failed(key, module_name, exc) from exc
        raise ModelLoadError(
            f"{key}: cannot import module {module_name!r}: {exc}",
            f"put {module_name.replace('.', '/')}.py beside the spec (in {spec_dir}) or, for a dotted name, the "
            "spec in its package (models/unet/spec.toml names models.unet.model), or install the module into the "
            "Python that runs modelwheel",
        ) from exc
    except (Exception, SystemExit) as exc:  # the module's own top-level code can raise anything
        raise _import_failed(key, module_name, exc) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelLoadError(
            f"{key}: module {module_name!r} has no callable {attr!r}",
            "name a function or nn.Module class that builds the model",
        )
    if inspect.isbuiltin(factory) or not (
        inspect.isfunction(factory)
        or inspect.ismethod(factory)
        or (inspect.isclass(factory) and issubclass(factory, torch.nn.Module))
    ):
        raise ModelLoadError(
            f"{key}: {module_name}:{attr} is a {type(factory).__name__}, not a Python function or nn.Module class",
            "name a function (def build(...)) or an nn.Module subclass that builds the model",
        )
    # One the standard library defines, reached through another module that imported it (a package
    # doing `from subprocess import check_output`): as refused as naming it in its own module.
    defined_in = getattr(getattr(factory, "__func__", factory), "__module__", None) or ""
    if defined_in.split(".")[0] in sys.stdlib_module_names:
        raise ModelLoadError(
            f"{key}: {module_name}:{attr} is {defined_in}.{getattr(factory, '__qualname__', attr)} from Python's "
            "standard library, not a model: a spec's factory is called by the build, so it must be your model's "
            "own function or nn.Module class",
            "name the function or class that builds your model (package.module:callable); a spec is code: build "
            "only specs you trust",
        )
    return factory


def _refuse_a_second_pipeline(key: str, module_name: str, spec_dir: Path) -> None:
    """``pipeline`` is this tool's own import name and is already imported: a package of the
    user's by that name (beside the spec, or the factory's own) would never be the one loaded."""
    theirs = [p for p in (spec_dir / "pipeline", spec_dir / "pipeline.py") if p.exists()]
    if module_name.split(".")[0] == "pipeline" or theirs:
        where = theirs[0] if theirs else f"module {module_name!r}"
        raise ModelLoadError(
            f"{key}: {where} is named `pipeline`, which is modelwheel's own import package: Python would give your "
            "model code modelwheel's `pipeline`, not yours",
            "rename your package (or move the model's code into a folder of another name); see README.md, "
            '"A package of your own named pipeline"',
        )


def missing_package(exc: BaseException | None) -> str | None:
    """The import name of the package whose absence raised ``exc`` (or its ``raise … from`` cause),
    or None. Not ``__context__``: libraries raise unrelated errors while handling an ImportError."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name.split(".")[0]
        found = REQUIRES_BACKEND.search(str(exc)) if isinstance(exc, ImportError) else None
        if found:
            return found.group(1)
        exc = exc.__cause__
    return None


def factory_hint(exc: Exception, has_kwargs: bool) -> str:
    """A TypeError at the call is most often a kwarg the factory does not take; anything else is
    the factory's own error, at the line the message gives."""
    if not has_kwargs:
        return (
            "the factory was called with no arguments (the spec has no [model.kwargs]): fix the error at the line given"
        )
    if isinstance(exc, TypeError):
        return "check model.kwargs against the factory's parameters"
    return "fix the error at the line given (the factory was called with the spec's [model.kwargs])"


def missing_package_error(what: str, package: str, exc: BaseException) -> ModelLoadError:
    where = where_raised(exc)
    said = " ".join(str(exc).split())[:300]
    return ModelLoadError(
        f"{what} needs the package {package!r}, which is not installed in this Python ({sys.executable})"
        f"{f' (at {where})' if where else ''}: {type(exc).__name__}: {said}",
        f"install it where the build runs: pip install {PIP_NAMES.get(package, package)} (a library often needs a "
        "package only for a part of the model, e.g. a loss: if you do not use that part, build the model without it)",
    )


def _import_failed(key: str, module_name: str, exc: BaseException) -> ModelLoadError:
    package = missing_package(exc)
    if package:
        return missing_package_error(f"{key}: importing module {module_name!r}", package, exc)
    where = where_raised(exc)
    return ModelLoadError(
        f"{key}: importing module {module_name!r} failed{f' at {where}' if where else ''}: {describe(exc)}",
        "fix the model's code at the line given (python -c 'import " + module_name + "' shows the same error)",
    )
