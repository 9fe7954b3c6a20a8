"""Inductor's vector-ISA probe, remembered per user, compiler, torch and CPU.

Before it compiles anything for a CPU, Inductor checks each vector instruction set the CPU lists:
it compiles a probe library (kept in its cache) and loads it in a fresh Python process, six of them
in all on an AVX-512 machine, 1.3 CPU-s in every build process (9.5 s where the cache is new).
Where every probe passed before, in this user's own Inductor cache, with the same compiler, torch,
Python and CPU, the build tells Inductor so (its own setting, ``cpp.vec_isa_ok``) instead of asking
again. A probe that ever failed is never recorded, so such a machine keeps probing, as torch does.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from ..services.outdir import inductor_cache
from ..wheel_template.runtime import _trust as wheel_trust

RECORD = "modelwheel-vec-isa.json"  # in Inductor's cache folder, beside the probe libraries


def trust_earlier_probes() -> None:
    """Tell Inductor every vector ISA this CPU lists builds and loads, where that was seen before;
    otherwise let it probe, and remember the answer when every probe passed."""
    from torch._inductor import config, cpu_vec_isa

    if config.cpp.vec_isa_ok is not None or platform.machine() not in ("x86_64", "AMD64"):
        return  # the user's own setting (TORCHINDUCTOR_VEC_ISA_OK) rules; other machines probe as torch does
    record = _record_file()
    if record is None:
        return
    key, listed = _fingerprint(), _listed_by_cpu()
    if _read(record).get(key) == listed:
        config.cpp.vec_isa_ok = True
        return
    if [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == listed:
        _remember(record, key, listed)


def _listed_by_cpu() -> list[str]:
    """The ISAs Inductor would take were every probe to pass: those whose flags the CPU lists."""
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]


def _fingerprint() -> str:
    """What a probe's outcome depends on: the compiler (which file, which build of it), torch's
    headers and build, the Python that loads the probe, and the CPU's flags."""
    import torch
    from torch._inductor import cpp_builder, cpu_vec_isa

    compiler = shutil.which(cpp_builder.get_cpp_compiler()) or cpp_builder.get_cpp_compiler()
    try:
        found = os.stat(compiler)
        compiler_file = [os.path.realpath(compiler), found.st_size, found.st_mtime_ns]
    except OSError:
        compiler_file = [compiler]
    facts = [
        compiler_file,
        torch.__version__,
        torch.__file__,
        sys.executable,
        sorted(cpu_vec_isa.x86_isa_checker()),
        # Each ISA's compile flags are torch's (its version is above), and Inductor adds to them as it compiles.
        [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list],
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


def _record_file() -> Path | None:
    """The record in Inductor's cache, only where no other user can write that folder (it would
    tell the build to compile for instructions no probe checked)."""
    folder = inductor_cache()
    if not folder.is_dir() or wheel_trust.chain_problem(folder, private=True):
        return None
    return folder / RECORD


def _read(record: Path) -> dict[str, list[str]]:
    try:
        found = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or cut short: probe again
    return found if isinstance(found, dict) else {}


def _remember(record: Path, key: str, listed: list[str]) -> None:
    """Whole or not at all (another build may read it at the same moment); a folder that cannot be
    written only means the next build probes again."""
    staged = record.with_name(f".{RECORD}.{os.getpid()}")
    try:
        staged.write_text(json.dumps({**_read(record), key: listed}, sort_keys=True))
        staged.chmod(0o644)
        os.replace(staged, record)
    except OSError:
        staged.unlink(missing_ok=True)
