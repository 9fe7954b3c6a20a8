"""Inductor's vector-ISA probe, remembered (pipeline/targets/cpu_isa.py): a build process trusts
the probes an earlier one passed in this user's own Inductor cache, with the same compiler, torch
and CPU, and only those; a probe that failed is never remembered."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from pipeline.targets import cpu_isa

from .conftest import REPO

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Inductor probes x86 ISAs only")


@pytest.fixture
def as_a_new_process(monkeypatch, tmp_path):
    """Inductor's probe results and its setting as a new process has them (none yet), the record
    kept in a folder of this test's; torch's probe libraries stay in its own warm cache."""
    from torch._inductor import config, cpu_vec_isa

    folder = tmp_path / "inductor"
    folder.mkdir(mode=0o755)
    monkeypatch.setattr(cpu_isa, "inductor_cache", lambda: folder)
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    with config.patch({"cpp.vec_isa_ok": None}):
        yield folder
    cpu_vec_isa.valid_vec_isa_list.cache_clear()


def probed() -> list[str]:
    from torch._inductor import cpu_vec_isa

    return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]


def again() -> None:
    """What the next build process does: its own (empty) probe results, then the record read."""
    from torch._inductor import config, cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    config.cpp.vec_isa_ok = None
    cpu_isa.trust_earlier_probes()


def test_a_later_process_trusts_the_probes_an_earlier_one_passed(as_a_new_process):
    from torch._inductor import config

    cpu_isa.trust_earlier_probes()
    assert config.cpp.vec_isa_ok is None  # the first one probed
    first = probed()
    record = as_a_new_process / cpu_isa.RECORD
    assert list(json.loads(record.read_text()).values()) == [first]
    assert record.stat().st_mode & 0o777 == 0o644
    again()
    assert config.cpp.vec_isa_ok is True
    assert probed() == first


def test_a_record_of_another_compiler_torch_or_cpu_is_not_used(as_a_new_process):
    from torch._inductor import config

    record = as_a_new_process / cpu_isa.RECORD
    record.write_text(json.dumps({"0" * 64: ["avx512 avx512_vnni", "avx512", "avx2"]}))
    cpu_isa.trust_earlier_probes()
    assert config.cpp.vec_isa_ok is None
    assert len(json.loads(record.read_text())) == 2  # its own added, the other kept


def test_a_record_in_a_folder_others_can_write_is_not_trusted(as_a_new_process):
    from torch._inductor import config

    cpu_isa.trust_earlier_probes()
    as_a_new_process.chmod(0o777)  # another user could have written the record
    again()
    assert config.cpp.vec_isa_ok is None


def test_a_failed_probe_is_never_remembered(tmp_path):
    """A compiler that builds nothing: every probe fails, so Inductor compiles no vector code, and
    the next process probes again rather than trust a record."""
    compiler = tmp_path / "g++"
    compiler.write_text('#!/bin/sh\ncase "$*" in *--version*|*-v*) echo "g++ 12"; exit 0;; esac\nexit 1\n')
    compiler.chmod(0o755)
    cache = tmp_path / "inductor"
    cache.mkdir(mode=0o755)
    env = {**os.environ, "CXX": str(compiler), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    code = "from pipeline.targets import cpu; print(cpu.vec_isa())"
    ran = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "INVALID_VEC_ISA"
    assert not (cache / cpu_isa.RECORD).exists()
