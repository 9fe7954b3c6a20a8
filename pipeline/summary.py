"""The lines a finished build prints: the wheel, its artifacts and stage times, how each output
passed verification, and what a user types next (the import, the wheel's command, the install)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import targets
from .services.index import DEFAULT_PORT
from .services.manifest import read_wheel_manifest
from .services.progress import Progress
from .services.wording import ratio, took
from .stages.package import TORCH_INDEX
from .wheel_template.runtime._bounds import decided_by
from .wheel_template.runtime._info import SEARCH_OFF

if TYPE_CHECKING:  # the build imports torch; the summary is printed from its result only
    from .stages.deliver import BuildResult


def report_lines(result: BuildResult, rebuild: bool = False) -> list[str]:
    """``rebuild``: the throwaway rebuild of `reproduce`, which says nothing of what to type next
    (its install lines read as an invitation to install it) and names no path in its temporary
    folder (a newcomer looked for a wheel and a report that `identical` had removed)."""
    report = result.report
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    stages = " · ".join(f"{name} {took(seconds)}" for name, seconds in report["stages_s"].items())
    where = "the rebuild, compared below" if rebuild else str(result.wheel)
    lines = [
        f"\n{'kept' if result.kept else 'built'} {report['wheel']['name']}"
        + (" (dist/'s, of the same model and options)" if result.kept else "")
        + (" (the same bytes as dist/'s wheel: left as it is)" if result.same_bytes and not rebuild else ""),
        f"  wheel     {where}  {mb(report['wheel']['size'])}  sha256 {report['wheel']['sha256'][:16]}…",
    ]
    lines += artifact_lines(report["artifacts"], mb)
    manifest = read_wheel_manifest(result.wheel)  # read once: the runs-on line and the usage lines
    if manifest is not None:  # before it is published: a default (native) build runs on CPUs of this kind only
        lines.append(f"  runs on   {targets.get(manifest['target']).where_it_runs(manifest)}")
    if manifest is not None and (checkpoint := manifest.get("checkpoint")):  # an --hf build's, as `info` says it
        # "from", in the rows' 10-character column ("checkpoint" put its value a column right, H58)
        where = (report.get("checkpoint") or {}).get("path") or checkpoint["folder"]  # the report's full path (H59)
        lines.append(f"  from      checkpoint {where} ({checkpoint['task']}, {checkpoint['class']})")
    if result.kept:  # the rows below are this build's, not the kept wheel's (H45 read them as one wheel's)
        lines.append(
            f"  this build sha256 {result.own_sha256[:16]}…, in the build cache: its wheel differs only in the "
            "search's record; the next rows are its own"
        )
    lines.append(f"  stages    {stages}")
    searched = search_lines(report.get("compile_search") or {})
    # a row of a search that did not run (off, or the lock's options) is no search of the cached build's
    ran = searched and not searched[0].startswith(("  search    none: ", f"  search    {SEARCH_OFF}"))
    if ran and (report.get("build_cache") or {}).get("reused"):
        # this run searched nothing: the row under "no option search" read as its own (H47)
        searched[0] = searched[0].replace("  search    ", "  search    the cached build's: ", 1)
    lines += searched
    cases = len(report["verification"]["cases"])
    for name, worst in report["verification"]["worst"].items():
        tol = report["verification"]["tolerances"][name]
        lines.append(
            f"  verified  {name}: {cases} cases, max abs diff {worst['max_abs']:.2e}, max rel diff "
            f"{worst['max_rel']:.2e}: {decided_by(worst['max_abs'], worst['max_rel'], tol['rtol'], tol['atol'])}"
        )
    if rebuild:
        return lines
    lines.append(f"  report    {result.report_path}" + (" (the kept wheel's)" if result.kept else ""))
    return lines + (usage_lines(result.wheel, manifest) if manifest is not None else [])


MANY = 4  # more files than this of one suffix (a CUDA build's kernels: 78 .cubin files) take one line


def artifact_lines(artifacts: dict[str, Any], mb: Any) -> list[str]:
    """One line per artifact, but one for all of a suffix where there are many: a CUDA build
    listed 78 kernels of '0.0 MB' each between the wheel and its verification."""
    by_suffix: dict[str, list[int]] = {}
    for name, artifact in artifacts.items():
        by_suffix.setdefault(Path(name).suffix, []).append(artifact["size"])
    lines, said = [], set()
    for name, artifact in artifacts.items():
        suffix = Path(name).suffix
        if len(by_suffix[suffix]) <= MANY:
            lines.append(f"  artifact  {name}  {mb(artifact['size'])}")
        elif suffix not in said:  # the first of many: the line for them all
            lines.append(f"  artifact  {len(by_suffix[suffix])} {suffix} files  {mb(sum(by_suffix[suffix]))} in all")
            said.add(suffix)
    return lines


# How payback's refusals begin (features/ imports torch; the summary is read without it)
OVER_BUDGET_REASON = "over the search's compile budget"
NOT_TRIED = {  # the summary's words for each refusal, by how its reason begins
    OVER_BUDGET_REASON: "left out by its compile budget",
    "cannot pay back its compile": "not tried: an earlier build measured no gain",
    "cannot win beyond the noise": "not tried: the noise hides what it could gain",
}


def not_tried(search: dict[str, Any]) -> str:
    """``max-autotune left out by its compile budget; freezing not tried: …``: every candidate
    the search refused, by why (the summary named those the budget left out, and no other)."""
    said: dict[str, list[str]] = {}
    for one in search.get("not_tried", ()):
        reason = one.get("reason", "")
        # another refusal (the output tolerances, a lock's): its own words, up to their detail
        words = next((w for start, w in NOT_TRIED.items() if reason.startswith(start)), None)
        said.setdefault(words or f"not tried: {reason.split(':')[0]}", []).append(one["name"])
    return "; ".join("{} {}".format(", ".join(names), words) for words, names in said.items())


def search_lines(search: dict[str, Any]) -> list[str]:
    """What the option search cost (compile and timing seconds) and what it won, where it ran."""
    cost = search.get("cost")
    refused = not_tried(search)
    if search.get("entry_kept"):  # said in the summary too, not only in the lines that scrolled by (H44)
        name = Path(search["locked"]).name
        # with what it cost (H65's row left out the 149 s it had taken) and its candidates, named (H67):
        # those recorded beside them are the lock's, from the search that wrote the entry
        searched = search.get("searched_cost") or cost
        ran = {"candidates": search.get("searched_candidates") or []}
        spent = f"; {search_cost(ran, searched, '')}" if searched else ""
        # why, where the report has it: it did not decide, or it did not beat the entry (H66)
        why = search.get("entry_kept_why") or "the search did not decide"
        return [f"  search    --update-lock kept {name}'s entry ({search['chosen']}): {why}{spent}"]
    if search.get("locked"):  # the options a lock entry pins (H61: the README's AVX2 build had no row)
        return [
            f"  search    none: {search['chosen']}, from {Path(search['locked']).name} (--update-lock searches again)"
        ]
    if not cost:
        return []
    if len(search.get("candidates", ())) < 2 and not cost["stopped"] and not refused:
        # said, as the wheel's `info` says it: nothing on screen said a --no-search build searched nothing (H60)
        return [f"  search    {SEARCH_OFF}"]
    won = (
        f"won {ratio(cost['won'])} ({search['chosen']} over spec-options)"
        if cost["won"]
        else "won nothing (spec-options kept, the options it started from"
        + ("; the rounds could not tell)" if cost.get("undecided") else ")")
    )
    return [f"  search    {search_cost(search, cost, refused)}; {won}"]


def search_cost(search: dict[str, Any], cost: dict[str, Any], refused: str) -> str:
    """``2 candidate(s) beyond spec-options compiled (…) in 78.0s …; timed 5.4s (…)``: what the
    search compiled, verified and timed, and in how long."""
    left_out = f" ({refused})" if refused else ""
    # the candidates whose .so the build cache held, spec-options too: not among those compiled
    # (a newcomer's summary named neither the one compiled nor spec-options from the cache)
    candidates = search.get("candidates", ())
    cached = [one["name"] for one in candidates[1:] if one.get("from_cache")]
    in_cache = [one["name"] for one in candidates[:1] if one.get("from_cache")] + cached
    from_cache = f" (and {', '.join(in_cache)} from the build cache)" if in_cache else ""
    fresh = ", ".join(one["name"] for one in candidates[1:] if not one.get("from_cache"))
    if cost["stopped"]:
        # one parenthesis: "(1.47x spread) (bf16-autocast not tried: …)" read as a typo (H43)
        spent = f"stopped by the noise before compiling a candidate ({ratio(cost['spread'])} spread" + (
            f"; {refused})" if refused else ")"
        )
    elif not cost["compiled"]:
        taken = f" ({', '.join(cached)} from the build cache)" if cached else ""
        spent = f"no candidate compiled{taken}{left_out}"
    else:
        # the wall time first: the summed seconds, beside the compile stage's, read as more than it took
        compiled_in = (
            f"{cost['workers']} at a time in {cost['compile_wall_s']:.1f}s wall ({cost['compile_s']:.1f}s of "
            "compiling summed over the cores)"
            if cost["workers"] > 1
            else f"in {cost['compile_s']:.1f}s"
        )
        verified = f", verified in {took(cost['verify_s'])}" if cost.get("verify_s") else ""  # not in older reports
        # "beyond spec-options": the first compile is the build's own; the count read as one short
        named = f" ({fresh})" if fresh else ""
        spent = f"{cost['compiled']} candidate(s) beyond spec-options compiled{named} {compiled_in}"
        spent += f"{from_cache}{verified}{left_out}"
    # the noise's rounds (spec-options alone) apart: a newcomer's "timed 38.5s" was 33 s of them
    noise = f" ({cost['noise_s']:.1f}s of it spec-options alone, for the noise)" if cost["timing_s"] else ""
    return f"{spent}; timed {cost['noise_s'] + cost['timing_s']:.1f}s{noise}"


def usage_lines(wheel: Path, manifest: dict[str, Any]) -> list[str]:
    """The import, the console command and the installs, from the wheel's own manifest. The
    install by name names the user's index: without --index-url, pip looks the model up on PyPI,
    where anyone may have registered that name (dependency confusion, docs/publishing.md)."""
    import_name = manifest["import_name"]
    dist, variant = manifest["dist_name"], manifest["variant"]
    torch_index = f"{TORCH_INDEX}/{variant}"
    local, version = f"http://127.0.0.1:{DEFAULT_PORT}/{variant}/simple", manifest["version"]
    # `link` only where the model loads from its /opt path (a CUDA wheel's): a relocatable wheel
    # loads from its package, and its --help says it has no link to make
    commands = "verify | info" if manifest.get("relocatable") else "verify | info | link"
    # load_numpy() only where the target's runtime has it (a CUDA wheel's said so, and has not)
    has_numpy = targets.runtime(targets.get(manifest["target"])).NUMPY
    numpy = "  (or load_numpy(), example_arrays(): no torch import)" if has_numpy else ""
    # a --cpu-isa build shares its file name with the native one: an index holding that installs it (H60
    # followed this line after publishing the native build, and would have got the AVX-512 wheel)
    named_kind = (manifest.get("platform") or {}).get("onednn_max_isa")
    one_per_version = (
        [
            "            (an index keeps one wheel of a version, and a native build's has this file name: publish this "
            "one to an index without it, or bump the version)"
        ]
        if named_kind
        else []
    )
    return [
        f"  import    import {import_name}; model = {import_name}.load(){numpy}",
        f"  command   {dist} {commands}  (installed with the wheel)",
        f"  install   this wheel: pip install {wheel} --extra-index-url {torch_index}",
        # as docs/publishing.md gives both: the local index sends pip to PyTorch's index for torch itself
        # "make index" alone sent a pip-installed tool's user looking for a Makefile they do not have
        f"            from the local index (modelwheel index start; make index in a checkout): pip install "
        f"{dist}=={version} --index-url {local}",
        *one_per_version,
        f"            from your index: pip install {dist}=={version} --index-url <your index>/{variant}/simple "
        f"--extra-index-url {torch_index}",
    ]


def print_report(progress: Progress, result: BuildResult, rebuild: bool = False) -> None:
    for line in report_lines(result, rebuild):
        progress.say(line)
