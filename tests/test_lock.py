"""The compile options, locked (pipeline/features/lock.py): what the option search chose is kept
beside the spec, keyed by what decided it (target, CPU kind, torch, the spec's [compile] keys). A
build with the matching entry uses it and runs no search; an entry for another key is never used,
and the build says why. These tests read, match and write the file; the last builds (one fresh compile)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from pipeline import targets
from pipeline.errors import OutputDirError, SpecError
from pipeline.features import lock
from pipeline.spec import load_spec

from .conftest import GOOD, run_cli, spec_copy

COMPILE = {"autocast": None, "freezing": False, "inductor": {}, "max_autotune": False}
KEY = lock.Key("cpu", "AVX2", "2.13.0+cpu", COMPILE)


def test_the_lock_sits_beside_the_spec_named_after_it(tmp_path):
    assert lock.lock_path(Path("models/unet/spec.toml")) == Path("models/unet/spec.lock.json")
    assert lock.lock_path(Path("specs/vit-small.toml")) == Path("specs/vit-small.lock.json")
    assert lock.lock_path(Path("ckpt/config.json")) is None  # a --hf folder alone: nothing written into it


def test_a_written_choice_is_found_for_its_own_key_only(tmp_path):
    path = tmp_path / "spec.lock.json"
    assert lock.find(path, KEY) == (None, "")  # no file: the search runs, nothing to say
    lock.write(path, KEY, "freezing", {"freezing": True})
    found, note = lock.find(path, KEY)
    assert (found.chosen, found.overrides, found.path, note) == ("freezing", {"freezing": True}, path, "")
    other_torch = lock.Key("cpu", "AVX2", "2.14.0+cpu", COMPILE)
    assert lock.find(path, other_torch) == (
        None,
        "spec.lock.json has a cpu entry for torch '2.13.0+cpu', not this build's '2.14.0+cpu': ignored",
    )
    other_kind = lock.Key("cpu", "AVX512", "2.13.0+cpu", COMPILE)
    assert lock.find(path, other_kind)[1] == (
        "spec.lock.json has a cpu entry for cpu kind 'AVX2', not this build's 'AVX512': ignored"
    )
    other_spec = lock.Key("cpu", "AVX2", "2.13.0+cpu", {**COMPILE, "max_autotune": True})
    assert lock.find(path, other_spec)[1] == (
        "spec.lock.json has a cpu entry for other [compile] keys than the spec's: ignored"
    )
    assert lock.find(path, lock.Key("cuda", "sm_90", "2.13.0+cu130", COMPILE)) == (None, "")  # no cuda entry at all


def test_update_replaces_its_own_entry_and_keeps_the_others(tmp_path):
    path = tmp_path / "spec.lock.json"
    avx512 = lock.Key("cpu", "AVX512", "2.13.0+cpu", COMPILE)
    lock.write(path, KEY, "freezing", {"freezing": True})
    lock.write(path, avx512, "max-autotune", {"max_autotune": True})
    lock.write(path, KEY, "spec-options", {})  # --update-lock chose otherwise
    data = json.loads(path.read_text())
    assert data["format"] == 1 and "commit it with the spec" in data["about"]
    assert [(e["cpu_kind"], e["chosen"]) for e in data["entries"]] == [
        ("AVX2", "spec-options"),
        ("AVX512", "max-autotune"),
    ]
    assert lock.find(path, avx512)[0].chosen == "max-autotune"
    assert list(tmp_path.iterdir()) == [path]  # written aside, then renamed: nothing left over


@pytest.mark.parametrize("text", ["{not json", '{"format": 2, "entries": []}', '{"format": 1, "entries": {}}'])
def test_a_damaged_lock_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / "spec.lock.json"
    path.write_text(text)
    with pytest.raises(SpecError) as refused:
        lock.find(path, KEY)
    assert refused.value.message.startswith(f"{path}: ")
    assert refused.value.hint == "restore it from version control, or delete it and build with --update-lock"


def test_no_search_neither_uses_nor_writes_the_lock(tmp_path, monkeypatch):
    """--no-search (with_overrides(search=False), as the build command applies it) compiles the
    spec's options alone: a matching entry beside the spec is not used, and nothing is written."""
    import torch

    from pipeline.spec import with_overrides

    spec = spec_copy(tmp_path / "m", GOOD.replace("search = false", "search = true"))
    path = tmp_path / "m" / "spec.lock.json"
    searched = load_spec(spec)
    compile_keys = lock.compile_keys(searched.spec.compile.model_dump(mode="json"))
    kind = targets.get("cpu").machine()
    lock.write(path, lock.Key("cpu", kind, torch.__version__, compile_keys), "freezing", {"freezing": True})
    before, said = path.read_bytes(), []
    assert lock.consult(searched, "cpu", kind, False, said.append)[1].chosen == "freezing"  # found without the flag
    said.clear()
    assert lock.consult(with_overrides(searched, search=False), "cpu", kind, False, said.append) == (None, None)
    assert said == [
        "    spec.lock.json has this build's entry (freezing), not used: the option search is off, so the spec's "
        "own options are compiled"
    ]
    assert path.read_bytes() == before
    lock.write(path, lock.Key("cpu", kind, torch.__version__, compile_keys), "spec-options", {})
    said.clear()  # an entry of the spec's own options is what --no-search compiles: nothing to say
    assert lock.consult(with_overrides(searched, search=False), "cpu", kind, False, said.append) == (None, None)
    assert said == []
    # and it compiles what the search compiled first under the same key: a newcomer's --no-search
    # build recompiled the spec's options a search had cached a minute before
    import sys

    from pipeline.stages.compile import plan_compile
    from pipeline.stages.export import prepare
    from pipeline.stages.loader import load_model

    monkeypatch.setattr(sys, "path", list(sys.path))  # the spec's folder, added by the factory's import
    monkeypatch.delitem(sys.modules, "tiny_model", raising=False)  # this spec's copy, not another test's
    keys = {
        plan_compile(prepare(spec, load_model(spec), targets.get("cpu")), "g++ 12", tmp_path).key
        for spec in (searched, with_overrides(searched, search=False))
    }
    assert len(keys) == 1, keys


def test_a_build_ignores_another_torchs_entry_searches_then_builds_from_its_own(tmp_path):
    """One fresh compile: the budget stops the search after the spec's own options. The first build
    finds only an entry for another torch (said, ignored) and searches; compared with nothing, it
    locks nothing. A build with this torch's entry (as a search that decided writes it) uses it and
    runs no search, and makes the searching build's wheel. The first build is also the search stopped at its
    budget (what tests/test_tune.py had a build of its own for): the candidates it left out are said,
    and recorded in the report and, without their seconds, in the wheel's manifest."""
    import zipfile

    import torch

    # compiled even where the machine is noisy: the budget, not the noise, must stop the search here
    keys = "search = true\nsearch_budget_s = 0.5\nsearch_when_noisy = true"
    spec = spec_copy(tmp_path / "m", GOOD.replace("search = false", keys))
    path = tmp_path / "m" / "spec.lock.json"
    compile_keys = lock.compile_keys(load_spec(spec).spec.compile.model_dump(mode="json"))
    kind = targets.get("cpu").machine()
    lock.write(path, lock.Key("cpu", kind, "2.0.0+cpu", compile_keys), "freezing", {"freezing": True})
    args = ["--root", str(tmp_path / "opt"), "--build-dir", str(tmp_path / "build")]
    first = run_cli("build", "--spec", str(spec), "--dist", str(tmp_path / "dist"), *args)
    assert first.code == 0, first.err
    assert (
        f"    spec.lock.json has a cpu entry for torch '2.0.0+cpu', not this build's '{torch.__version__}': ignored: "
        "the option search runs, and its choice is added to spec.lock.json"
    ) in first.err.splitlines()
    assert (
        "    candidate freezing: not tried: over the search's compile budget (compile seconds, summed over" in first.err
    )
    assert "over its budget of 0.5 s ([compile] search_budget_s)" in first.err
    report = json.loads(next((tmp_path / "dist").glob("*.report.json")).read_text())
    search = report["compile_search"]
    assert [c["name"] for c in search["candidates"]] == ["spec-options"] and search["chosen"] == "spec-options"
    assert {"freezing", "max-autotune"} <= {s["name"] for s in search["not_tried"]}
    assert "budget of 0.5 s" in {s["name"]: s["reason"] for s in search["not_tried"]}["freezing"]
    # the wheel's manifest keeps the reason without its measured seconds, which differ run to run
    with zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))) as archive:
        recorded = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("/manifest.json"))))
    reasons = {s["name"]: s["reason"] for s in recorded["compile_search"]["not_tried"]}
    assert reasons["freezing"] == "over the search's compile budget (the build's report has the seconds)", reasons
    # the summary names what the budget left out, beside what the search cost
    assert re.search(
        r"^  search    no candidate compiled \(.*freezing.* left out by its compile budget\); timed [\d.]+s; "
        r"won nothing",
        first.err,
        re.M,
    ), first.err
    # its budget left room for no candidate beyond the first: compared with nothing, nothing is locked (H46:
    # such a lock kept a later build with a larger budget from ever searching)
    assert (
        "    the search did not decide (its compile budget left room for no candidate beyond spec-options): nothing "
        f"locked in {path} (a later build searches again, unless it reuses this one from the build cache)"
    ) in first.err.splitlines(), first.err
    assert [e["torch"] for e in json.loads(path.read_text())["entries"]] == ["2.0.0+cpu"]
    # the entry a search that decided would write, with the search's record: a build from it makes its wheel
    with zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))) as archive:
        record = json.loads(archive.read("model_tiny/manifest.json"))["compile_search"]
    this_torch = lock.Key("cpu", kind, torch.__version__, compile_keys)
    lock.write(path, this_torch, "spec-options", {}, {k: v for k, v in record.items() if k != "chosen"}, "decided")
    again = run_cli("build", "--spec", str(spec), "--dist", str(tmp_path / "dist2"), *args)
    assert again.code == 0, again.err
    assert (
        f"    compile options from {path} (cpu, CPU kind {kind}, torch {torch.__version__}): spec-options, as the "
        "search chose there; no option search (--update-lock searches again)"
    ) in again.err.splitlines()
    assert "not tried" not in again.err and "search:" not in again.err
    # the reason is the search's that wrote the lock: "measured in this run" read as this build's
    said = (
        f"    chose spec-options: locked in {path.name} (the entry's reason, from the search that wrote it, timed "
        "where it ran: decided)"
    )
    assert said in again.err, again.err
    first_wheel, second_wheel = (next((tmp_path / d).glob("*.whl")) for d in ("dist", "dist2"))
    assert first_wheel.read_bytes() == second_wheel.read_bytes(), "built from the lock: the search's own wheel"
    # its own entry gone (a search that locked nothing), the other torch's ignored again: an unchanged build
    # reuses the first from the build cache, and says nothing of a search it does not run (a newcomer's
    # said "the option search runs, and its choice is added to spec.lock.json", then took 3 s)
    entries = json.loads(path.read_text())["entries"]
    path.write_text(
        json.dumps({**json.loads(path.read_text()), "entries": [e for e in entries if e["torch"] == "2.0.0+cpu"]})
    )
    third = run_cli("build", "--spec", str(spec), "--dist", str(tmp_path / "dist3"), *args)
    assert third.code == 0, third.err
    assert "reusing its verified wheel" in third.err and "spec.lock.json" not in third.err, third.err


def test_a_search_refused_at_dist_still_says_what_it_locks_before_the_refusal(tmp_path):
    """A newcomer's search decided, dist/ then refused its wheel (exit 10), and nothing was locked:
    the next build searched again. The choice is this machine's whatever dist/ holds, so what the
    search locks is done and said before the refusal (here: nothing, its budget kept it from comparing)."""
    keys = "search = true\nsearch_budget_s = 0.5\nsearch_when_noisy = true"  # one fresh compile, as above
    spec = spec_copy(tmp_path / "m", GOOD.replace("search = false", keys))
    dist, root = str(tmp_path / "dist"), ["--root", str(tmp_path / "opt")]
    # dist/ holds a --keep-debug build's wheel: another wheel of the same model and options
    args = ["--dist", dist, *root]
    kept = run_cli(
        "build", "--spec", str(spec), *args, "--no-search", "--keep-debug", "--build-dir", str(tmp_path / "b1")
    )
    assert kept.code == 0, kept.err
    searched = run_cli("build", "--spec", str(spec), *args, "--build-dir", str(tmp_path / "b2"))
    assert searched.code == OutputDirError.exit_code, searched.err
    path = tmp_path / "m" / "spec.lock.json"
    said = (
        "the search did not decide (its compile budget left room for no candidate beyond spec-options): nothing "
        f"locked in {path}"
    )
    assert said in searched.err, searched.err
    assert searched.err.index(said) < searched.err.index("error: "), "said before the refusal"
    assert not path.exists()
    # a wheel that differs from dist/'s only in the search's record is kept, and the build ends 0: H42's
    # plain builds after an --update-lock were all refused ("nothing to do"), the lock holding the new record
    other = ["--dist", str(tmp_path / "dist2"), *root, "--build-dir", str(tmp_path / "b2")]
    assert run_cli("build", "--spec", str(spec), *other, "--no-search").code == 0
    plain = run_cli("build", "--spec", str(spec), *other)  # the lock's entry: its record is the search's
    assert plain.code == 0, plain.err
    assert "    kept " in plain.err and "their manifests differ only in compile_search (only its record: " in plain.err
    assert "\nkept model_tiny-0.1+cpu" in plain.err, plain.err


# A build whose timing rounds are wide, as a busy machine's: noise cannot be made on demand, so the
# rounds are given here; the rest runs for real, in a process of its own (a crash at its exit counts).
# Spread 3.9x, none over twice the median (those would be stalls, left out of the range)
WIDE_ROUNDS = (
    "import sys\n"
    "from pipeline.features import rounds\n"
    "wide = rounds.Timed((1.0, 1.4, 2.0, 3.0, 3.9))\n"
    "rounds.time_in_rounds = lambda calls, *a, **k: {name: wide for name in calls}\n"
    "from pipeline.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("entry", ["freezing", "spec-options"])
def test_an_update_lock_search_that_does_not_decide_keeps_the_entry_and_builds_it(tmp_path, entry):
    """H43: --update-lock's search, stopped by the noise, shipped the spec's options while the lock
    kept freezing; dist/ refused the wheel, and the refusal's hint rebuilt the lock's. H44: where
    the entry was the spec's options, the build compiled them again over the .so it had loaded,
    and crashed at its exit."""
    import subprocess
    import sys

    import torch

    spec = spec_copy(tmp_path / "m", GOOD.replace("search = false", "search = true"))
    kind = targets.get("cpu").machine()
    keys = lock.compile_keys(load_spec(spec).spec.compile.model_dump(mode="json"))
    path = tmp_path / "m" / "spec.lock.json"
    overrides = {"freezing": True} if entry == "freezing" else {}
    lock.write(path, lock.Key("cpu", kind, torch.__version__, keys), entry, overrides)
    before = path.read_text()
    args = ["build", "--spec", str(spec), "--update-lock", "--root", str(tmp_path / "opt")]
    args += ["--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")]
    ran = subprocess.run([sys.executable, "-c", WIDE_ROUNDS, *args], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert "search stopped before compiling a candidate" in ran.stderr, ran.stderr
    # spec-options is the search's own first candidate, compiled already (H50 read "compiles it" as another)
    then = (
        "the candidate this build compiled already"
        if entry == "spec-options"
        else "and this build compiles it, as one without --update-lock does"
    )
    assert (
        "    --update-lock: the search did not decide (the noise stopped it), so spec.lock.json's entry for builds "
        f"like this one stays ({entry}), {then}"
    ) in ran.stderr.splitlines(), ran.stderr
    assert "nothing locked" not in ran.stderr and path.read_text() == before, "the entry stays as it was"
    report = json.loads(next((tmp_path / "dist").glob("*.report.json")).read_text())
    assert report["compile_search"]["chosen"] == entry and report["compile_search"]["locked"] == str(path)
    # with what the search cost (H65: the row alone left out the 149 s it had taken)
    row = f"  search    --update-lock kept spec.lock.json's entry ({entry}): "
    row += "the search did not decide (the noise stopped it); "
    assert re.search(
        re.escape(row) + r"stopped by the noise before compiling a candidate \(\S+ spread[^)]*\); timed \d+\.\ds$",
        ran.stderr,
        re.M,
    ), ran.stderr
    if entry == "freezing":  # H54: where dist/ refuses it, the line before the error says what plain builds make
        # H65: --no-search into this dist/ (its wheel chose freezing) is refused before the doctor, not after its work
        early = run_cli("build", "--spec", str(spec), "--no-search", *args[4:])
        assert early.code == OutputDirError.exit_code, early.err
        assert "==> doctor" not in early.err and "this build stops here, before the doctor" in early.err, early.err
        choices = "compile_search (the options chosen): freezing in the kept wheel, spec-options in this build"
        assert choices in early.err, early.err
        assert "error: " in early.err and "the same model with other compile options chosen" in early.err
        # and the quick way, which holds (H67 was offered only another --dist or --overwrite)
        assert early.err.rstrip().endswith(
            "; or keep dist/'s wheel, as the same build without --no-search does (from the build cache, with no search)"
        ), early.err
        plain = run_cli("build", "--spec", str(spec), *args[4:])
        assert plain.code == 0 and "(the same bytes as dist/'s wheel: left as it is)" in plain.err, plain.err
        assert "    search: " not in plain.err and "reused the compiled model from build cache" in plain.err
        other = [*args[:-4], "--dist", str(tmp_path / "dist-other"), *args[-2:]]
        assert run_cli("build", "--spec", str(spec), "--no-search", *other[4:]).code == 0
        refused = subprocess.run(
            [sys.executable, "-c", WIDE_ROUNDS, *other], capture_output=True, text=True, timeout=600
        )
        assert refused.returncode == OutputDirError.exit_code, refused.stderr
        assert (
            "    the lock's entry still names freezing: until dist/ takes this build (--overwrite), plain builds make "
            "it and dist/ refuses them alike; the hint below says the ways on"
        ) in refused.stderr.splitlines(), refused.stderr
        # H51: once compiled (by the first run), the entry comes from the build cache, and the line says so
        assert (
            "    --update-lock: the search did not decide (the noise stopped it), so spec.lock.json's entry for "
            "builds like this one stays (freezing), and this build takes it from the build cache, as one without "
            "--update-lock does"
        ) in refused.stderr.splitlines(), refused.stderr
        assert "reused the compiled model from build cache" in refused.stderr


def deciding_search(tmp_path: Path) -> list[str]:
    """A spec whose search decides without compiling another candidate (an earlier build, its report
    in the build cache, measured each slower), and the build's arguments."""
    spec = spec_copy(tmp_path / "m", GOOD.replace("search = false", "search = true\nsearch_when_noisy = true"))
    slower = ("freezing", "freezing+channels-last", "max-autotune", "bf16-autocast")
    timings = [{"name": "spec-options", "median_ms": 1.0, "compile_s": 10.0}]
    timings += [{"name": name, "median_ms": 1.25, "compile_s": 10.0} for name in slower]
    earlier = tmp_path / "build" / "cache" / "build-earlier"
    earlier.mkdir(parents=True)
    (earlier / "model_tiny-0.1.report.json").write_text(
        json.dumps({"model": "tiny", "target": "cpu", "compile_search": {"candidates": timings}})
    )
    args = ["--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist")]
    return args + ["--build-dir", str(tmp_path / "build")]


def test_a_lock_written_by_a_build_dist_refused_is_said_and_later_builds_are_that_build_whole(tmp_path):
    """H47: --update-lock chose other options, dist/ refused its wheel, and every plain build after it
    was refused alike (17 s each, doctor, verify and package again), with no word that the lock changed.
    H46: the entry a search wrote made another build-cache key, so the plain build after it ran its
    doctor, verify and package again (1m16s) for the same wheel. One search serves both."""
    args = deciding_search(tmp_path)
    kept = run_cli("build", *args, "--no-search", "--keep-debug")  # dist/: another wheel of the same model
    assert kept.code == 0, kept.err
    refused = run_cli("build", *args)
    assert refused.code == OutputDirError.exit_code, refused.err
    assert "    wrote the search's choice (spec-options" in refused.err, refused.err
    # no "commit the file" here: a newcomer (H54) read it two lines before dist/ refused the build
    assert "commit the file" not in refused.err, refused.err
    # its reason, kept in the lock and quoted by later builds, is whole: not "(the lines above say why)"
    why = json.loads((tmp_path / "m" / "spec.lock.json").read_text())["entries"][0]["why"]
    assert why.startswith("no other candidate was compiled (") and "cannot pay back its compile" in why, why
    said = (
        "    the lock's entry now names spec-options: until dist/ takes this build (--overwrite), plain builds make "
        f"it and dist/ refuses them alike; to go back, remove {tmp_path / 'm' / 'spec.lock.json'} (this build made "
        "it): a build without an entry then searches again"
    )
    assert said in refused.err.splitlines(), refused.err
    assert refused.err.index(said) < refused.err.index("error: ")
    # the hint, last on screen, ends with the way back too (H62 scrolled up two lines for it)
    hint = refused.err.rstrip().splitlines()[-1]
    assert hint.startswith("hint: ") and hint.endswith(
        f"; or go back: remove {tmp_path / 'm' / 'spec.lock.json'} (this build made it) (above)"
    ), refused.err
    again = run_cli("build", *args)  # the refused build, whole, from the build cache: refused alike, at once
    assert again.code == OutputDirError.exit_code and "reusing its verified wheel" in again.err, again.err
    assert "==> doctor" not in again.err, again.err
    # without the file, as before the refused build, a build searches again, as the line said: the refused build
    # waits under its entry's key alone (H52 removed the file and got the refused build again; H61 too, after
    # `git checkout` of a lock with no entry for it); here it decides as before, and is refused as before
    entries = (tmp_path / "m" / "spec.lock.json").read_text()
    (tmp_path / "m" / "spec.lock.json").unlink()
    without = run_cli("build", *args)
    assert without.code == OutputDirError.exit_code and "reusing its verified wheel" not in without.err, without.err
    assert "    wrote the search's choice (spec-options" in without.err, without.err
    (tmp_path / "m" / "spec.lock.json").write_text(entries)
    overwritten = run_cli("build", *args, "--overwrite")
    assert overwritten.code == 0 and "reusing its verified wheel" in overwritten.err, overwritten.err
    later = run_cli("build", *args)  # the build the lock's entry makes, as the search made it
    assert later.code == 0 and "reusing its verified wheel" in later.err, later.err
    assert "compile options from" in later.err and "==> doctor" not in later.err, later.err
    # the search row is the cached build's: this run searched nothing (H47 read it as its own)
    rows = [line for line in later.err.splitlines() if line.startswith("  search    ")]
    assert rows and rows[0].startswith("  search    the cached build's: "), later.err


def test_the_way_back_from_a_refused_lock_write_restores_the_file_as_it_was(tmp_path, monkeypatch):
    """H51: the refusal's "`git checkout` the lock file to go back" dropped the entry a newcomer's
    own first build had written and never committed, where going back meant that entry. The file as
    it was is kept in the build folder, and the line gives the command that puts it back, also where it
    had no entry for the build (the refused build then waits under its entry's key alone)."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    spec = spec_copy(tmp_path / "m", GOOD)
    ours, other = lock.Key("cpu", "AVX512", "2.13.0+cpu", {}), lock.Key("cpu", "AVX2", "2.13.0+cpu", {})
    path = tmp_path / "m" / "spec.lock.json"
    lock.write(path, other, "freezing", {})
    without_ours = lock.Before.of(spec, ours)
    lock.write(path, ours, "freezing", {})
    committed = path.read_text()
    before = lock.Before.of(spec, ours)
    lock.write(path, ours, "max-autotune", {"max_autotune": True})  # the refused build's search
    kept_in = tmp_path / "build" / "tiny" / "0.1" / "cpu"
    plain = "until dist/ takes this build (--overwrite), plain builds make it and dist/ refuses them alike; "
    back = "`cp build/tiny/0.1/cpu/spec.lock.json.before m/spec.lock.json`"
    said, hint_end = before.refused("max-autotune", kept_in)
    assert said == (
        f"    the lock's entry now names max-autotune: {plain}to go back to the lock as it was (its entry: freezing), "
        + back
    )
    assert hint_end == f"put the lock back: {back}"  # for the end of dist/'s hint, the last line on screen (H62)
    # H53: a second refused search that chose max-autotune again keeps the way back the first offered
    assert lock.Before.of(spec, ours).refused("max-autotune", kept_in) == (
        f"    the lock's entry still names max-autotune: {plain}to go back to the lock as it was before an earlier "
        f"build changed it (its entry: freezing), {back}",
        f"put the lock back as it was before an earlier build changed it: {back}",
    )
    subprocess.run(said.split("`")[1], shell=True, check=True)  # the command as the line gives it
    assert path.read_text() == committed
    # no entry before: the lock as it was is the way back too (H61's `git checkout` of it led back nowhere),
    # and a build without the entry is the build before this one (where the build cache holds it) or a search
    assert without_ours.refused("max-autotune", tmp_path / "b2")[0] == (
        f"    the lock's entry now names max-autotune: {plain}to go back to the lock as it was (no entry for builds "
        "like this one), `cp b2/spec.lock.json.before m/spec.lock.json`: a build without an entry then searches again"
    )
    assert without_ours.refused("max-autotune", tmp_path / "b2", earlier=True)[0].endswith(
        "`: a build without an entry then reuses the build before this one, from the build cache"
    )
    # H56: a second refused search that chose other options again (max-autotune, then spec-options):
    # the lock as it found it names options dist/ refuses too, so the way back stays the one an earlier
    # refusal kept, the lock as it was with dist/'s options (freezing)
    lock.write(path, ours, "max-autotune", {"max_autotune": True})
    assert lock.Before.of(spec, ours).refused("spec-options", kept_in, dist_chosen="freezing")[0] == (
        f"    the lock's entry now names spec-options: {plain}to go back to the lock as it was before an earlier "
        f"build changed it (its entry: freezing), {back}"
    )
    assert lock.find(kept_in / "spec.lock.json.before", ours)[0].chosen == "freezing", "the earlier copy is kept"
    # where no kept copy leads to dist/'s options, no way back is offered as one
    assert lock.Before.of(spec, ours).refused("spec-options", tmp_path / "elsewhere", dist_chosen="freezing") == (
        f"    the lock's entry now names spec-options: {plain}no way back through the lock leads to dist/'s options "
        "(freezing): as this build found it, its entry named max-autotune, which dist/ refuses too; the hint below "
        "says the ways on",
        "",
    )
    # where the lock as the build found it names dist/'s options, it is the way back, as before
    lock.write(path, ours, "freezing", {})
    assert (
        lock.Before.of(spec, ours)
        .refused("spec-options", kept_in, dist_chosen="freezing")[0]
        .endswith(f"to go back to the lock as it was (its entry: freezing), {back}")
    )
    # a build folder the copy cannot go in (another user's, or a file in its place): the way back said
    # in words, and the refusal that follows stays the error
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    assert before.refused("max-autotune", blocked / "cpu")[0].endswith(
        "to go back, restore m/spec.lock.json as it was before this build (its entry: freezing; no copy of it could "
        "be kept in blocked/cpu: Not a directory)"
    )


def test_a_search_with_no_spec_file_says_its_choice_is_locked_nowhere(tmp_path):
    """H48: a --hf build without --spec searched and chose, and said nothing of a lock, where the unet's
    and a BERT's with --spec had said "wrote the search's choice … to …lock.json"."""
    from pipeline.spec import SpecFile

    spec = load_spec(spec_copy(tmp_path / "m", GOOD.replace("search = false", "search = true"))).spec
    said: list[str] = []
    key, locked = lock.consult(
        SpecFile(path=tmp_path / "vit" / "config.json", spec=spec), "cpu", "AVX2", False, said.append
    )
    assert key is None and locked is None
    assert said == [
        "    the search's choice is locked nowhere: a --hf build without --spec has no spec file for a lock beside it "
        "(with --spec FILE, FILE's .lock.json keeps it; an unchanged rebuild reuses this build from the build cache)"
    ]


def test_a_refused_builds_entry_is_put_back_as_it_was(tmp_path):
    """H61: after an --update-lock search chose other options and dist/ refused the wheel, `git checkout`
    of the lock led back nowhere: the build cache's entry for builds without a lock entry held the refused
    build. The build sets that entry aside before it stores its own, and puts it back once a lock entry
    holds the refused build (under that entry's key): the earlier build's files, or no entry."""
    from pipeline.services.cache import Cache

    store = Cache(tmp_path / "cache")
    (tmp_path / "earlier.whl").write_text("dist/'s build")
    (tmp_path / "refused.whl").write_text("the refused build")
    store.store("build-k0", (tmp_path / "earlier.whl",))
    aside = store.set_aside("build-k0")
    store.store("build-k0", (tmp_path / "refused.whl",))  # the refused build replaces it, as commit() stores it
    store.copy_entry("build-k0", "build-k1")  # and the lock entry's key holds it (_lock_choice)
    store.put_back("build-k0", aside)
    assert [p.name for p in (tmp_path / "cache" / "build-k0").iterdir()] == ["earlier.whl"]
    assert (tmp_path / "cache" / "build-k0" / "earlier.whl").read_text() == "dist/'s build"
    assert [p.name for p in (tmp_path / "cache" / "build-k1").iterdir()] == ["refused.whl"]
    assert not list((tmp_path / "cache").glob(".*")), "nothing left aside"
    # no entry before: none after (a build without the lock entry searches again)
    assert store.set_aside("build-k2") is None
    store.store("build-k2", (tmp_path / "refused.whl",))
    store.put_back("build-k2", None)
    assert not (tmp_path / "cache" / "build-k2").exists()


def _tuned(chosen: str, spreads: dict[str, tuple[float, float]]):
    """A search's record as --update-lock weighs it against the entry: each candidate's fastest and
    slowest round (the compiled model and plan play no part in that)."""
    from pipeline.features.search import Trial
    from pipeline.features.tune import Tuned

    trials = tuple(Trial(name, {}, True, sum(s) / 2, False, spread_ms=s) for name, s in spreads.items())
    return Tuned(compiled=None, chosen=chosen, plan=None, trials=trials)  # type: ignore[arg-type]


def test_update_lock_replaces_the_entry_only_with_options_faster_beyond_the_noise():
    """H66: three --update-lock searches minutes apart locked freezing, freezing+channels-last, then
    spec-options, the first by a 0.4 ms round: the entry now stays unless the new choice beats it
    by the rule the search holds the spec's options to."""
    from pipeline.summary import search_lines

    rounds = {"spec-options": (91.0, 92.7), "freezing": (88.1, 90.6), "freezing+channels-last": (87.4, 89.9)}
    kept = _tuned("freezing", rounds).keeps_entry("freezing+channels-last")
    assert kept == (
        "the search's freezing is not faster than the entry's freezing+channels-last beyond the noise (its slowest "
        "round, 90.6 ms, is not under freezing+channels-last's fastest, 87.4 ms)"
    )
    # spec-options kept by a search (no candidate beat it) does not replace a timed entry either
    assert _tuned("spec-options", rounds).keeps_entry("freezing").startswith("the search's spec-options is not")
    assert _tuned("freezing", {**rounds, "freezing": (80.0, 82.0)}).keeps_entry("freezing+channels-last") == ""
    assert _tuned("freezing", rounds).keeps_entry("freezing") == ""  # the same choice: its timings are written
    assert _tuned("freezing", rounds).keeps_entry("max-autotune") == ""  # the entry's options were not timed here
    # the summary's row says which it was
    record = {"chosen": "freezing+channels-last", "locked": "m/spec.lock.json", "entry_kept": True}
    record["entry_kept_why"] = kept
    row = "  search    --update-lock kept spec.lock.json's entry (freezing+channels-last): "
    assert search_lines(record) == [row + kept]
    # with what this search compiled, named (H67: the row gave "1 candidate(s)" and no name), and cost
    from pipeline.features.payback import Cost

    record["cost"] = dataclasses.asdict(Cost(compiled=1, compile_s=81.0, verify_s=5.8, noise_s=1.0, timing_s=2.0))
    record["searched_candidates"] = [{"name": "spec-options", "from_cache": True}, {"name": "max-autotune"}]
    assert search_lines(record) == [
        row + kept + "; 1 candidate(s) beyond spec-options compiled (max-autotune) in 81.0s (and spec-options from "
        "the build cache), verified in 5.8s; timed 3.0s (1.0s of it spec-options alone, for the noise)"
    ]
