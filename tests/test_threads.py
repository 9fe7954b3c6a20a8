"""A CPU wheel runs on more threads than the machine that built it had (CI builds on 2 cores;
servers have dozens): a whole-tensor reduction, whose kernel keeps one partial result per
thread, returns eager's answer when the serving process uses 4x the build's threads."""

from __future__ import annotations

import os
import re
import subprocess

import torch
from torch import nn

from pipeline import targets
from pipeline.spec import load_spec
from pipeline.targets import cpu

from .conftest import TINY_SPEC, make_venv, pip_install, run_cli

MODEL = """\
import torch
from torch import nn


class Totals(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x.mean(), x.abs().amax(), (x * x).mean()])


def build():
    return Totals()
"""

SPEC = """\
[model]
name = "totals"
version = "0.1"
factory = "model:build"

[weights]
seed = 0

[[inputs]]
name = "x"
shape = [1024, 1024]

[[outputs]]
name = "totals"
rtol = 1e-4
atol = 1e-6

[compile]
search = false
"""

# load() after torch.set_num_threads(N); load_numpy(), which imports no torch, under OMP_NUM_THREADS=N.
RUN = """\
import os
import sys
import numpy as np
import model_totals

x = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
if sys.argv[1] == "load":
    import torch
    torch.set_num_threads(int(os.environ["THREADS"]))
    model = model_totals.load()
    run = lambda: model(torch.from_numpy(x)).numpy()
else:
    model = model_totals.load_numpy()
    run = lambda: model(x)
for _ in range(3):
    got = run()
want = np.array([x.mean(dtype=np.float64), np.abs(x).max(), (x.astype(np.float64) ** 2).mean()])
print(np.abs(got - want).max())
"""


def test_wheel_built_on_few_threads_runs_on_many(dirs, tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "model.py").write_text(MODEL)
    (tmp_path / "spec" / "spec.toml").write_text(SPEC)
    ran = run_cli("build", "--spec", str(tmp_path / "spec" / "spec.toml"), *dirs.args())
    assert ran.code == 0, ran.err
    # The hazard is there to meet: the kernel holds per-thread partial results.
    kernels = "".join(path.read_text() for path in dirs.build.rglob("*.kernel.cpp"))
    assert "_arr[" in kernels and "#pragma omp parallel" in kernels, "no per-thread partial results to check"
    python = make_venv(tmp_path / "env")
    pip_install(python, str(next(dirs.dist.glob("model_totals-*.whl"))))
    threads = str(4 * torch.get_num_threads())  # the build's: pytest's process, like the CLI's, runs torch's default
    for loader in ("load", "load_numpy"):
        env = {**os.environ, "THREADS": threads} if loader == "load" else {**os.environ, "OMP_NUM_THREADS": threads}
        done = subprocess.run([str(python), "-c", RUN, loader], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert done.returncode == 0, f"{loader}() on {threads} threads: exit {done.returncode}\n{done.stderr}"
        assert float(done.stdout) < 1e-5, f"{loader}() on {threads} threads: off by {done.stdout}"


class NormedConv(nn.Module):
    """A convolution and a group norm of 2 channels a group: the unet's kernel that, planned for
    the build's 2 threads, split only its batch loop among them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 64, 3, padding=1)
        self.norm = nn.GroupNorm(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.norm(self.conv(x)))


def test_loops_are_split_for_more_threads_than_the_build_has(tmp_path):
    options = {"freezing": True, **cpu.compile_options(load_spec(TINY_SPEC).spec)}
    assert options[cpu.SCHEDULE_THREADS_OPTION] == cpu.SCHEDULE_THREADS > 2
    torch.manual_seed(0)
    model = NormedConv().eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(model, (torch.randn(2, 4, 16, 16),), dynamic_shapes=({0: batch},), strict=False)
    library = tmp_path / "out" / "model.so"
    with torch.no_grad():
        torch._inductor.aot_compile(
            program.module(),
            (torch.randn(2, 4, 16, 16),),
            options={
                **options,
                **cpu.graph_passes(options),
                "fx_graph_cache": False,
                "aot_inductor.output_path": str(library),
            },
        )
    kernels = "".join(path.read_text() for path in library.parent.rglob("*.kernel.cpp"))
    norm = re.search(r"void\s+cpp_fused\w*group_norm\w*\(.*?\n}", kernels, re.S)
    assert norm, "no group norm kernel in the generated code"
    # The batch loop and the groups' loop are split among threads together: batch 1 uses them all.
    assert "#pragma omp for collapse(" in norm.group(0), norm.group(0)
    runner = targets.open_runner(cpu, library)
    for size in (1, 3):
        x = torch.randn(size, 4, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(runner.run([x])[0], model(x), rtol=1e-4, atol=1e-5)


def test_a_fixed_thread_count_is_not_set_by_the_plan(tmp_path):
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(TINY_SPEC.read_text() + '\n[compile.inductor]\n"cpp.dynamic_threads" = false\n')
    # Without dynamic threads, cpp.threads would become the kernels' thread count: 8 on 2 cores.
    assert cpu.SCHEDULE_THREADS_OPTION not in cpu.compile_options(load_spec(str(spec_path)).spec)
