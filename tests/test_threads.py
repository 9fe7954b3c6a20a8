"""A CPU wheel runs on more threads than the machine that built it had (CI builds on 2 cores;
servers have dozens): a whole-tensor reduction, whose kernel keeps one partial result per
thread, returns eager's answer when the serving process uses 4x the build's threads."""

from __future__ import annotations

import os
import subprocess

import torch

from .conftest import make_venv, pip_install, run_cli

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
