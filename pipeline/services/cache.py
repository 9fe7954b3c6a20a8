"""A content-addressed cache of compiled artifacts, so a build whose compile inputs did not change
reuses the .so instead of recompiling (e.g. a new version with new external weights).

The key covers everything the .so depends on: model source, the spec's model, inputs, dims and
compile sections and its outputs' names (not their tolerances, which only verification reads),
the weights (their values when embedded; only names, shapes and dtypes when external), torch,
the C++ compiler, the target and its own facts (the CPU's vector ISA; the GPU architecture, CUDA
version and compile folder).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from .outdir import signals_deferred
from .progress import check_stop
from .writable import check_private, sweep_partials

# 2: compiled .so files no longer hold the path of the torch that built them (compile.torch_seen_at).
# 3: nor Python addresses in kernel names, nor the padding of packed weights' descriptors (stages/same_bytes.py).
# 4: a wheel's golden outputs are eager's on one thread (stages/verify.py one_thread).
# 5: nor the folder they were compiled in, so another model version's entry is this one's bytes (H48).
CACHE_VERSION = "5"


def compile_key(
    *,
    spec_json: str,
    sources_sha256: str,
    weights_key: str,
    options: dict,
    target: str,
    cxx_version: str,
    target_facts: tuple[str, ...],
) -> str:
    digest = hashlib.sha256()
    for part in (
        CACHE_VERSION,
        spec_json,
        sources_sha256,
        weights_key,
        json.dumps(options, sort_keys=True, default=str),
        target,
        torch.__version__,
        cxx_version,
        *target_facts,
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def pipeline_sha256() -> str:
    """The build's own code: a cached wheel is reused only if the code that made it is unchanged."""
    here = Path(__file__).resolve().parents[1]  # pipeline/, every folder of it
    digest = hashlib.sha256()
    for path in sorted([*here.rglob("*.py"), *(here.parent / "templates" / "wheel").rglob("*")]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(here.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_key(
    *,
    content_hash: str,
    target: str,
    root: str,
    cxx_version: str,
    machine: str,
    debug_info: str,
    search: str,
    locked: str = "",
) -> str:
    """``debug_info``: "stripped" or "kept" (--keep-debug), which makes another wheel. ``search``:
    the spec's search keys (the content hash leaves them out): a --no-search build makes the spec's
    options, not the wheel a search chose. ``locked``: the options a lock entry pins
    (features/lock.py), which decide the wheel as the search would."""
    digest = hashlib.sha256()
    for part in (
        CACHE_VERSION,
        content_hash,
        target,
        root,
        torch.__version__,
        cxx_version,
        machine,
        pipeline_sha256(),
        debug_info,
        search,
        *([locked] if locked else []),
    ):  # no lock: the keys of earlier builds stand
        digest.update(part.encode() + b"\0")
    return "build-" + digest.hexdigest()[:32]


def newest_reports(cache_dir: Path) -> Iterator[dict[str, Any]]:
    """The build reports stored in the cache, newest first, each read as JSON (one that cannot be
    read is passed over): the advice earlier builds give a new one (its stage times, the search's
    measured candidates, the first compile's guess)."""
    for path in sorted(cache_dir.glob("build-*/*.report.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            yield report


def fresh_compiles(report: dict) -> int:
    """How many candidates a build's report says it compiled fresh (not from the compile cache)."""
    candidates = (report.get("compile_search") or {}).get("candidates") or []
    return sum(
        (one.get("compile_s") is not None) if "compile_s" in one else not one.get("from_cache", True)
        for one in candidates
        if isinstance(one, dict)
    )


def _first_candidate(report: dict) -> dict:
    """A build report's first candidate (the spec's options) as recorded ({} where it has none)."""
    search = report.get("compile_search")
    candidates = (search.get("candidates") if isinstance(search, dict) else None) or [{}]
    return candidates[0] if isinstance(candidates, list) and isinstance(candidates[0], dict) else {}


def first_name(report: dict) -> str:
    """The name of a build report's first candidate ("" where it has none)."""
    return str(_first_candidate(report).get("name") or "")


def first_compile_s(report: dict) -> float | None:
    """The seconds the first candidate (the spec's options) took to compile fresh, where recorded."""
    first = _first_candidate(report)
    seconds = None if first.get("from_cache") else first.get("compile_s")
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None


def compile_rounds(report: dict) -> float:
    """How many plain compiles' time a build's compile stage took: its first, then the others'
    wall time in units of the first (compile_search.cost.compile_wall_s), where the report has
    them; else the others side by side, its search's workers at a time, in whole rounds."""
    fresh = fresh_compiles(report)
    if fresh <= 1:
        return fresh
    cost = (report.get("compile_search") or {}).get("cost") or {}
    first_s, wall_s = first_compile_s(report), cost.get("compile_wall_s")
    if first_s and isinstance(wall_s, (int, float)) and wall_s > 0:
        return 1 + wall_s / first_s
    return 1 + -(-(fresh - 1) // max(1, int(cost.get("workers") or 1)))  # the others, rounded up


def _compile_stage_s(reports: Iterable[dict], rounds: float) -> float | None:
    """The compile stage of a build that makes ``rounds`` compiles' time, from the newest of
    ``reports`` that can tell: one that compiled fresh, scaled, where this one compiles (a build
    whose compile came from the cache said "running 39s past the last build's 1s" to the fresh
    compile after it); where this one compiles nothing, what such a build spent verifying and
    timing (a build that compiled, its compiles taken out, said "past the last build's 0s")."""
    for report in reports:
        stage_s = (report.get("stages_s") or {}).get("compile")
        if not isinstance(stage_s, (int, float)):
            continue
        compiled, first_s = compile_rounds(report), first_compile_s(report)
        if compiled and first_s is None and _first_candidate(report).get("from_cache"):
            # its fresh compiles are in no plain compile's units: a search whose one fresh compile was
            # max-autotune gave a newcomer's --no-search build its whole 101.6 s stage for one compile
            continue
        if not rounds:
            if not compiled:
                return float(stage_s)
            if first_s:
                return max(0.0, stage_s - first_s * compiled)
        elif rounds == 1 and compiled > 1 and first_s:
            # one compile after a search: its first compile's own time (a newcomer's --no-search
            # build was told the search's 134.6 s over its 3 compiles, 45 s, for its 55 s)
            return first_s
        elif compiled:
            return stage_s * rounds / compiled
    return None


class Cache:
    """Entries under ``directory``. With ``reuse`` off (--no-cache) nothing is read, but every
    build still stores what it made, replacing older entries, so the next build can reuse it."""

    def __init__(self, directory: Path, reuse: bool = True) -> None:
        self.directory = directory
        self.reuse = reuse

    def has(self, key: str) -> bool:
        if not self.reuse:
            return False
        check_private(self.directory, "--build-dir's cache")  # what it holds goes into wheels as it is
        return (self.directory / key).is_dir()

    def restore(self, key: str, output_dir: Path) -> tuple[Path, ...] | None:
        """Copy the entry's files into output_dir; None on a miss."""
        if not self.has(key):
            return None
        restored = []
        for cached in sorted((self.directory / key).iterdir()):
            # written aside and renamed: a .so of that name this process has loaded keeps its own file
            # (copied over in place, the loaded one's pages changed under it: a segfault at exit, H44)
            aside = output_dir / f".{cached.name}.restoring-{os.getpid()}"
            try:
                shutil.copyfile(cached, aside)
                os.replace(aside, output_dir / cached.name)
            finally:  # a copy cut short (a full disk) leaves no part of itself
                aside.unlink(missing_ok=True)
            restored.append(output_dir / cached.name)
        return tuple(restored)

    def stage_times(
        self, model: str, target: str, rounds: float | None = None, threads: int | None = None
    ) -> dict[str, float]:
        """The stage times of the newest stored build of this model and target ({} if none): the
        live progress's estimate of what is left. Read even with --no-cache: it is only advice.
        ``rounds``: how many compiles' time this build's compiles should take (outlook.expected_rounds);
        the compile stage's time is scaled from the earlier build's, where its report says (a build
        that compiled one, its search stopped on the noise, gave the figure for one that compiles
        four; a --no-search build's one compile, four times over, for a search whose budget let two
        more run side by side: 3m39s for 2m16s). ``threads``: only builds that ran on as many (where
        their report says)."""
        reports = (  # read lazily: most builds need the newest only
            report
            for report in newest_reports(self.directory)
            if report.get("model") == model
            and report.get("target") == target
            and not report.get("build_cache", {}).get("reused")
            and (threads is None or report.get("threads", threads) == threads)
        )
        newest = next(reports, None)
        if newest is None:
            return {}
        times = {name: float(seconds) for name, seconds in newest.get("stages_s", {}).items()}
        if rounds is not None and "compile" in times:
            compile_s = _compile_stage_s(itertools.chain([newest], reports), rounds)
            if compile_s is None:  # no build here compiled as this one will: the first guess says it
                del times["compile"]
            else:
                times["compile"] = compile_s
        return times

    def store(self, key: str, files: tuple[Path, ...], stoppable: bool = True) -> None:
        """Save files under key: written aside and renamed, so an entry is whole or absent, and a
        build asked to stop (Ctrl-C, SIGTERM) stores nothing. Not ``stoppable``: once staged, the
        entry is stored (a verified build whose wheel dist/ refused: the refusal's hint names it)."""
        staged = self.stage(key, files)
        try:
            if stoppable:
                check_stop()
            with signals_deferred(redeliver=False):
                self.commit(key, staged)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def copy_entry(self, key: str, other_key: str) -> None:
        """Entry ``key``'s files stored under ``other_key`` too (nothing where ``key`` has none): a
        build that wrote a lock entry is the whole build of the next build from that entry."""
        entry = self.directory / key
        if entry.is_dir() and key != other_key:
            self.store(other_key, tuple(sorted(entry.iterdir())))

    def set_aside(self, key: str) -> Path | None:
        """Entry ``key`` as it is now, linked into a folder aside (None where there is none), so that
        put_back() can undo what a build then stores under it. Named as a partial: an aside a killed
        build left is swept like one."""
        entry = self.directory / key
        if not entry.is_dir():  # looked at under --no-cache too: that build stores its entry all the same
            return None
        check_private(self.directory, "--build-dir's cache")
        aside = self.directory / f".{key}.aside.partial-{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir()
        for path in entry.iterdir():
            try:  # a link costs nothing: the entry's files are replaced, never written in place
                os.link(path, aside / path.name)
            except OSError:
                shutil.copyfile(path, aside / path.name)
        return aside

    def put_back(self, key: str, aside: Path | None) -> None:
        """Entry ``key`` as set_aside() found it: its files, or no entry where it had none (a build dist/
        refused, whose search wrote a lock entry, waits under that entry's key; without the entry, a
        build is the earlier one again, not the refused one: H61 could not go back)."""
        with signals_deferred(redeliver=False):
            shutil.rmtree(self.directory / key, ignore_errors=True)
            if aside is not None:
                aside.rename(self.directory / key)

    def stage(self, key: str, files: tuple[Path, ...]) -> Path:
        """The entry written aside; removed again when writing it fails (a full disk) or is
        interrupted, so no half entry stays behind. An entry stored already is replaced by the
        commit: a fresh build of its key (--update-lock, which reuses no build) made what dist/ now
        holds, and a plain build after it reused an older build's wheel and said "kept … differ" (H45)."""
        check_stop()
        if self.directory.is_dir():
            check_private(self.directory, "--build-dir's cache")
            sweep_partials(self.directory)
        staged = self.directory / f".{key}.partial-{os.getpid()}"
        try:
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir(parents=True)
            for path in files:
                shutil.copyfile(path, staged / path.name)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged

    def commit(self, key: str, staged: Path) -> None:
        """A staged entry into place (the caller holds signals: a rename, and an older entry's removal)."""
        entry = self.directory / key
        shutil.rmtree(entry, ignore_errors=True)
        try:
            staged.rename(entry)
        except OSError:  # another build stored the same key first
            shutil.rmtree(staged, ignore_errors=True)
