"""Inductor's vector-ISA probes, remembered per user, compiler, torch, Python and CPU.

Before it compiles anything for a CPU, Inductor checks each vector instruction set the CPU lists
(and AVX-512's bfloat16 and VNNI extensions): it compiles a probe library (kept in its cache) and
loads it in a fresh Python process, six of them on an AVX-512 machine, 1.3 CPU-s in every build
process (9.5 s where the cache is new). A probe that passed before, in this user's own Inductor
cache, with the same compiler, torch, Python and CPU, is not run again: the build answers it from
a record beside the probe libraries. A probe that failed is never recorded, so it runs each time,
as torch runs it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..services.outdir import inductor_cache
from ..wheel_template.runtime import _trust as wheel_trust

RECORD = "modelwheel-vec-isa.json"  # in Inductor's cache folder, beside the probe libraries
_ANSWERS = "_modelwheel_answers"  # marks Inductor's probe once it answers from the record


def remember_probes() -> None:
    """From now on in this process, Inductor's ISA probes that passed before are answered from
    the record, and those that pass are added to it."""
    from torch._inductor import cpu_vec_isa

    probe = getattr(cpu_vec_isa.VecISA, "check_build", None)  # torch's, 2.11 to 2.14; another may differ
    if probe is not None and not getattr(probe, _ANSWERS, False):
        cpu_vec_isa.VecISA.check_build = _answering(probe)  # type: ignore[method-assign,assignment]


def _answering(probe: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    @functools.wraps(probe)
    def check_build(isa: Any, code: str) -> bool:
        record = _record_file()
        if record is None:
            return probe(isa, code)
        flags = isa.build_arch_flags() if hasattr(isa, "build_arch_flags") else getattr(isa, "_arch_flags", "")
        key = _probe_key(str(isa), flags, code)
        if key in _read(record):
            return True
        passed = probe(isa, code)
        if passed:
            _remember(record, key)
        return passed

    setattr(check_build, _ANSWERS, True)
    return check_build


def _probe_key(isa: str, flags: str, code: str) -> str:
    return hashlib.sha256(json.dumps([_machine_facts(), isa, flags, code]).encode()).hexdigest()


@functools.cache
def _machine_facts() -> list[Any]:
    """What a probe's outcome depends on beyond its own code and flags: the compiler (which file,
    which build of it), torch's headers and build, the Python that loads it, the CPU's flags."""
    import torch
    from torch._inductor import cpp_builder, cpu_vec_isa

    compiler = shutil.which(cpp_builder.get_cpp_compiler()) or cpp_builder.get_cpp_compiler()
    try:
        found = os.stat(compiler)
        compiler_file: list[Any] = [os.path.realpath(compiler), found.st_size, found.st_mtime_ns]
    except OSError:
        compiler_file = [compiler]
    return [compiler_file, torch.__version__, torch.__file__, sys.executable, sorted(cpu_vec_isa.x86_isa_checker())]


def _record_file() -> Path | None:
    """The record in Inductor's cache, only where no other user can write that folder (a passed
    probe they wrote would have the build compile for instructions nothing checked)."""
    folder = inductor_cache()
    if not folder.is_dir() or wheel_trust.chain_problem(folder, private=True):
        return None
    return folder / RECORD


def _read(record: Path) -> dict[str, bool]:
    try:
        found = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or cut short: probe again
    return found if isinstance(found, dict) else {}


def _remember(record: Path, key: str) -> None:
    """Whole or not at all (another build may read it at the same moment); a folder that cannot be
    written only means the next build probes again."""
    staged = record.with_name(f".{RECORD}.{os.getpid()}")
    try:
        staged.write_text(json.dumps({**_read(record), key: True}, sort_keys=True))
        staged.chmod(0o644)
        os.replace(staged, record)
    except OSError:
        staged.unlink(missing_ok=True)
