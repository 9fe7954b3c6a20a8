"""What a build shows: plain lines off a terminal, a live status on one, --quiet, --json."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.features import outlook as search_time
from pipeline.features import payback
from pipeline.services.cache import Cache
from pipeline.services.parallel import last_stage
from pipeline.services.progress import (
    STATUS_ENV,
    Progress,
    QuietProgress,
    StepClock,
    Steps,
    estimate,
    is_live_terminal,
    reporting,
    step,
)
from pipeline.services.wording import FIRST_COMPILE, brief, took
from pipeline.wheel_template.runtime._bounds import decided_by

from .conftest import REPO, TINY_SPEC, run_cli

# A stage's time: in ms where it would read 0.0s
TOOK = r"(\d+\.\ds|\d+ms)"

# Every line a plain build of the tiny model prints, in order.
PLAIN_LINES = [
    r"==> start: importing torch",
    rf"    start done in {TOOK}",
    r"==> load: tiny_model:build \(.*/tests/models/tiny/spec.toml\)",
    rf"    load done in {TOOK}",
    r"==> doctor",
    rf"    doctor done in {TOOK}",
    r"==> export",
    rf"    export done in {TOOK}",
    r"==> compile: 1 candidate, into .*/tiny/0\.1/cpu \(held while the build runs; the wheel carries the "
    r"files\)",
    r"    candidate spec-options: \d+(\.\d+)? ms a call, one round here \(a rough figure for the report: make bench "
    r"measures the wheel\)(; other processes kept [\d.]+ of the \d+ cores busy meanwhile, so it may be far slower .*)?",
    r"    used spec-options: the only candidate, as the option search is off",
    rf"    compile done in {TOOK}",
    r"==> verify",
    rf"    verify done in {TOOK}",
    r"==> package",
    rf"    package done in {TOOK}",
    r"",
    r"built model_tiny-0\.1\+cpu\.torch[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl",
    r"  wheel     .*\.whl  0\.\d MB  sha256 [0-9a-f]{16}…",
    r"  artifact  model\.so  \d+\.\d MB",
    r"  runs on   x86-64 CPUs with AVX(2|512), the build machine's kind \(native(; --cpu-isa avx2 builds one for any "
    r"x86-64 CPU with AVX2)?\)",
    rf"  stages    load {TOOK} · doctor {TOOK} · export {TOOK} · compile {TOOK} · verify {TOOK} · package {TOOK}",
    r"  search    off: the spec's options alone \(\[compile\] search = false, or --no-search\)",
    r"  verified  features: 10 cases, max abs diff .*, max rel diff .*: passed, every (relative )?diff within .*",
    r"  verified  logits: 10 cases, max abs diff .*, max rel diff .*: passed, every (relative )?diff within .*",
    r"  report    .*\.report\.json",
    r"  import    import model_tiny; model = model_tiny\.load\(\)  "
    r"\(or load_numpy\(\), example_arrays\(\): no torch import\)",
    r"  command   model-tiny verify \| info  \(installed with the wheel\)",
    r"  install   this wheel: pip install /.*/model_tiny-0\.1\+cpu.*\.whl "
    r"--extra-index-url https://download\.pytorch\.org/whl/cpu",
    # by name from the user's index, never PyPI's (where anyone may hold the name): --index-url
    # publishing.md's two lines: the local index sends pip to PyTorch's index for torch by itself
    r"            from the local index \(modelwheel index start; make index in a checkout\): pip install "
    r"model-tiny==0\.1 --index-url http://127\.0\.0\.1:8765/cpu/simple",
    r"            from your index: pip install model-tiny==0\.1 --index-url <your index>/cpu/simple "
    r"--extra-index-url https://download\.pytorch\.org/whl/cpu",
]


@pytest.fixture(scope="module")
def json_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("progress")
    args = ["--root", str(base / "opt"), "--dist", str(base / "dist"), "--build-dir", str(base / "build")]
    # a status line whenever nothing was printed for half a second (10 s by default)
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--json", *args, env={STATUS_ENV: "0.5"})
    assert ran.code == 0, ran.err
    return base, args, ran


# What a plain build prints while a stage is silent: the stage, what it does, its time, the build's.
STATUS_LINE = (
    r"    \.\.\. (start|load|doctor|export|compile|verify|package)( .+)? · (\d+m)?\d+s in \1"
    r" · (\d+m)?\d+s in all( · (about (\d+m)?\d+s left of [a-z ]+|\1 stage (running (\d+m)?\d+s past|finishing,)) .+)?"
)


def test_plain_lines_are_exactly_these_and_have_no_control_characters(json_build):
    _, _, ran = json_build
    lines = [line for line in ran.err.splitlines() if not line.startswith("    ... ")]
    assert len(lines) == len(PLAIN_LINES), ran.err
    for line, pattern in zip(lines, PLAIN_LINES):
        assert re.fullmatch(pattern, line), (pattern, line)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", ran.err)


def test_in_a_pipe_a_silent_stage_says_what_runs_and_for_how_long(json_build):
    """The compile's seconds (minutes for a real model) are not silent off a terminal either."""
    _, _, ran = json_build
    status = [line for line in ran.err.splitlines() if line.startswith("    ... ")]
    assert status and all(re.fullmatch(STATUS_LINE, line) for line in status), status
    assert any(line.startswith("    ... compile 1/1 spec-options: compiling · ") for line in status), status
    # a first build has no earlier one to say how long is left: the compile's figure is guessed from the graph
    guessed = [line for line in status if line.startswith("    ... compile 1/1 spec-options: compiling · ")]
    assert guessed and all(
        re.search(
            r" · (about \d+s left of compile|compile stage (running \d+s past|finishing, at) the estimate) "
            r"\(a first guess from the graph's \d+ ops\); no figure yet for the stages after it \(the build cache "
            r"holds no earlier build of this model on as many threads\)$",
            line,
        )
        for line in guessed
    ), status


@pytest.mark.parametrize(
    "max_abs, max_rel, decided",
    [
        (
            3e-6,
            1.5e-2,
            "passed, every diff within atol 1e-05 alone; the rel diff above rtol 0.001 comes from values near 0",
        ),  # near-zero values: atol covers them
        (3e-6, 5e-4, "passed, every diff within atol 1e-05 alone"),
        (2e-4, 5e-4, "passed, every relative diff within rtol 0.001 (atol 1e-05 where |eager| <= atol)"),
        (2e-4, 1.5e-2, "passed, every diff within atol + rtol·|eager| (atol 1e-05, rtol 0.001: neither alone)"),
    ],
)
def test_the_verified_line_says_which_bound_let_a_diff_through(max_abs, max_rel, decided):
    """A max rel diff above rtol on a passing output reads like a failure unless atol is named."""
    assert decided_by(max_abs, max_rel, rtol=1e-3, atol=1e-5) == decided


def test_a_stage_that_took_under_a_twentieth_of_a_second_says_its_time_in_ms():
    """A tiny model's "verify done in 0.0s" read to a newcomer as a check that never ran."""
    out = io.StringIO()
    progress = Progress(out)
    with progress.stage("verify"):
        pass
    with progress.stage("package"):
        time.sleep(0.2)
    done = [line for line in out.getvalue().splitlines() if " done in " in line]
    assert re.fullmatch(r"    verify done in [1-4]?\dms", done[0]), done
    assert re.fullmatch(r"    package done in 0\.[2-9]s", done[1]), done
    assert [took(0.026), took(0.0004), took(0.06), took(0.1)] == ["26ms", "1ms", "60ms", "0.1s"]  # the summary's too
    assert took(0.0496) == took(round(0.0496, 3)) == "50ms"  # the line's time and the report's, said alike (H45)


def test_a_status_line_comes_when_nothing_was_printed_for_a_while(monkeypatch):
    """The real heartbeat, made fast: the running step, the times and the stage's own estimate."""
    monkeypatch.setenv(STATUS_ENV, "0.1")
    out = io.StringIO()
    progress = Progress(out)
    with reporting(progress), progress.stage("compile", "2 candidate(s)"):
        step("1/2 spec-options: compiling")
        estimate(125.0)
        time.sleep(0.6)
    lines = out.getvalue().splitlines()
    status = lines[1:-1]
    assert lines[0] == "==> compile: 2 candidate(s)" and lines[-1].startswith("    compile done in ")
    assert len(status) >= 2, lines
    for line in status:
        assert re.fullmatch(
            r"    \.\.\. compile 1/2 spec-options: compiling · [01]s in compile · [01]s in all · "
            r"about 2m0[45]s left of compile \(from this build's compiles\); no figure yet for the stages after "
            r"it \(the build cache holds no earlier build of this model on as many threads\)",
            line,
        ), line
    quiet = io.StringIO()
    with QuietProgress(quiet).stage("compile"):
        time.sleep(0.3)
    assert quiet.getvalue() == ""


def test_json_record_parses_and_matches_the_report(json_build):
    _, _, ran = json_build
    record = json.loads(ran.out)
    assert set(record) == {"format", "exit_code", "builds", "failures", "error"}
    assert record["exit_code"] == 0 and record["error"] is None and record["failures"] == []
    [built] = record["builds"]
    report = json.loads(Path(built["report"]).read_text())
    assert built["wheel"].endswith(report["wheel"]["name"]) and Path(built["wheel"]).is_file()
    assert (built["sha256"], built["size"], built["version"], built["target"], built["model"]) == (
        report["wheel"]["sha256"],
        report["wheel"]["size"],
        report["version"],
        report["target"],
        report["model"],
    )
    assert built["stages_s"] == report["stages_s"]
    verification = built["verification"]
    assert verification["passed"] and verification["cases"] == len(report["verification"]["cases"])
    assert verification["worst"] == report["verification"]["worst"]


def test_json_record_of_a_failed_build(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text().replace('version = "0.1"', 'version = "not a version"'))
    ran = run_cli("build", "--spec", str(spec), "--json", "--dist", str(tmp_path / "dist"))
    record = json.loads(ran.out)
    assert ran.code == record["exit_code"] == 3 and record["builds"] == []
    assert "model.version" in record["error"]["message"] and record["error"]["hint"]
    assert "error: " in ran.err  # the message still goes to stderr


def test_quiet_prints_only_the_result_or_the_error(json_build, tmp_path):
    base, args, _ = json_build
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--quiet", *args)  # unchanged: reuses the verified wheel
    assert ran.code == 0 and ran.err == "", ran.err
    assert ran.out.strip().endswith(".whl") and Path(ran.out.strip()).is_file()
    bad = run_cli("build", "--spec", str(tmp_path / "missing.toml"), "--quiet")
    assert bad.code != 0 and bad.out == "" and bad.err.startswith("error: ")


def on_terminal(args: list[str], **env: str) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as its stdout and stderr, as a user's shell would."""
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")} | {"TERM": "xterm"} | env
    child = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args], stdin=slave, stdout=slave, stderr=slave, env=environ, cwd=REPO
    )
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            if not data:
                break
            out += data
        elif child.poll() is not None:
            break
    os.close(master)
    return child.wait(), out.decode(errors="replace")


def test_live_status_on_a_terminal_shows_the_candidate_and_the_time(tmp_path):
    code, text = on_terminal(
        [
            "build",
            "--spec",
            str(TINY_SPEC),
            "--root",
            str(tmp_path / "opt"),
            "--dist",
            str(tmp_path / "dist"),
            "--build-dir",
            str(tmp_path / "build"),
        ]
    )
    assert code == 0, text
    assert "\x1b[" in text and re.search(r"compile 1/1 spec-options: (compiling|verifying|timing)", text)
    seconds = set(re.findall(r"(\d+)s in all", text))
    assert len(seconds) >= 3, seconds  # redrawn as time passes
    assert "==> compile" in text and "built model_tiny-0.1" in text  # the plain lines are still there


@pytest.mark.parametrize("env", [{"CI": "true"}, {"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_escape_codes_under_ci_no_color_or_a_dumb_terminal(tmp_path, env):
    code, text = on_terminal(["build", "--spec", str(tmp_path / "missing.toml")], **env)
    assert code != 0 and "error: " in text and "\x1b" not in text
    for name, value in env.items():
        assert not is_live_terminal(_Tty(), {name: value, "TERM": env.get("TERM", "xterm")})
    assert is_live_terminal(_Tty(), {"TERM": "xterm"}) and not is_live_terminal(io.StringIO(), {"TERM": "xterm"})


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_estimate_of_what_is_left_comes_from_the_last_build(tmp_path, monkeypatch):
    cache = Cache(tmp_path / "cache")
    older, newer = tmp_path / "cache" / "build-a", tmp_path / "cache" / "build-b"
    one_fresh = [{"name": "spec-options", "compile_s": 30.0, "from_cache": False}]
    for entry, compile_s, reused in (
        (older, 99.0, False),
        (newer, 40.0, False),
        (tmp_path / "cache" / "build-c", 1.0, True),
    ):
        entry.mkdir(parents=True)
        report = {
            "model": "tiny",
            "target": "cpu",
            "build_cache": {"reused": reused},
            "stages_s": {"load": 1.0, "export": 2.0, "compile": compile_s, "verify": 3.0, "package": 4.0},
            "compile_search": {"candidates": one_fresh},
        }
        (entry / "model_tiny.report.json").write_text(json.dumps(report))
        time.sleep(0.01)
    assert cache.stage_times("tiny", "cpu")["compile"] == 40.0  # the newest not reused
    assert cache.stage_times("tiny", "cuda") == {} and cache.stage_times("other", "cpu") == {}
    # it compiled one candidate; a build whose compiles take four compiles' time expects four times it
    assert cache.stage_times("tiny", "cpu", rounds=4)["compile"] == 160.0
    assert cache.stage_times("tiny", "cpu", rounds=4)["verify"] == 3.0
    # one that compiled three, the two after the first side by side, took two compiles' time
    three = [*one_fresh, *({"name": n, "compile_s": 30.0} for n in ("freezing", "max-autotune"))]
    searched = tmp_path / "cache" / "build-d"
    searched.mkdir()
    (searched / "model_tiny.report.json").write_text(
        json.dumps(
            {
                "model": "tiny",
                "target": "cpu",
                "stages_s": {"compile": 80.0},
                "compile_search": {"candidates": three, "cost": {"workers": 2}},
            }
        )
    )
    assert cache.stage_times("tiny", "cpu", rounds=2)["compile"] == 80.0
    assert cache.stage_times("tiny", "cpu", rounds=1)["compile"] == 30.0  # one compile: the first's own time
    report = json.loads((searched / "model_tiny.report.json").read_text())  # with its wall time: 1 + 45 / 30 units
    report["compile_search"]["cost"]["compile_wall_s"] = 45.0
    (searched / "model_tiny.report.json").write_text(json.dumps(report))
    assert cache.stage_times("tiny", "cpu", rounds=5)["compile"] == pytest.approx(80.0 / 2.5 * 5)
    # a build that compiles nothing, after one that compiled: that one's stage, its compiles taken out
    # (a newcomer's all-cached search said "running 10s past the last build's 0s" while it verified)
    assert cache.stage_times("tiny", "cpu", rounds=0)["compile"] == pytest.approx(80.0 - 30.0 * 2.5)
    # a newer build whose compile came from the cache (1 s) gives no figure for a fresh compile: the
    # newest that compiled does (a newcomer's said "running 39s past the last build's 1s")
    time.sleep(0.01)
    cached = tmp_path / "cache" / "build-e"
    cached.mkdir()
    from_cache = {"candidates": [{"name": "spec-options", "from_cache": True}]}
    (cached / "model_tiny.report.json").write_text(
        json.dumps({"model": "tiny", "target": "cpu", "stages_s": {"compile": 1.0}, "compile_search": from_cache})
    )
    assert cache.stage_times("tiny", "cpu", rounds=1)["compile"] == 30.0
    assert cache.stage_times("tiny", "cpu", rounds=0)["compile"] == 1.0  # all from the cache, as that one
    # a search whose first came from the cache and whose one fresh compile was max-autotune: its stage
    # is in no plain compile's units (a newcomer's --no-search build was told its 101.6 s for one compile)
    time.sleep(0.01)
    autotuned = tmp_path / "cache" / "build-f"
    autotuned.mkdir()
    costly = [{"name": "spec-options", "from_cache": True}, {"name": "max-autotune", "compile_s": 84.0}]
    (autotuned / "model_tiny.report.json").write_text(
        json.dumps(
            {"model": "tiny", "target": "cpu", "stages_s": {"compile": 101.6}, "compile_search": {"candidates": costly}}
        )
    )
    assert cache.stage_times("tiny", "cpu", rounds=1)["compile"] == 30.0  # the newest with a plain compile
    assert cache.stage_times("tiny", "cpu")["compile"] == 101.6  # unscaled: the newest's own
    autotuned.joinpath("model_tiny.report.json").unlink()
    autotuned.rmdir()
    assert cache.stage_times("tiny", "cpu")["compile"] == 1.0  # unscaled: the newest's own
    # only builds on as many threads: an OMP_NUM_THREADS=1 build's verify (2.8 s) was a 2-thread one's
    # "about 3s" of 33 s (H42); a report that does not say is taken as it is
    one_thread = tmp_path / "cache" / "build-g"
    one_thread.mkdir()
    (one_thread / "model_tiny.report.json").write_text(
        json.dumps({"model": "tiny", "target": "cpu", "stages_s": {"verify": 0.5}, "threads": 1})
    )
    assert cache.stage_times("tiny", "cpu", threads=1)["verify"] == 0.5
    assert cache.stage_times("tiny", "cpu", threads=2) == {"compile": 1.0}  # the newest without a thread count
    shutil.rmtree(one_thread)
    alone = Cache(tmp_path / "alone")  # no build here compiled: no compile figure (the first guess gives one)
    shutil.copytree(cached, tmp_path / "alone" / "build-e")
    assert "compile" not in alone.stage_times("tiny", "cpu", rounds=1)
    cached.joinpath("model_tiny.report.json").unlink()
    cached.rmdir()
    # what a search should take: the first, then what the default budget (3 compiles on 2 cores) has room for
    unet = ["spec-options", "freezing", "freezing+channels-last", "max-autotune"]

    def rounds(names: list[str], first_fresh: bool, workers: int, budget_s: float | None, plain_s=None) -> float:
        counted = search_time.counted(names, first_fresh, workers, budget_s, plain_s)
        return search_time.rounds_of(counted, first_fresh, workers)

    assert rounds(unet, True, 2, None) == 2  # max-autotune (3x a compile) does not fit
    assert rounds(unet, True, 2, 3600.0) == 3.5  # a budget in seconds, no compile to count it by: all, 2 at a time
    assert rounds(unet, True, 2, 3600.0, plain_s=60.0) == 3.5  # 6 compiles' time fit in an hour
    assert rounds(unet, True, 2, 5.0, plain_s=11.0) == 1  # H47: a 5 s budget holds none of 11 s beyond the first
    assert rounds(unet, True, 1, None) == 2  # one core: a budget of 2 compiles, in turn
    assert rounds(unet[1:], False, 2, None) == 2.5  # the first cached: nothing to budget by
    assert rounds(["max-autotune"], False, 2, None) == 3.0  # alone, by its cost (it said 52 s)
    # which of them the figure counts (the opening line names a costly one only where it is counted)
    assert search_time.counted(unet, True, 2, None) == unet[:3]
    assert (
        search_time.counted(unet, True, 2, 3600.0) == unet and search_time.counted(unet[3:], False, 2, None) == unet[3:]
    )
    searched.joinpath("model_tiny.report.json").unlink()
    searched.rmdir()
    # what a budget in seconds is counted against: the model's own earlier compile here (its cost taken
    # out), else the graph's guess (H47: counted on the guess only, a 5 s budget was promised 3 candidates)
    from pipeline import targets
    from pipeline.features.first_guess import plain_compile_s

    def earlier(model: str, first: str, seconds: float) -> None:
        folder = tmp_path / "plain" / f"build-{model}-{first}"
        folder.mkdir(parents=True)
        candidate = {"name": first, "compile_s": seconds, "from_cache": False}
        report = {"model": model, "target": "cpu", "compile_search": {"candidates": [candidate]}}
        folder.joinpath(f"model_{model}.report.json").write_text(json.dumps(report))

    cpu = targets.get("cpu")
    assert plain_compile_s(None, cpu, tmp_path / "plain", "bert") is None  # no earlier build, no graph
    earlier("bert", "spec-options", 11.0)
    assert plain_compile_s(None, cpu, tmp_path / "plain", "bert") == 11.0
    assert plain_compile_s(None, cpu, tmp_path / "plain", "vit") is None  # another model's is not this one's
    earlier("vit", "max-autotune", 30.0)  # a lock pinned max-autotune: 3 compiles' time
    assert plain_compile_s(None, cpu, tmp_path / "plain", "vit") == 10.0
    # a lock's build records the search's candidates, and compiled only the lock's one (H49: none
    # counted, and a 5 s budget was told 4 compiles' time, 1m41s, for a 12 s compile)
    folder = tmp_path / "plain" / "build-locked"
    folder.mkdir()
    recorded = [{"name": "spec-options", "compile_s": None}, {"name": "max-autotune", "compile_s": 24.0}]
    report = {"model": "bert", "target": "cpu", "compile_search": {"candidates": recorded}}
    folder.joinpath("model_bert.report.json").write_text(json.dumps(report))
    assert plain_compile_s(None, cpu, tmp_path / "plain", "bert") == 8.0
    progress = Progress(io.StringIO())
    progress.expect(cache.stage_times("tiny", "cpu"))
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    with progress.stage("compile"):
        clock[0] += 10.0
        assert (
            progress.outlook() == "about 37s left of the build (from earlier builds)"
        )  # 30 of compile, 3 + 4 after it
        # longer than last time: it says by how much, where it froze at the later stages' 7 s
        clock[0] += 60.0
        assert progress.outlook() == (
            "compile stage running 30s past its estimate of 40s, then about 7s for the stages after it (from "
            "earlier builds)"
        )
        clock[0] += 60.0
        assert progress.outlook() == (
            "compile stage running 1m30s past its estimate of 40s, then about 7s for the stages after it (from "
            "earlier builds)"
        )
        progress.estimate(20.0)  # the search's own estimate, from its first compile, replaces the last build's
        # two bases, said apart: this stage's own figure, and the later stages' from the last build; and
        # "revised", as the stage ran past the last one: "running 1m30s past", then "finishing, at the
        # estimate" read to a newcomer as a clock going backwards
        assert progress.outlook() == (
            "about 27s left of the build: 20s of compile (revised, from this build's compiles), then 7s for the "
            "stages after it (from earlier builds)"
        )
        clock[0] += 20.2
        # at the estimate, within half a second: "running 0s past" read as a warning, "about 0s left" as a stall
        assert progress.outlook() == (
            "compile stage finishing, at the revised estimate (from this build's compiles), then about 7s for the "
            "stages after it (from earlier builds)"
        )
        clock[0] += 4.8
        assert progress.outlook() == (
            "compile stage running 5s past the revised estimate (from this build's compiles), then about 7s for the "
            "stages after it (from earlier builds)"
        )
        assert brief(progress.outlook()) == "running 5s past the revised estimate, then about 7s for the later stages"
        # past it, a figure with a few seconds to go is said in numbers, revised (H55: "finishing, at the
        # revised estimate" straight after "running 10s past" named a figure never shown)
        progress.estimate(3.0)
        assert progress.outlook().startswith("about 10s left of the build: 3s of compile (revised"), progress.outlook()
        clock[0] += 3.0
        assert progress.outlook().startswith("compile stage finishing, at the revised estimate"), progress.outlook()
        # at it, the next figure came back with a few seconds to go: "finishing" holds until they run out
        # too (H53: "finishing, at the revised estimate", then "about 2s left … revised")
        progress.estimate(2.0)
        assert progress.outlook().startswith("compile stage finishing, at the revised estimate"), progress.outlook()
        clock[0] += 1.0
        assert progress.outlook().startswith("compile stage finishing, at the revised estimate"), progress.outlook()
        clock[0] += 2.0
        assert progress.outlook().startswith("compile stage running 1s past the revised estimate"), progress.outlook()
        progress.estimate(30.0)  # a figure well beyond it is said as it is
        assert progress.outlook().startswith("about 37s left of the build: 30s of compile (revised"), progress.outlook()
    # held at finishing, a figure revises nothing the user saw: not "the revised estimate" (H55)
    held = Progress(io.StringIO())
    held.expect({"compile": 100.0})
    with held.stage("compile"):
        held.estimate(5.0)
        clock[0] += 5.0
        held.estimate(4.0)
        assert held.outlook() == "compile stage finishing, at the estimate (from this build's compiles)", held.outlook()
    # a new figure that ends much later than the last one is revised too: "about 9s left", then
    # "about 1m12s left" of the timing rounds, with no word of it
    rounds = Progress(io.StringIO())
    with rounds.stage("compile"):
        rounds.estimate(9.0, "the noise rounds' time, for each candidate")
        clock[0] += 2.0
        rounds.estimate(70.0, "from the timing rounds so far")
        assert rounds.outlook() == "about 1m10s left of compile (revised, from the timing rounds so far)" + FIRST_BUILD
    # where the stage had no figure of its own, the earlier builds' was said: a rise from it is revised
    # too (H47: "about 3m31s left of the build", then "about 3m48s left of the build: 3m30s of compile")
    earlier = Progress(io.StringIO())
    earlier.expect({"compile": 100.0})
    with earlier.stage("compile"):
        clock[0] += 40.0  # 60 s left, by the earlier builds
        earlier.estimate(75.0, "from this build's compiles")
        assert earlier.outlook() == "about 1m15s left of compile (revised, from this build's compiles)"
    close = Progress(io.StringIO())
    close.expect({"compile": 100.0})
    with close.stage("compile"):
        clock[0] += 40.0
        close.estimate(65.0, "from this build's compiles")  # 5 s later: the figure following the work
        assert close.outlook() == "about 1m05s left of compile (from this build's compiles)"
    steady = Progress(io.StringIO())
    with steady.stage("compile"):
        steady.estimate(60.0)
        clock[0] += 10.0
        steady.estimate(55.0)  # 5 s later than the last said: no revision worth a word
        assert steady.outlook() == "about 55s left of compile (from this build's compiles)" + FIRST_BUILD
    # a stage the last build did not have (static sizes): what comes after it, not a figure for it
    with progress.stage("static"):
        assert progress.outlook() == "about 4s after this stage (from earlier builds)"


# A first build's figure is the stage's own: it says so (in the next build it is "left of the build").
FIRST_BUILD = (
    "; no figure yet for the stages after it (the build cache holds no earlier build of this model on as many threads)"
)


def test_the_pending_note_names_the_case_after_which_the_figure_comes(monkeypatch):
    """H66 read "time left: known once its first cases are verified" at case 4 of 10, three of them
    done, as stuck: the note says how many, and the figure comes exactly then."""
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    for total, needed in ((10, 4), (4, 2)):
        progress = Progress(io.StringIO())
        with reporting(progress), progress.stage("verify"):
            steps = StepClock("verify", total)
            assert steps.pending() == f"time left: known once {needed} of its {total} cases are verified"
            progress.estimate(None, steps.pending())
            for number in range(1, needed + 1):
                assert progress.outlook().startswith("time left: known once"), (total, number)
                clock[0] += 1.0
                steps.done(number)
            assert progress.outlook().startswith("about "), (total, progress.outlook())


def test_the_verify_stage_estimates_from_its_cases_once_past_the_last_builds_figure(monkeypatch):
    """A --no-search unet build verified in 38 s after a searched build's 2.5 s: 'running 29s past
    the last build's 2s' was all it said. Past that figure the cases verified so far give it."""
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    progress = Progress(io.StringIO())
    progress.expect({"verify": 2.0, "package": 4.0})
    with reporting(progress), progress.stage("verify"):
        steps = StepClock("verify", 10)
        clock[0] += 1.0  # the first case opens the model
        steps.done(1)
        clock[0] += 0.4
        steps.done(2)  # 1.4 s in: the last build's figure holds
        assert progress.outlook() == "about 5s left of the build (from earlier builds)"
        clock[0] += 9.6
        steps.done(3)  # 11 s in: past the last build's figure, but two cases are too few to go by
        assert progress.outlook() == (
            "verify stage running 9s past its estimate of 2s, then about 4s for the stages after it (from earlier "
            "builds)"
        )
        clock[0] += 5.0
        steps.done(4)  # the median case after the first, 5 s: 6 cases left
        assert progress.outlook() == (
            f"about 34s left of the build: 30s of verify (revised, {StepClock.BASIS}), then 4s for the stages after "
            "it (from earlier builds)"
        )
    # one slow case, then quick ones (a newcomer's "about 36s left" with 4 s to go): the median holds
    slow = Progress(io.StringIO())
    with reporting(slow), slow.stage("verify"):
        steps = StepClock("verify", 10)
        for number, took in enumerate((1.0, 5.0, 0.5, 0.5), 1):
            clock[0] += took
            steps.done(number)
        assert slow.outlook() == f"about 3s left of verify ({StepClock.BASIS})" + FIRST_BUILD  # 0.5 s for each of 6
        for number in range(5, 11):  # the last slower than said: past it, and it gives no figure of its own
            clock[0] += 2.5 if number == 10 else 0.5
            steps.done(number)
        assert slow.outlook().startswith("verify stage running "), slow.outlook()  # not "finishing" again (H44)
    # cases of other sizes (the unet's batch=max(8)): "about 4s left" before a case that took 20 s
    sized = Progress(io.StringIO())
    with reporting(sized), sized.stage("verify"):
        sizes = [1.0, 1.0, 1.0, 1.0, 8.0, 1.0, 1.0, 1.0, 1.0, 8.0]  # weights 0.5625 and 2.75 (a quarter fixed)
        steps = StepClock("verify", 10, sizes=sizes)
        for number, took in enumerate((1.0, 0.5625, 0.5625, 0.5625), 1):
            clock[0] += took
            steps.done(number)
        assert sized.outlook() == f"about 8s left of verify ({StepClock.BASIS})" + FIRST_BUILD  # not 6 x 0.5625
    # a search's candidate after the first: its cases, then what the search has left after it (H62:
    # "about 1s left" before two verifications that ran 29 s past it)
    searching = Progress(io.StringIO())
    with reporting(searching), searching.stage("compile"):
        steps = StepClock("compile", 10, "from this candidate's cases so far", then_s=20.0)
        for number, took in enumerate((1.0, 2.0, 2.0, 2.0), 1):
            clock[0] += took
            steps.done(number)
        assert searching.outlook() == (
            "about 32s left of compile (from this candidate's cases so far)" + FIRST_BUILD
        )  # 2 s for each of 6 cases, then 20 s
    doctor = Progress(io.StringIO())  # the doctor's numbered steps, in a model's first build
    with reporting(doctor), doctor.stage("doctor"):
        numbered = Steps(5, stage="doctor")
        numbered("source")
        clock[0] += 1.0
        numbered("graph breaks")  # the first step done: nothing to go by yet
        assert doctor.outlook() is None
        clock[0] += 4.0
        numbered("purity")  # 4 s a step after the first: three to go
        assert doctor.outlook() == "about 12s left of doctor (from the doctor's steps so far)" + FIRST_BUILD
    traced = Progress(io.StringIO())  # the build's doctor: its dynamo trace is not an eager call's time
    with reporting(traced), traced.stage("doctor"):
        numbered = Steps(5, stage="doctor", unlike=frozenset({2}))
        numbered("source")
        clock[0] += 1.0
        numbered("graph breaks")
        clock[0] += 5.0
        numbered("purity")  # the trace done: nothing of the eager steps to go by yet
        assert traced.outlook() is None
        clock[0] += 0.5
        numbered("signal")  # purity's 0.5 s, for each of the two left (5 s each had the trace counted)
        assert traced.outlook() == "about 1s left of doctor (from the doctor's steps so far)" + FIRST_BUILD
    # each step weighed by its eager calls (H41: "about 2s left" after purity's two calls, 19 s before
    # the end): purity's 0.5 s for two calls, then the signal's seven and the bf16 screen's seven
    counted = Progress(io.StringIO())
    with reporting(counted), counted.stage("doctor"):
        numbered = Steps(5, stage="doctor", unlike=frozenset({2}), weights=[2.0, 1.0, 2.0, 7.0, 7.0])
        for text, took in (("source", 1.0), ("graph breaks", 5.0), ("purity", 0.5)):
            numbered(text)
            clock[0] += took
        numbered("signal")
        assert counted.outlook() == "about 4s left of doctor (from the doctor's steps so far)" + FIRST_BUILD
    # a later build (H22's): "about 2m22s left (from the doctor's steps so far)" was the later stages'
    # figure, from the last build, with 3 s of the doctor left; the two are now said apart
    later = Progress(io.StringIO())
    later.expect({"doctor": 1.0, "export": 3.0, "compile": 130.0, "verify": 3.0, "package": 6.0})
    with reporting(later), later.stage("doctor"):
        numbered = Steps(5, stage="doctor", unlike=frozenset({2}))
        for text, took in (("source", 1.0), ("graph breaks", 5.0), ("purity", 1.5)):
            numbered(text)
            clock[0] += took
        numbered("signal")  # purity's 1.5 s for each of the two steps left
        assert later.outlook() == (
            "about 2m25s left of the build: 3s of doctor (revised, from the doctor's steps so far), then 2m22s for "
            "the stages after it (from earlier builds)"  # revised: past the last build's 1 s
        )
    # before the doctor has planned the compiles, no figure for them: the last build's (a search,
    # 2m09s) made a cached --no-search build's doctor say "about 2m31s left of the build", 18 s to go
    unplanned = Progress(io.StringIO())
    unplanned.expect({"doctor": 8.0, "export": 3.0, "verify": 3.0, "package": 6.0})
    with reporting(unplanned), unplanned.stage("doctor"):
        clock[0] += 2.0
        assert unplanned.outlook() == "about 6s left of doctor (from earlier builds)"
        numbered = Steps(5, stage="doctor", unlike=frozenset({2}))
        for text, took in (("source", 1.0), ("graph breaks", 5.0), ("purity", 1.5)):
            numbered(text)
            clock[0] += took
        numbered("signal")
        assert (
            unplanned.outlook() == "doctor stage running 2s past its estimate of 8s (from earlier builds)"
        )  # and nothing after it
    fresh = Progress(io.StringIO())  # a first build: no figure to run past
    with reporting(fresh), fresh.stage("verify"):
        steps = StepClock("verify", 4)
        clock[0] += 3.0
        steps.done(1)
        clock[0] += 2.0
        steps.done(2)
        assert fresh.outlook() == f"about 4s left of verify ({StepClock.BASIS})" + FIRST_BUILD


def test_a_first_build_guesses_its_compile_from_the_graph_scaled_by_earlier_builds_here(tmp_path, monkeypatch):
    """A model's first build has no earlier one to time its compile by: the graph's size gives a
    figure, scaled by how this machine compiled other models (their reports record their size)."""
    import torch

    from pipeline.features import first_guess
    from pipeline.targets import cpu

    program = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.ones(2, 4),))
    ops = first_guess.graph_ops(program)
    assert ops == 2  # linear, relu
    alone = first_guess.first_compile(program, cpu, tmp_path / "cache")
    assert alone == first_guess.Guess(
        pytest.approx(cpu.COMPILE_GUESS_S[0] + 2 * cpu.COMPILE_GUESS_S[1]), "a first guess from the graph's 2 ops"
    )
    for name, target, graph_ops, seconds, from_cache in (
        ("slow", "cpu", 100, 2 * first_guess.line_s(cpu, 100), False),  # this machine compiles at half the speed
        ("gpu", "cuda", 100, 500.0, False),  # another target's
        ("cached", "cpu", 100, 1.0, True),  # not compiled here
        ("old", "cpu", None, 1.0, False),  # from before reports recorded the graph's size
    ):
        (tmp_path / "cache" / f"build-{name}").mkdir(parents=True)
        report = {
            "target": target,
            "compile_search": {
                "graph_ops": graph_ops,
                "candidates": [{"name": "spec-options", "compile_s": seconds, "from_cache": from_cache}],
            },
        }
        (tmp_path / "cache" / f"build-{name}" / "model_x.report.json").write_text(json.dumps(report))
    scaled = first_guess.first_compile(program, cpu, tmp_path / "cache")
    assert scaled == first_guess.Guess(
        pytest.approx(2 * alone.seconds), "a first guess from the graph's 2 ops, scaled by 1 earlier build here"
    )
    # shown as the stage's estimate, and what it rests on when the compile runs past it
    progress = Progress(io.StringIO())
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    with progress.stage("compile"):
        progress.estimate(30.0, scaled.basis)
        clock[0] += 10.0
        # a first build: the figure is the stage's own, and it says the rest has none yet
        unknown = FIRST_BUILD
        assert progress.outlook() == f"about 20s left of compile ({scaled.basis}){unknown}"
        clock[0] += 25.0
        assert progress.outlook() == f"compile stage running 5s past the estimate ({scaled.basis}){unknown}"
        # no figure now, and what will give one: said, where no last build gives the stage one
        progress.estimate(None, StepClock("compile", 10).pending())
        assert progress.outlook() == (f"time left: known once 4 of its 10 cases are verified{unknown}")
        progress.expect({"compile": 60.0, "verify": 5.0})
        assert progress.outlook() == "about 30s left of the build (from earlier builds)"
    # in a search, the guess is the first compile's alone, and said so: "left of compile (for the first
    # compile only: …)" read to a newcomer as the stage's
    searching = Progress(io.StringIO())
    with searching.stage("compile"):
        searching.estimate(30.0, FIRST_COMPILE + scaled.basis)
        clock[0] += 10.0
        assert searching.outlook() == (
            f"about 20s left of the first compile ({scaled.basis}); the stage's figure comes once it is timed"
        )
        clock[0] += 25.0
        assert searching.outlook() == (
            f"the first compile running 5s past its estimate ({scaled.basis}); the stage's figure comes once it is "
            "timed"
        )
        # the stage's first figure, once the first compile is timed: not a revision of the first compile's
        searching.estimate(40.0)
        assert searching.outlook() == "about 40s left of compile (from this build's compiles)" + FIRST_BUILD


def test_parallel_builds_each_give_their_record(json_build, tmp_path):
    base, _, _ = json_build
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(TINY_SPEC.parent / "tiny_model.py", other / "tiny_model.py")
    (other / "spec.toml").write_text(TINY_SPEC.read_text().replace('name = "tiny"', 'name = "tiny_other"'))
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--spec",
        str(other / "spec.toml"),
        "--json",
        "--root",
        str(base / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(base / "build"),
        env={STATUS_ENV: "0.5"},
    )
    assert ran.code == 0, ran.err
    record = json.loads(ran.out)
    assert sorted(b["model"] for b in record["builds"]) == ["tiny", "tiny_other"] and record["failures"] == []
    # in a pipe, what each build is doing, from the status lines in its log, while they run
    status = [line for line in ran.err.splitlines() if line.startswith("    ... ")]
    assert any(re.search(rf"{re.escape(str(other / 'spec.toml'))}: \w+ .* in all · \d+s", line) for line in status), (
        ran.err
    )


def test_a_parallel_builds_line_is_its_logs_newest_status(tmp_path):
    log = tmp_path / "b.log"
    log.write_text(
        "==> export\n    export done in 2.0s\n==> compile: 4 candidate(s), chosen one to /o\n"
        "    ... compile 2/4 freezing: compiling · 40s in compile · 1m02s in all\n"
    )
    assert last_stage(log) == "compile 2/4 freezing: compiling · 40s in compile · 1m02s in all"
    with log.open("a") as handle:
        handle.write("    compile done in 50.0s\n==> verify\n")
    assert last_stage(log) == "verify"


class StepsSeen(Progress):
    """Plain lines to a buffer, and every status step the stages set, in order."""

    def __init__(self) -> None:
        super().__init__(io.StringIO())
        self.steps: list[str] = []

    def step(self, text: str) -> None:
        self.steps.append(text)
        super().step(text)


def test_the_doctor_numbers_its_steps_over_all_its_phases(tmp_path):
    """The build's doctor said 1/3 ... 3/3, then ran two unnumbered steps (signal, the search's
    candidates) that took 60 of its 94 s on the unet: its status now counts them all."""
    from pipeline import targets
    from pipeline.build_stages import BuildContext, doctor_stage
    from pipeline.spec import load_spec
    from pipeline.stages.compile import find_cxx
    from pipeline.stages.loader import load_model

    spec_file, progress = load_spec(TINY_SPEC), StepsSeen()
    ctx = BuildContext(
        spec_file=spec_file,
        target=targets.get("cpu"),
        work_dir=tmp_path / "work",
        out_dir=tmp_path / "opt" / "tiny" / "0.1" / "cpu",
        dist_dir=tmp_path / "dist",
        store=Cache(tmp_path / "cache"),
        progress=progress,
        overwrite=False,
        keep_debug=False,
    )
    with reporting(progress):
        doctor_stage(ctx, load_model(spec_file), find_cxx(), None)
    numbered = [re.match(r"(\d+)/(\d+): ", text) for text in progress.steps]
    assert all(numbered), progress.steps
    assert [(int(m[1]), int(m[2])) for m in numbered if m] == [(i, 5) for i in range(1, 6)], progress.steps
    assert progress.steps[-1].startswith("5/5: bf16 candidate: ")


def test_verify_names_each_case_as_it_runs(warm_dirs, tmp_path):
    """The unet's verify ran ten cases for 100 s with a status that said only `verify`: how far along
    it is, is the case it runs of how many. The session build's compiled model, from the build cache."""
    from pipeline import targets
    from pipeline.features import tune
    from pipeline.services.outdir import output_path
    from pipeline.spec import load_spec
    from pipeline.stages.compile import compile_model, find_cxx
    from pipeline.stages.export import prepare
    from pipeline.stages.loader import load_model
    from pipeline.stages.verify import verify_model
    from pipeline.stages.verify_cases import verification_cases

    spec_file = load_spec(TINY_SPEC)
    exported = prepare(spec_file, load_model(spec_file), targets.get("cpu"))
    (_, plan), *_ = tune.plans(exported, find_cxx(), output_path(warm_dirs.root, "tiny", "0.1", "cpu"))[0]
    plan.compile_dir.mkdir(parents=True)  # the build's claim of the output folder makes it
    compiled = compile_model(exported, plan, tmp_path / "work", Cache(warm_dirs.build / "cache"))
    assert compiled.from_cache
    names = [case.name for case in verification_cases(exported)]
    for doing in ("", "1/4 spec-options: verifying "):
        progress = StepsSeen()
        with reporting(progress):
            verify_model(exported, compiled, tmp_path / "work", None, doing)
        assert progress.steps == [f"{doing}case {k}/{len(names)} {name}" for k, name in enumerate(names, 1)]
    assert len(names) == 10 and names[0] == "seed0"


def test_the_compile_stages_counts_add_up_with_the_lines_after_it():
    """A newcomer read "compile: 4 candidate(s)", then "candidate bf16-autocast: not tried", then "any of
    the 3 other candidate(s)": five, four or three? Now four to try, one not tried, three after the first."""
    from pipeline.features.rounds import Timed
    from pipeline.features.tune import compile_header

    out = Path("/opt/m/unet/1.3/cpu")
    held = " (held while the build runs; the wheel carries the files)"  # a newcomer found the folder empty after it
    assert compile_header(4, ["bf16-autocast"], out) == (
        "4 candidates to try, as the search's budget allows (and 1 not tried: bf16-autocast, below); "
        "the chosen one to /opt/m/unet/1.3/cpu" + held
    )
    assert (
        compile_header(3, [], out)
        == "3 candidates to try, as the search's budget allows; the chosen one to /opt/m/unet/1.3/cpu" + held
    )
    assert compile_header(1, [], out) == "1 candidate, into /opt/m/unet/1.3/cpu" + held
    # those the budget likely leaves out are not counted as allowed (H47: "4 … as the search's budget
    # allows", and the next line called 3 of them likely beyond it)
    assert compile_header(4, [], out, beyond=3).startswith(
        "4 candidates to try, of which the search's budget likely allows 1; the chosen one to"
    )
    noise = Timed(rounds_ms=(358.0, 1624.0, 522.0, 395.0, 5740.0))
    assert "for any of the 3 candidates after spec-options to win" in payback.stopped_line(noise, "spec-options", 3)
    assert "for the 1 candidate after spec-options to win" in payback.stopped_line(noise, "spec-options", 1)


def test_a_stage_the_last_build_did_in_no_time_gives_the_builds_figure(monkeypatch):
    """'load stage finishing, at its estimate of 0s' came at the start of every build after the first."""
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    progress = Progress(io.StringIO())
    progress.expect({"load": 0.2, "doctor": 5.0, "export": 1.0, "compile": 30.0, "verify": 2.0, "package": 4.0})
    with progress.stage("load"):
        clock[0] += 0.1
        assert progress.outlook() == "about 42s left of the build (from earlier builds)"
