"""The bench's own arithmetic: rounds summarised with their spread, fresh starts and the
load_numpy()/load() target (the bench itself runs in `make bench`, not in the tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import artifacts, bench, bench_report, ort_profile, sampling

from .conftest import REPO, TINY_SPEC


def test_rounds_rotate_so_no_variant_always_runs_first():
    orders = [bench.rotated(["a", "b", "c"], i) for i in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert {order[0] for order in orders} == {"a", "b", "c"}


def test_a_noisy_round_shows_as_spread_not_as_the_figure():
    runs = [
        {"median_ms": 40.0, "p90_ms": 41.0, "runs": 50, "first_call_s": 9.0, "page_faults_per_call": 3.0},
        {"median_ms": 400.0, "p90_ms": 900.0, "runs": 10, "first_call_s": 0.1, "page_faults_per_call": 900.0},
        {"median_ms": 42.0, "p90_ms": 44.0, "runs": 48, "first_call_s": 0.1, "page_faults_per_call": 4.0},
    ]
    summary = bench.summarize(runs)
    assert summary["median_ms"] == 42.0 and summary["spread_ms"] == [40.0, 400.0]
    assert summary["first_call_s"] == 9.0  # the first round's: torch.compile's cold first call
    assert summary["rounds"] == 3 and summary["runs"] == 108
    assert summary["page_faults_per_call"] == 4.0


def _results(numpy_ms: float) -> dict:
    latency = {
        v: {
            b: {
                "median_ms": 10.0,
                "p90_ms": 11.0,
                "spread_ms": [9.5, 12.0],
                "rounds": 3,
                "runs": 30,
                "first_call_s": 1.0,
            }
            for b in ("1", "8")
        }
        for v in bench.VARIANTS
    }
    latency["wheel-numpy"]["8"]["median_ms"] = numpy_ms
    starts = {v: 1.0 for v in bench.VARIANTS}
    return {
        "batches": [1, 8],
        "latency_ms": latency,
        "cold_start_s": starts,
        "import_torch_s": 0.9,
        "cold_start_spread_s": {**{v: [0.9, 1.2] for v in bench.VARIANTS}, "import-torch": [0.8, 1.0]},
        "build": {"cold_s": 100.0, "cached_s": 2.0},
    }


def test_load_numpy_is_held_to_load_at_every_batch_size_either_way_round():
    checks = {t["target"]: t for t in bench.targets(_results(numpy_ms=11.0))}
    assert checks["load_numpy() and load() within 1.05x of each other (batch 1)"]["met"]
    slow = checks["load_numpy() and load() within 1.05x of each other (batch 8)"]
    assert slow["ratio"] == 1.1 and not slow["met"]
    fast = {t["target"]: t for t in bench.targets(_results(numpy_ms=9.0))}[
        "load_numpy() and load() within 1.05x of each other (batch 8)"
    ]
    assert fast["ratio"] == 1.111 and not fast["met"], "a load() 11% slower is as far from equal"


def test_the_table_carries_each_figures_spread():
    lines = bench_report.latency_table(_results(numpy_ms=10.0), bench.VARIANTS, bench.LABELS)
    wheel_row = next(line for line in lines if line.startswith("| this wheel, load() |"))
    assert wheel_row == "| this wheel, load() | 10.0 / 11.0 [9.5–12.0] | 10.0 / 11.0 [9.5–12.0] | 1.00 [0.90–1.20] |"


def test_perf_report_lines_are_summed_per_group():
    report = (
        "    76.54%  libgomp.so.1   \n     5.90%  [JIT] tid 8820\n     3.45%  libtorch_cpu.so\n"
        "     0.62%  model.so\n     0.30%  libcrypto.so.3\n     0.20%  libc10.so\n# comment\n"
    )
    groups = sampling.grouped(report)["groups"]
    assert list(groups)[0] == "OpenMP runtime: barriers and waiting (libgomp)"
    assert groups["the model's generated kernels (model.so)"] == pytest.approx(0.0062)
    assert groups["other libraries"] == pytest.approx(0.005)


def test_a_real_sampling_profile_sees_where_a_process_spends_its_time(tmp_path):
    if not sampling.available():
        pytest.skip("perf is not installed")
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.5:\n    sum(range(1000))\n"
    groups = sampling.profile([sys.executable, "-c", spin], tmp_path, skip_s=0.3)["groups"]
    assert list(groups)[0] == "Python interpreter", groups


def test_onnx_runtime_profile_counts_only_the_timed_runs_per_group():
    def node(op, ts, dur):
        return {"cat": "Node", "name": f"{op}_1_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 99_000},
        node("Conv", 10, 50_000),  # warm-up
        {"cat": "Session", "name": "model_run", "ts": 100_000, "dur": 10_000},
        node("Conv", 100_010, 4_000),
        node("FusedMatMul", 104_010, 2_000),
        node("Softmax", 106_010, 1_000),
        {"cat": "Session", "name": "model_run", "ts": 200_000, "dur": 12_000},
        node("NchwcConv", 200_010, 6_000),
        node("MatMul", 206_010, 2_000),
        node("Add", 208_010, 1_000),
    ]
    summary = ort_profile.summarize(events, calls=2)
    assert summary["run_ms"] == 11.0
    assert summary["groups_ms"] == {"convolution": 5.0, "linear / matmul": 2.0, ort_profile.OTHER: 1.0}
    assert list(summary["ops_ms"])[0] == "NchwcConv"


def test_the_gap_to_onnx_runtime_is_named_by_operation_group():
    wheel = {
        "convolution": 17.0,
        "linear / matmul": 5.5,
        "generated C++ kernels": 3.0,
        "other library calls": 0.5,
        "attention": 2.0,
    }
    onnx = {
        "run_ms": 21.0,
        "groups_ms": {"convolution": 11.0, "linear / matmul": 6.0, ort_profile.OTHER: 3.0},
        "ops_ms": {"Conv": 11.0, "MatMul": 6.0},
    }
    lines = bench_report.versus_onnx(wheel, onnx)
    assert "| convolution | 17.00 | 11.00 | +6.00 |" in lines
    assert f"| {ort_profile.OTHER} | 3.50 | 3.00 | +0.50 |" in lines
    assert "| attention | 2.00 | 0.00 | +2.00 |" in lines
    assert lines[-1] == "| all | 28.00 | 20.00 | +8.00 |"


def test_the_benchs_own_compiles_use_the_wheels_graph_passes():
    """The .pt2, the profiled and the bf16 builds must compile as the wheel does (packed
    convolution weights included), or the bench compares against a different model."""
    from types import SimpleNamespace

    program, options = artifacts.program_for(
        SimpleNamespace(program="exported", target=bench.build_targets.get("cpu")),
        {"freezing": True, "aot_inductor.package_constants_in_so": False},
    )
    assert program == "exported"
    assert options["freezing"] is True and "aot_inductor.package_constants_in_so" not in options
    assert type(options["post_grad_custom_pre_pass"]).__name__ == "PrepackDynamicConvWeights"


def test_the_report_renders_what_the_bench_measures_and_what_limits_it():
    """results.json as `make bench` writes it, with the profile of a missed target: the report
    holds the targets, the page faults and the side-by-side with ONNX Runtime."""
    results = _results(numpy_ms=10.0)
    for by_batch in results["latency_ms"].values():
        by_batch["1"]["page_faults_per_call"] = 2.0
    results |= {
        "model": "model-unet 1.0.0",
        "machine": "x86_64",
        "torch": "2.13.0+cpu",
        "cores": 2,
        "chosen": "freezing",
        "candidates": 2,
        "cold_repeats": bench.COLD_REPEATS,
        "targets": bench.targets(results),
        "search": {"chosen": "freezing", "candidates": [{"name": "freezing", "median_ms": 9.5, "passed": True}]},
        "profile": {
            "matmul_peak_gflops": 100.0,
            "gflop": 0.5,
            "groups_ms": {"convolution": 6.0, "attention": 1.0},
            "group_gflop": {"convolution": 0.4},
            "kernels": [{"kernel": "conv", "ms_per_call": 6.0, "calls": 3}],
        },
        "onnx_profile": {"run_ms": 8.0, "groups_ms": {"convolution": 5.0}, "ops_ms": {"Conv": 5.0}},
    }
    report = bench_report.markdown(results)
    assert "| wheel latency <= 0.9x ONNX Runtime (batch 1) | 1.000 | 0.9 | no |" in report
    assert "| freezing | 9.5 | chosen |" in report
    assert "this wheel, load_numpy() 2. The runtime keeps the memory" in report
    assert "## What limits it" in report and "| convolution | 6.00 | 5.00 | +1.00 |" in report
    assert "| `conv` | 6.00 | 3 |" in report


def test_the_cuda_bench_holds_the_wheel_with_cuda_graphs_to_eager_and_reduce_overhead_at_batch_1_and_8():
    from benchmarks import bench_cuda

    figures = {"eager": (11.67, 11.13), "compile-ro": (3.13, 3.38), "wheel": (4.02, 4.35), "wheel-graphs": (2.39, 3.25)}
    lat = {v: {"1": {"median_ms": one}, "8": {"median_ms": eight}} for v, (one, eight) in figures.items()}
    checks = bench_cuda.check_targets(
        {"latency_ms": lat, "batches": [1, 8], "cold_start_s": {"wheel-graphs": 1.0, "pt2": 2.5}}
    )
    assert checks == [
        {
            "target": "the wheel with CUDA graphs >= 4x faster than eager (batch 1)",
            "ratio": 0.205,
            "limit": 0.25,
            "met": True,
        },
        {
            "target": "the wheel with CUDA graphs <= 0.8x torch.compile reduce-overhead (batch 1)",
            "ratio": 0.764,
            "limit": 0.8,
            "met": True,
        },
        {
            "target": "the wheel with CUDA graphs <= 0.95x torch.compile reduce-overhead (batch 8)",
            "ratio": 0.962,
            "limit": 0.95,
            "met": False,
        },
        {"target": "cold start, load(), >= 2x faster than the .pt2 loader", "ratio": 0.4, "limit": 0.5, "met": True},
    ]


def test_a_variants_process_starts_with_nothing_but_the_checkout_on_its_path():
    """The wheel's variants run in a virtualenv holding only torch and the wheel: the bench's own
    command line (`-m benchmarks.variants`, from the repository root) must import there. `-S`
    leaves out every installed package, this repository's too."""
    cmd = bench.variant_cmd(
        "wheel-numpy", REPO / "models" / "unet" / "spec.toml", {"wheel-numpy": "model_unet"}, venv_python=sys.executable
    )
    assert cmd[1:3] == ["-m", "benchmarks.variants"]
    ran = subprocess.run([cmd[0], "-S", *map(str, cmd[1:]), "--help"], capture_output=True, text=True, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    assert "--artifact" in ran.stdout


def test_bench_memory_runs_its_module_from_outside_the_checkout():
    """`make bench-memory`'s line: the wheel's virtualenv, from /, the checkout on PYTHONPATH."""
    ran = subprocess.run(
        [sys.executable, "-S", "-m", "benchmarks.load_memory", "--help"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert ran.returncode == 0, ran.stderr
    assert "import_name" in ran.stdout


CUDA_LEASE_VARIANTS = ["eager", "compile", "compile-ro", "wheel", "wheel-graphs"]


def lease_results(latency_ms: dict, cold_start_s: dict) -> dict:
    """A `bench_cuda --lease` run's results, as main() gathers them, with its targets judged."""
    from benchmarks import bench_cuda

    results = {
        "model": "model-unet 1.3",
        "gpu": "NVIDIA H200",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "chosen": "spec",
        "batches": [1, 8],
        "build": None,
        "import_torch_s": 4.0,
        "variants": CUDA_LEASE_VARIANTS,
        "latency_ms": latency_ms,
        "cold_start_s": cold_start_s,
        "gpu_busy": {},
    }
    return results | {"targets": bench_cuda.check_targets(results)}


def test_a_lease_sized_cuda_run_reports_without_the_pt2_loader_or_torch_compiles_fresh_starts():
    """`bench_cuda --wheel W --lease` (a short GPU loan): no .pt2 variant, fresh starts for eager and
    the wheel's two rows only, the wheel with and without CUDA graphs side by side."""
    from benchmarks import bench_cuda

    variants = CUDA_LEASE_VARIANTS
    lat = {
        v: {b: {"median_ms": ms + (b == "8"), "p90_ms": ms, "first_call_s": 30.0} for b in ("1", "8")}
        for v, ms in zip(variants, (12.0, 9.0, 3.0, 3.5, 2.4))
    }
    results = lease_results(lat, cold_start_s={"eager": 6.0, "wheel": 4.5, "wheel-graphs": 4.7})
    assert [t["target"] for t in results["targets"]] == [
        "the wheel with CUDA graphs >= 4x faster than eager (batch 1)",
        "the wheel with CUDA graphs <= 0.8x torch.compile reduce-overhead (batch 1)",
        "the wheel with CUDA graphs <= 0.95x torch.compile reduce-overhead (batch 8)",
    ]
    report = bench_cuda.markdown(results)
    assert "| torch.compile reduce-overhead | 3.00 / 3.00 | 4.00 / 3.00 | — |" in report
    assert "| the wheel, without CUDA graphs (load(cuda_graphs=False)) | 3.50 / 3.50 | 4.50 / 3.50 | 4.50 |" in report
    assert "| the wheel, CUDA graphs (load()) | 2.40 / 2.40 | 3.40 / 2.40 | 4.70 |" in report
    assert (
        "| the wheel with CUDA graphs <= 0.8x torch.compile reduce-overhead (batch 1) | 0.800 | 0.8 | yes |" in report
    )
    assert (
        "| the wheel with CUDA graphs <= 0.95x torch.compile reduce-overhead (batch 8) | 0.850 | 0.95 | yes |" in report
    )
    assert ".pt2" not in report.split("## What limits it")[0]
    assert "GPU busy share: not measured (this table is written as the latencies come in;" in report
    assert "— in a latency column" not in report


def test_a_cuda_run_cut_off_after_its_latencies_still_has_its_table_and_targets():
    """On an H200 a lease ended in the fresh-start phase, after every latency was in, and the run
    had written nothing: the bench now writes its table once the latencies are measured."""
    from benchmarks import bench_cuda

    variants = CUDA_LEASE_VARIANTS
    seen = {"eager": (12.93, 15.00), "compile": (8.12, 9.34), "compile-ro": (3.23, 3.52), "wheel": (3.93, 6.61)}
    seen["wheel-graphs"] = (2.41, 3.22)
    lat = {
        v: {b: {"median_ms": ms, "p90_ms": ms, "first_call_s": 1.0} for b, ms in zip(("1", "8"), seen[v])}
        for v in variants
    }
    results = lease_results(lat, cold_start_s={})
    report = bench_cuda.markdown(results)
    assert "| the wheel, CUDA graphs (load()) | 2.41 / 2.41 | 3.22 / 3.22 | — |" in report
    assert "| the wheel with CUDA graphs >= 4x faster than eager (batch 1) | 0.186 | 0.25 | yes |" in report
    assert (
        "| the wheel with CUDA graphs <= 0.95x torch.compile reduce-overhead (batch 8) | 0.915 | 0.95 | yes |" in report
    )
    assert report.rstrip().endswith(
        "Fresh starts and GPU busy share: not measured (this table is written as the latencies come in; "
        "the run ended before its last phases, or is still in them)."
    )


class _Runs:  # what graphs_checked asks of a loaded wheel: calls, and info()'s path
    def __init__(self, path: str) -> None:
        self.path, self.infos = path, 0

    def __call__(self, *args):
        return args

    def info(self) -> dict:
        self.infos += 1
        return {"path": self.path}


def test_the_graph_rows_first_call_is_its_capture_and_refuses_a_wheel_without_graphs():
    from benchmarks.variants import graphs_checked

    model = _Runs("CUDA graphs")
    call = graphs_checked(model, [1, 2])
    assert [call(), call(), call()] == [(1, 2)] * 3 and model.infos == 1  # checked once, on the first call
    with pytest.raises(SystemExit, match="wheel-graphs: the wheel runs without CUDA graphs"):
        graphs_checked(_Runs("AOTInductor runner"), [1])()


def test_the_wheels_venv_sees_this_interpreters_torch_when_this_interpreter_is_a_venv(tmp_path):
    """GPU images keep their CUDA torch in a virtualenv (/opt/torch/.venv): a venv made from it with
    --system-site-packages alone saw the base Python's packages and no torch (seen on an H200)."""
    from benchmarks import torch_venv

    assert sys.prefix != sys.base_prefix, "make test runs in .venv, a virtualenv"
    python = torch_venv.create(tmp_path / "env")
    ran = subprocess.run(
        [python, "-c", "import sys, torch; print(torch.__file__); print(sys.prefix)"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert ran.returncode == 0, ran.stderr
    torch_file, prefix = ran.stdout.split()
    assert torch_file.startswith(sys.prefix) and prefix == str(tmp_path / "env")


def test_the_so_variant_runs_a_bare_model_so_on_every_cpu(tiny_build, wheel, tmp_path):
    """The bf16 comparison and the kernel profile time a bare .so through `benchmarks.variants so`;
    they run only where a target was missed and bf16 is native, so this runs the same command on
    any CPU, with the tiny model's .so (it crashed handing open_runner a str for a Path)."""
    with zipfile.ZipFile(wheel) as archive:
        member = next(name for name in archive.namelist() if name.endswith("/model.so"))
        library = Path(archive.extract(member, tmp_path))
    timing = bench.so_latency(TINY_SPEC, library, min_seconds=0.1)
    assert timing["runs"] >= 10 and timing["median_ms"] > 0


def test_the_benchs_builds_replace_an_earlier_benchs_wheel_of_the_same_name(wheel, tmp_path):
    """`make bench` after a bench on another CPU kind (ATEN_CPU_CAPABILITY=avx2, say) found its
    dist/ holding a wheel of the same name with other contents, and its build refused to replace
    it (exit 10). Two tiny builds, one of them cold (--no-cache): about 30 CPU-s, the bench's own."""
    out = tmp_path / "bench"
    (out / "dist").mkdir(parents=True)
    (out / "dist" / wheel.name).write_bytes(b"an earlier bench's wheel")
    times, built = bench.build_times(TINY_SPEC, out, str(tmp_path / "opt"))
    assert built == out / "dist" / wheel.name and zipfile.is_zipfile(built)
    assert list((out / "dist").glob("*.whl")) == [built]
    assert times["cold_s"] > 0 and times["cached_s"] > 0


def test_a_long_step_of_the_bench_says_what_runs_while_it_runs():
    """`make bench` printed nothing for the minutes of its cold build and of its .pt2 and bfloat16
    compiles: an in-process step gets a build's status lines, even while a C call holds the GIL."""
    code = (
        "import ctypes\nfrom benchmarks import step\n\nwith step('pt2', 'compiling the same model'):\n"
        "    ctypes.PyDLL(None).usleep(2_000_000)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "MODELWHEEL_STATUS_EVERY_S": "0.5"},
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines[0] == "==> pt2: compiling the same model" and lines[-1].startswith("    pt2 done in "), lines
    status = lines[1:-1]
    assert len(status) >= 2, lines
    assert all(re.fullmatch(r"    \.\.\. pt2 · \ds in pt2 · \ds in all", line) for line in status), lines


def test_the_bench_shows_a_build_s_lines_as_they_come(capfd):
    seconds = bench.timed([sys.executable, "-c", "import sys; print('==> compile', file=sys.stderr); print('built')"])
    assert seconds > 0
    assert capfd.readouterr().err.splitlines() == ["==> compile", "built"]  # stdout too, beside the bench's own lines


def lease_measured_until(monkeypatch, loan_ends) -> tuple[list[list], list[dict]]:
    """bench_cuda.measure() of a short loan at batch 1 and 8, the variants' GPU processes stood in
    for (they need a GPU): the commands it ran, and what it handed to ``measured``, up to the
    command at which ``loan_ends(commands so far)``."""
    from benchmarks import bench_cuda

    asked: list[list] = []

    def run_json(cmd):
        asked.append(cmd)
        if loan_ends(asked):
            raise TimeoutError("the loan ended")
        return {"median_ms": 3.0, "p90_ms": 3.5, "first_call_s": 0.1}

    monkeypatch.setattr(bench_cuda, "run_json", run_json)
    handed: list[dict] = []
    artifacts = {"wheel": "model_unet", "wheel-graphs": "model_unet"}
    spec = REPO / "models" / "unet" / "spec.toml"
    with pytest.raises(TimeoutError):
        bench_cuda.measure(spec, [1, 8], artifacts, Path(sys.executable), lease=True, measured=handed.append)
    return asked, handed


def test_the_cuda_bench_hands_over_its_latencies_before_the_fresh_starts(monkeypatch):
    """Every latency is handed to ``measured`` before the first fresh start, and a run that ends in
    the fresh-start phase (a short loan) has handed them over already."""
    from benchmarks import bench_cuda

    asked, handed = lease_measured_until(monkeypatch, lambda asked: "cold" in asked[-1])
    results = handed[0]
    assert handed == [results] * 5  # once the first batch is in, then after each row of the second
    assert [cmd[cmd.index("--mode") + 1] for cmd in asked] == ["latency"] * 9 + ["cold"]
    assert {v: sorted(r) for v, r in results["latency_ms"].items()} == {
        "eager": ["1", "8"],
        "compile": ["1"],  # a short loan leaves torch.compile's default mode out above batch 1
        "compile-ro": ["1", "8"],
        "wheel": ["1", "8"],
        "wheel-graphs": ["1", "8"],
    }
    assert len(bench_cuda.check_targets({**results, "batches": [1, 8]})) == 3  # with main()'s own fields


def test_a_lease_cut_off_in_its_larger_batch_shows_what_it_measured_and_which_target_waits(monkeypatch):
    """On an H200 (2026-11-28) a loan ended in the batch-8 rows: the run had written nothing, and
    torch.compile's default mode at batch 8 (no target's row) had taken its time. Now the rows the
    batch-8 target compares come first, each row reaches the table at once, and the table says
    which cells and which target are still to come."""
    from benchmarks import bench_cuda

    asked, handed = lease_measured_until(monkeypatch, lambda asked: len(asked) == 6)
    last = asked[-1]
    assert (last[last.index("benchmarks.variants") + 1], last[last.index("--batch") + 1]) == ("compile-ro", 8)
    partial = lease_results(handed[-1]["latency_ms"], cold_start_s={})
    assert [t["target"] for t in partial["targets"]] == [
        "the wheel with CUDA graphs >= 4x faster than eager (batch 1)",
        "the wheel with CUDA graphs <= 0.8x torch.compile reduce-overhead (batch 1)",
    ]
    report = bench_cuda.markdown(partial)
    assert "| the wheel, CUDA graphs (load()) | 3.00 / 3.50 | — | — |" in report
    assert (
        "— in a latency column: not measured (a short loan, --lease, leaves torch.compile's default mode out "
        "above batch 1; any other row there, the run ended before it); the target at batch 8 waits for its two rows."
    ) in report
