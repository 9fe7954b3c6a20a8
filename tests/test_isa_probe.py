"""Inductor's vector-ISA probes, remembered (pipeline/targets/cpu_isa.py): a build process answers
a probe that passed before in this user's own Inductor cache, with the same compiler, torch, Python
and CPU, from the record; a probe that failed, or a record another user could write, is never
trusted. Each test runs torch's real probe (it compiles and loads a library)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from pipeline.targets import cpu_isa

from .conftest import REPO

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Inductor probes x86 ISAs only")


@pytest.fixture
def record_folder(monkeypatch, tmp_path):
    """The record kept in a folder of this test's (torch's probe libraries stay in its warm cache)."""
    folder = tmp_path / "inductor"
    folder.mkdir(mode=0o755)
    monkeypatch.setattr(cpu_isa, "inductor_cache", lambda: folder)
    return folder


class Counted:
    """torch's own probe, counting the times it really runs."""

    def __init__(self) -> None:
        from torch._inductor import cpu_vec_isa

        self.real = getattr(cpu_vec_isa.VecISA.check_build, "__wrapped__", cpu_vec_isa.VecISA.check_build)
        self.runs = 0

    def __call__(self, isa, code: str) -> bool:
        self.runs += 1
        return self.real(isa, code)


def avx2():
    from torch._inductor import cpu_vec_isa

    return cpu_vec_isa.VecAVX2(), cpu_vec_isa.VecISA._avx_code


def test_a_probe_that_passed_is_answered_from_the_record_after(record_folder):
    probe = Counted()
    check = cpu_isa._answering(probe)
    isa, code = avx2()
    assert check(isa, code) and probe.runs == 1
    record = record_folder / cpu_isa.RECORD
    assert list(json.loads(record.read_text()).values()) == [True]
    assert record.stat().st_mode & 0o777 == 0o644
    assert check(isa, code) and probe.runs == 1  # answered: no compile, no process


def test_a_failed_probe_is_run_again_and_never_recorded(record_folder):
    probe = Counted()
    check = cpu_isa._answering(probe)
    isa, _ = avx2()
    broken = "#error this probe does not compile\n"
    assert not check(isa, broken) and not check(isa, broken)
    assert probe.runs == 2
    assert not (record_folder / cpu_isa.RECORD).exists()


def test_another_machines_or_compilers_record_answers_nothing(record_folder):
    record = record_folder / cpu_isa.RECORD
    record.write_text(json.dumps({"0" * 64: True}))
    probe = Counted()
    isa, code = avx2()
    assert cpu_isa._answering(probe)(isa, code) and probe.runs == 1
    assert len(json.loads(record.read_text())) == 2  # its own added, the other kept


def test_a_record_in_a_folder_others_can_write_is_not_trusted(record_folder):
    probe = Counted()
    check = cpu_isa._answering(probe)
    isa, code = avx2()
    check(isa, code)
    record_folder.chmod(0o777)  # another user could have written the record
    assert check(isa, code) and probe.runs == 2


def test_a_build_process_runs_no_probe_that_passed_before():
    """torch's probes load their library in a fresh Python (an audited subprocess.Popen): in a
    process after one that probed, the CPU target's vec_isa() starts none."""
    code = (
        "import sys\n"
        "probes = []\n"
        "sys.addaudithook(lambda event, args: probes.append(args) if event == 'subprocess.Popen' "
        "and 'LoadLibrary' in repr(args) else None)\n"
        "from pipeline.targets import cpu\n"
        "print(cpu.vec_isa(), len(probes), sep='|')\n"
    )
    first, second = (
        subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    isa = first.stdout.split("|")[0]
    assert second.stdout.strip() == f"{isa}|0", (first.stdout, second.stdout)
