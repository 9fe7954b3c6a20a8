"""dist/ keeps the wheel that was tested: a rebuild of the same version with other contents is
refused (it silently replaced the wheel before), unless --overwrite says to replace it."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.errors import OutputDirError
from pipeline.services import dist_guard
from pipeline.services.manifest import sha256_file
from pipeline.services.progress import Progress, reporting

from .conftest import GOOD, TINY_SPEC, run_cli, spec_copy


def with_manifest(wheel: Path, new_wheel: Path, **changed: object) -> Path:
    """``wheel`` copied to ``new_wheel`` with its manifest's keys ``changed``: another build's wheel."""
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(new_wheel, "w") as made:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "model_tiny/manifest.json":
                data = json.dumps({**kept, **changed}).encode()
            made.writestr(item, data)
    return new_wheel


def test_a_changed_model_under_the_same_version_does_not_replace_the_tested_wheel(tmp_path, warm_dirs, tiny_build):
    """The model's description changes and its version does not: another wheel of the same name.
    The spec is part of the content hash the kept wheel's manifest records, so the build is refused
    before its doctor (a newcomer's changed --hf build was refused only after its search); with
    --overwrite it reuses the session build's compile (warm_dirs) and replaces the wheel."""
    built, _ = tiny_build
    dist = warm_dirs.dist
    shutil.copytree(built.dist, dist)
    wheel = next(dist.glob("*.whl"))
    tested = sha256_file(wheel)
    spec = spec_copy(tmp_path / "spec", GOOD.replace('"Tiny test model"', '"Tiny test model, trained again"'))
    # the session build's root: the wheel's name, version and /opt path are the tested wheel's
    args = [
        "build",
        "--spec",
        str(spec),
        "--root",
        str(built.root),
        "--dist",
        str(dist),
        "--build-dir",
        str(warm_dirs.build),
    ]
    refused = run_cli(*args)
    assert refused.code == OutputDirError.exit_code, refused.err
    assert f"error: {wheel} already holds a different build of this version" in refused.err
    assert "hint: bump model.version" in refused.err and "--overwrite" in refused.err
    assert "build into another --dist to keep both" in refused.err
    # what differs is said: here the spec, as the content hash; and before any work
    assert "their manifests differ in the model's code, weights or spec (content_hash " in refused.err, refused.err
    assert "this build stops here, before the doctor (it wrote nothing)" in refused.err
    assert "==> doctor" not in refused.err and "spec.lock.json" not in refused.err
    assert sha256_file(wheel) == tested and sorted(p.name for p in dist.iterdir()) == sorted(
        p.name for p in built.dist.iterdir()
    )
    replaced = run_cli(*args, "--overwrite")
    assert replaced.code == 0, replaced.err
    assert sha256_file(wheel) != tested


def test_a_build_for_another_root_says_so_and_how_to_remake_the_kept_wheel(warm_dirs, tiny_build):
    """Only --root changed: the wheel holds the path it was compiled at, so it is another wheel of the
    same name. The refusal says the root differs and names the kept wheel's root, not "bump the version"."""
    built, _ = tiny_build
    shutil.copytree(built.dist, warm_dirs.dist)
    wheel = next(warm_dirs.dist.glob("*.whl"))
    refused = run_cli("build", "--spec", str(TINY_SPEC), *warm_dirs.args())
    assert refused.code == OutputDirError.exit_code, refused.err
    kept_path, new_path = built.root / "tiny" / "0.1" / "cpu", warm_dirs.root / "tiny" / "0.1" / "cpu"
    assert f"differ in opt_path: {kept_path} in the kept wheel, {new_path} in this build" in refused.err, refused.err
    assert f"hint: the kept wheel was built for the artifact root {built.root}: build with --root {built.root}" in (
        refused.err
    )
    assert "into another --dist to keep both" in refused.err  # what a newcomer did next, unprompted
    assert "bump model.version" not in refused.err
    assert sha256_file(wheel) == sha256_file(next(built.dist.glob("*.whl")))
    # refused before the doctor (the unet's newcomer waited out a 5m33s search for it), with nothing written
    assert "==> doctor" not in refused.err and "this build stops here, before the doctor" in refused.err
    assert not warm_dirs.root.exists() and not (warm_dirs.build / "tiny").exists()


def test_the_early_check_refuses_only_a_wheel_of_this_name_made_here_for_another_root(tmp_path, wheel):
    """Before the compile the wheel's platform tag is not known: the check reads the kept wheels of
    this name and version, and their manifests' /opt path."""
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(wheel, dist)
    name, version = kept["import_name"], kept["full_version"]
    dist_guard.refuse_early(
        dist, name, version, Path(kept["opt_path"]), kept["content_hash"]
    )  # the same root: the late check's
    dist_guard.refuse_early(
        dist, name, "0.2+" + version.split("+")[1], tmp_path / "opt" / "tiny" / "0.2" / "cpu", kept["content_hash"]
    )
    dist_guard.refuse_early(
        tmp_path / "no-dist", name, version, tmp_path / "opt" / "tiny" / "0.1" / "cpu", kept["content_hash"]
    )
    with pytest.raises(OutputDirError) as refused:
        dist_guard.refuse_early(dist, name, version, tmp_path / "opt" / "tiny" / "0.1" / "cpu", kept["content_hash"])
    other = tmp_path / "opt" / "tiny" / "0.1" / "cpu"
    assert f"differ in opt_path: {kept['opt_path']} in the kept wheel, {other} in this build" in str(refused.value)
    assert refused.value.hint.startswith("the kept wheel was built for the artifact root ")


def test_the_late_check_names_what_differs_between_the_manifests(tmp_path, wheel):
    """Where the content is the same but the wheel is not (another search's choice, --keep-debug),
    only the late check, with the new wheel's bytes, can refuse it: it lists what differs."""
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    new_wheel = tmp_path / "new" / wheel.name
    new_wheel.parent.mkdir()
    with_manifest(wheel, new_wheel, description="Tiny test model, trained again")
    with pytest.raises(OutputDirError) as refused:
        dist_guard.keep_what_was_tested(wheel, new_wheel, sha256_file(new_wheel))
    assert (
        "their manifests differ in description: Tiny test model in the kept wheel, "
        "Tiny test model, trained again in this build;" in str(refused.value)
    )
    assert (
        "this build's verified wheel is kept in the build cache: the same build with --overwrite puts it in dist/ "
        "from the build cache, without building it again (it was verified when built)" in str(refused.value)
    )
    assert refused.value.hint.startswith("bump model.version")
    dist_guard.keep_what_was_tested(wheel, wheel, sha256_file(wheel))  # the same bytes: kept, nothing said
    # a --hf build's version comes from --version: its hint says that (H66 was told "model.version in the spec")
    checkpoint = {
        "folder": "/tmp/my-bert",
        "library": "transformers",
        "class": "BertModel",
        "task": "feature-extraction",
    }
    with_manifest(wheel, new_wheel, description="retrained", checkpoint=checkpoint)
    with pytest.raises(OutputDirError) as refused:
        dist_guard.keep_what_was_tested(wheel, new_wheel, sha256_file(new_wheel))
    assert refused.value.hint.startswith(
        "bump --version for a changed model (a --hf build's version is the one --version gives), build into another"
    ), refused.value.hint
    # another CPU kind (the README's --cpu-isa avx2 after a native build): the same model, another --dist
    with_manifest(wheel, new_wheel, platform={**kept["platform"], "onednn_max_isa": "AVX2"})
    with pytest.raises(OutputDirError) as refused:
        dist_guard.keep_what_was_tested(wheel, new_wheel, sha256_file(new_wheel))
    assert refused.value.hint.startswith("the two are for other machines (another CPU kind): build into another --dist")


def test_the_early_check_refuses_other_content_and_leaves_the_same_content_to_the_late_check(tmp_path, wheel):
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(wheel, dist)
    name, version, opt = kept["import_name"], kept["full_version"], Path(kept["opt_path"])
    dist_guard.refuse_early(dist, name, version, opt, kept["content_hash"])
    with pytest.raises(OutputDirError) as refused:
        dist_guard.refuse_early(dist, name, version, opt, "0" * 64)
    assert "differ in the model's code, weights or spec (content_hash " in str(refused.value)
    assert refused.value.hint.startswith("bump model.version")
    # a --hf build's: what its content is made of, and its version's flag (H67: only its --spec had changed)
    hf_dist = tmp_path / "hf-dist"
    hf_dist.mkdir()
    with_manifest(wheel, hf_dist / wheel.name, checkpoint={"folder": "/tmp/my-bert", "task": "fill-mask"})
    with pytest.raises(OutputDirError) as refused:
        dist_guard.refuse_early(hf_dist, name, version, opt, "0" * 64)
    assert "differ in the checkpoint folder's files or the override spec (content_hash " in str(refused.value)
    assert refused.value.hint.startswith("bump --version for a changed model")


def test_the_early_check_refuses_another_choice_where_this_builds_is_known(tmp_path, wheel):
    """H65: `--no-search` after a search that chose freezing was refused once its wheel was made (18 s):
    a choice known before the doctor (the search off, a lock's entry) is compared then."""
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    assert kept["compile_search"]["chosen"] == "spec-options"
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(wheel, dist)
    name, version, opt = kept["import_name"], kept["full_version"], Path(kept["opt_path"])
    content = kept["content_hash"]
    kind = kept["platform"]["cpu_capability"]
    dist_guard.refuse_early(dist, name, version, opt, content, ("spec-options", kind))  # the same: the late check's
    dist_guard.refuse_early(dist, name, version, opt, content, None)  # a search decides: not known yet
    # a wheel for another CPU kind (--cpu-isa avx2 beside it): the late check names that first
    dist_guard.refuse_early(dist, name, version, opt, content, ("freezing", "another kind"))
    with pytest.raises(OutputDirError) as refused:
        dist_guard.refuse_early(dist, name, version, opt, content, ("freezing", kind))
    assert (
        "their manifests differ in compile_search (the options chosen): spec-options in the kept wheel, freezing in "
        "this build; it is left as it is, and this build stops here, before the doctor (it wrote nothing)"
    ) in str(refused.value)
    assert refused.value.hint == (
        "the two are the same model with other compile options chosen: build into another --dist to keep both, "
        "or pass --overwrite to replace it"
    )


def test_a_fresh_build_replaces_the_older_cache_entry_of_its_key(tmp_path, wheel):
    """H45: --update-lock (which reuses no build) made dist/'s wheel again, but the build cache kept
    an older build's under the same key; the next plain build reused that one and said "kept … differ"."""
    from pipeline.services.cache import Cache
    from pipeline.stages.deliver import commit
    from pipeline.stages.package import Wheel

    (tmp_path / "older").mkdir(), (tmp_path / "new").mkdir()
    older, fresh = tmp_path / "older" / wheel.name, tmp_path / "new" / wheel.name
    with_manifest(wheel, older, description="an older build's record")
    shutil.copyfile(wheel, fresh)
    store = Cache(tmp_path / "cache")  # a plain build's: it reuses entries
    store.store("build-key", (older,))
    record = Wheel(path=fresh, sha256=sha256_file(fresh), size=fresh.stat().st_size, platform_tag="x")
    commit(record, {"wheel": {}}, tmp_path / "dist", "model_tiny", "0.1+cpu", (store, "build-key"))
    assert (
        sha256_file(tmp_path / "cache" / "build-key" / wheel.name)
        == record.sha256
        == sha256_file(tmp_path / "dist" / wheel.name)
    )
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["build-key"], "no staged leftovers"


def test_a_wheel_refused_in_dist_is_kept_in_the_build_cache_for_overwrite(tmp_path, wheel):
    """A newcomer's second build (OMP_NUM_THREADS=1, --no-cache) searched 3 minutes and chose
    freezing; dist/ held the first build's wheel, so it was refused (exit 10), and the hint's
    --overwrite then took the build cache's older wheel, whose search had stopped on the noise.
    The refused wheel replaces the cache's entry for its key, as the refusal says."""
    from pipeline.services.cache import Cache
    from pipeline.stages.deliver import commit
    from pipeline.stages.package import Wheel

    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    (tmp_path / "new").mkdir()
    new_wheel = tmp_path / "new" / wheel.name
    chosen = {**kept["compile_search"], "chosen": "freezing"}
    with_manifest(wheel, new_wheel, compile_options={"freezing": True}, compile_search=chosen)
    dist, store = tmp_path / "dist", Cache(tmp_path / "cache", reuse=False)  # --no-cache: it stores all the same
    dist.mkdir()
    shutil.copyfile(wheel, dist / wheel.name)
    record = Wheel(path=new_wheel, sha256=sha256_file(new_wheel), size=new_wheel.stat().st_size, platform_tag="x")
    with pytest.raises(OutputDirError) as refused:
        commit(record, {"wheel": {}}, dist, "model_tiny", "0.1+cpu", (store, "build-key"), overwrite=False)
    assert sha256_file(dist / wheel.name) == sha256_file(wheel), "dist/ keeps the tested wheel"
    assert sha256_file(tmp_path / "cache" / "build-key" / wheel.name) == record.sha256
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["build-key"], "no staged leftovers"
    # the same model with other options chosen: not "bump model.version … for a changed model"
    assert (
        "their manifests differ in compile_options; compile_search (the options chosen): spec-options in the kept "
        "wheel, freezing in this build;" in str(refused.value)
    )
    assert refused.value.hint.startswith("the two are the same model with other compile options chosen"), refused.value
    # --overwrite then: the refused wheel, and a word of the one it replaced
    said = io.StringIO()
    with reporting(Progress(said)):
        commit(record, {"wheel": {}}, dist, "model_tiny", "0.1+cpu", overwrite=True)
    assert sha256_file(dist / wheel.name) == record.sha256
    assert said.getvalue() == (
        f"    --overwrite: replaced {dist / wheel.name} (another build of this version, sha256 "
        f"{sha256_file(wheel)[:16]}…)\n"
    )
    said.truncate(0), said.seek(0)
    with reporting(Progress(said)):  # again: the same bytes, and it says so
        commit(record, {"wheel": {}}, dist, "model_tiny", "0.1+cpu", overwrite=True)
    assert (
        said.getvalue() == f"    --overwrite: {dist / wheel.name} held these same bytes already: nothing was replaced\n"
    )
    # without --overwrite too: dist/'s wheel is left as it is (its mtime kept), and the result says so
    mtime = (dist / wheel.name).stat().st_mtime_ns
    again = commit(record, {"wheel": {}}, dist, "model_tiny", "0.1+cpu", overwrite=False)
    assert again.same_bytes and (dist / wheel.name).stat().st_mtime_ns == mtime


def test_the_refusal_says_overwrite_as_make_takes_it(tmp_path, wheel, monkeypatch):
    """`make build MODEL=unet --overwrite`, as a refusal's hint read, got make's own usage screen."""
    new_wheel = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(new_wheel, "w") as made:
        for item in source.infolist():
            made.writestr(item, source.read(item) + (b" " if item.filename.endswith("METADATA") else b""))
    monkeypatch.setenv("MAKELEVEL", "1")  # what make sets for its commands
    monkeypatch.setattr(sys, "argv", ["pipeline", "build", "--spec", "models/unet/spec.toml"])  # make build's own
    with pytest.raises(OutputDirError) as refused:
        dist_guard.keep_what_was_tested(wheel, new_wheel, sha256_file(new_wheel))
    assert (
        'the same build with ARGS="--overwrite" puts it in dist/ from the build cache, without building it again '
        "(it was verified when built)" in str(refused.value)
    )
    assert refused.value.hint.endswith('or pass ARGS="--overwrite" to replace it'), refused.value.hint
    # with the build's other flags: ARGS="--overwrite" after ARGS="--no-search" dropped --no-search,
    # and rebuilt the locked options' wheel, the one already kept
    argv = ["build", "--spec", "models/unet/spec.toml", "--target", "cpu", "--no-search", "--build-dir", "build"]
    assert dist_guard.overwrite(argv) == 'ARGS="--no-search --build-dir build --overwrite"'
    # less --no-cache: the hint's ARGS="--no-cache --overwrite" searched again and put another wheel in
    # dist/, where the refused one waited in the build cache
    assert dist_guard.overwrite([*argv, "--no-cache"]) == 'ARGS="--no-search --build-dir build --overwrite"'
    monkeypatch.delenv("MAKELEVEL")
    assert dist_guard.not_kept([*argv, "--no-cache"]).endswith(
        "the same build without --no-cache, with --overwrite, puts it in dist/ from the build cache, without building "
        "it again (it was verified when built)"
    )
    assert dist_guard.not_kept(argv).endswith(
        "the same build with --overwrite puts it in dist/ from the build cache, without building it again (it was "
        "verified when built)"
    )
    # nor --update-lock: the search it forces ran 86 s and put a third wheel in dist/ (H41)
    assert dist_guard.not_kept([*argv, "--update-lock"]).endswith(
        "the same build without --update-lock, with --overwrite, puts it in dist/ from the build cache, without "
        "building it again (it was verified when built)"
    )
    monkeypatch.setenv("MAKELEVEL", "1")
    assert dist_guard.overwrite([*argv, "--update-lock"]) == 'ARGS="--no-search --build-dir build --overwrite"'


def test_a_wheel_that_differs_only_in_the_searchs_record_is_kept_in_dist_and_the_build_succeeds(tmp_path, wheel):
    """A --no-cache rebuild of an unchanged ViT chose spec-options again, after timing other
    candidates (the noise): it was refused as "other compile options chosen". Then (H42) such a
    refusal said "nothing to do", and every later plain build of the checkout was refused alike,
    the lock file holding the new record. dist/ now keeps its wheel, the build succeeds and says so,
    and the new wheel waits in the build cache for --overwrite."""
    from pipeline.services.cache import Cache
    from pipeline.services.manifest import differences
    from pipeline.stages.deliver import commit
    from pipeline.stages.package import Wheel
    from pipeline.summary import report_lines

    first = {"chosen": "spec-options", "candidates": [{"name": "spec-options"}, {"name": "freezing"}, {"name": "x"}]}
    again = {"chosen": "spec-options", "candidates": [{"name": "spec-options"}], "not_tried": [{"name": "freezing"}]}
    differ = differences({"compile_search": first}, {"compile_search": again})
    # two lists a reader can tell apart (H42 read "…, x in the kept wheel, spec-options in this build" three times),
    # each what its manifest records (H44: a build from the lock records the lock's search, not its own)
    assert differ == [
        "compile_search (only its record: spec-options chosen in both; the kept wheel's options were chosen from "
        "spec-options, freezing and x, this build's from spec-options)"
    ]
    # one candidate, none left out: no search (H62 read "this build's spec-options" with no reason beside three)
    lone = {"chosen": "spec-options", "candidates": [{"name": "spec-options"}], "not_tried": []}
    assert differences({"compile_search": first}, {"compile_search": lone})[0].endswith(
        "the kept wheel's options were chosen from spec-options, freezing and x, this build's from spec-options "
        "alone (no search))"
    )
    # the same candidates, one left out for another reason (H45 read "spec-options as timed, this build's
    # spec-options": the bf16 refusal's diffs, then recorded, differed with the build's threads)
    refused = [{"name": "bf16-autocast", "reason": "the output tolerances refuse it: max abs diff 0.0167"}]
    assert differences(
        {"compile_search": {**again, "not_tried": refused}},
        {
            "compile_search": {
                **again,
                "not_tried": [{**refused[0], "reason": "the output tolerances refuse it: max abs diff 0.018"}],
            }
        },
    ) == [
        "compile_search (only its record: spec-options chosen in both; spec-options tried in both; bf16-autocast "
        "not tried for the same reason in both, with other figures)"
    ]
    # a search that stopped on the noise beside one that was off: each side's reason (H60 could not parse "the
    # reason bf16-autocast, freezing, … was not tried differs")
    noisy = [{"name": n, "reason": "cannot win beyond the noise (the report has it)"} for n in ("freezing", "x")]
    noisy.append({"name": "bf16-autocast", "reason": "this CPU has no native bfloat16 instructions"})
    assert differences(
        {"compile_search": {**again, "not_tried": noisy}}, {"compile_search": {**again, "not_tried": []}}
    ) == [
        "compile_search (only its record: spec-options chosen in both; spec-options tried in both; freezing and x: "
        "not tried in the kept wheel (cannot win beyond the noise), not among this build's candidates; "
        "bf16-autocast: not tried in the kept wheel (this CPU has no native bfloat16 instructions), not among this "
        "build's candidates)"
    ]
    kept = json.loads(zipfile.ZipFile(wheel).read("model_tiny/manifest.json"))
    (tmp_path / "new").mkdir()
    new_wheel = tmp_path / "new" / wheel.name
    with_manifest(wheel, new_wheel, compile_search={**kept["compile_search"], "candidates": []})
    dist, store = tmp_path / "dist", Cache(tmp_path / "cache", reuse=False)
    dist.mkdir()
    shutil.copyfile(wheel, dist / wheel.name)
    (dist / "model_tiny-0.1+cpu.report.json").write_text("{}")
    record = Wheel(path=new_wheel, sha256=sha256_file(new_wheel), size=new_wheel.stat().st_size, platform_tag="x")
    report = {"wheel": {"name": wheel.name, "sha256": record.sha256, "size": record.size}, "stages_s": {}}
    said = io.StringIO()
    with reporting(Progress(said)):
        result = commit(record, report, dist, "model_tiny", "0.1+cpu", (store, "build-key"), overwrite=False)
    assert sha256_file(dist / wheel.name) == sha256_file(wheel), "dist/ keeps the tested wheel"
    assert (dist / "model_tiny-0.1+cpu.report.json").read_text() == "{}", "and its report"
    assert sha256_file(tmp_path / "cache" / "build-key" / wheel.name) == record.sha256, "this build waits in the cache"
    assert result.kept.startswith("compile_search (only its record: ") and result.wheel == dist / wheel.name
    assert result.report["wheel"]["sha256"] == sha256_file(wheel)
    assert said.getvalue().startswith(
        f"    kept {dist / wheel.name}: it holds this model with the options this build chose, so dist/ is left as "
        "it is; their manifests differ only in compile_search (only its record: "
    ), said.getvalue()
    assert said.getvalue().rstrip().endswith("; --overwrite replaces it with this build's")
    lines = report_lines(dataclasses.replace(result, report={**result.report, "artifacts": {}, "verification": NONE}))
    assert lines[0] == f"\nkept {wheel.name} (dist/'s, of the same model and options)"
    # the rows after the kept wheel's are this build's, and said to be (H45 read one summary of two wheels)
    assert lines[1].startswith(f"  wheel     {dist / wheel.name}  ") and sha256_file(wheel)[:16] in lines[1]
    own = next(i for i, line in enumerate(lines) if line.startswith("  this build "))
    assert lines[own] == (
        f"  this build sha256 {record.sha256[:16]}…, in the build cache: its wheel differs only in the search's "
        "record; the next rows are its own"
    )
    assert lines[own + 1].startswith("  stages    ")
    assert f"  report    {dist / 'model_tiny-0.1+cpu.report.json'} (the kept wheel's)" in lines


NONE = {"cases": [], "worst": {}, "tolerances": {}}
