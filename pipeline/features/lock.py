"""The compile options, locked: what the option search chose, kept beside the spec.

The search (tune.py) chooses on timings, so a rebuild could choose otherwise and make other
bytes. Its choice is written to ``<spec stem>.lock.json`` beside the spec (``spec.toml`` ->
``spec.lock.json``), one entry per what decided it: the target, the CPU kind (the target's
``machine()``: the CPU capability the build runs as; a CUDA build's GPU), the torch version and
the spec's own [compile] keys. A build that finds its entry compiles those options alone and
runs no search; an entry for another torch, CPU kind or [compile] is never used, and the build
says why. ``build --update-lock`` searches again and rewrites the entry. Commit the file with the
spec, as any package manager's lockfile.

Reading, matching and writing need no torch: the key is made by the caller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..services.wording import figure
from ..spec import SpecFile
from ..spec_sections import CompileSection

FORMAT = 1
SUFFIX = ".lock.json"
# The keys an entry must match, in the order a note names the first that differs.
MATCHED = ("target", "cpu_kind", "torch", "compile")
ABOUT = (
    "written by `modelwheel build`: the compile options its option search chose, one entry per target, CPU "
    "kind, torch and [compile] keys; a build with a matching entry uses it and runs no search "
    "(`build --update-lock` searches again); commit it with the spec"
)


# Where a search locks nothing: "the next build searches again" read as a promise to a newcomer
# whose next build reused this one from the build cache in 3 s, with no search.
SEARCHES_AGAIN = "a later build searches again, unless it reuses this one from the build cache"


def only_at_the_end(does: str, entry: bool = False) -> str:
    """After the line saying what the search's choice does to the lock ("adds", "replaces"): when it
    does not, said before the search, so the build's last line ("nothing locked") breaks no promise
    (a newcomer's search ran to its end, its rounds could not decide, and it locked nothing). With an
    ``entry``, a choice not faster than the entry's options beyond the noise keeps it (H67)."""
    cases = (
        "one the noise stops before it compiles a candidate, one whose budget leaves room for no other candidate, "
        "or whose rounds cannot tell the candidates apart"
    )
    if entry:
        return (
            f"    (it {does} nothing where the search does not decide ({cases}), or where its choice is not faster "
            "than the entry's options beyond the noise)"
        )
    return f"    (only where the search decides: {cases}, {does} nothing)"


def lock_path(spec_path: Path) -> Path | None:
    """``models/unet/spec.toml`` -> ``models/unet/spec.lock.json``; None for a spec made from a
    checkpoint folder alone (--hf without --spec): nothing is written into the user's checkpoint."""
    if spec_path.suffix != ".toml":
        return None
    return spec_path.with_name(spec_path.name.removesuffix(".toml") + SUFFIX)


@dataclass(frozen=True)
class Key:
    target: str
    cpu_kind: str  # the target's machine(): "AVX2" for a CPU build for AVX2 CPUs
    torch: str  # torch.__version__
    compile: dict[str, Any]  # the spec's own [compile] keys, less the search's own

    def record(self) -> dict[str, Any]:
        return {"target": self.target, "cpu_kind": self.cpu_kind, "torch": self.torch, "compile": self.compile}

    def describe(self) -> str:
        return f"{self.target}, CPU kind {self.cpu_kind}, torch {self.torch}"


@dataclass(frozen=True)
class Locked:
    """A matching entry: the candidate the search chose, the options it adds to the spec's, and
    the search as the wheel's manifest recorded it (its candidates and what was not tried), which
    a build from the lock records again: the same manifest, the same bytes."""

    path: Path
    chosen: str
    overrides: dict[str, Any]
    search: dict[str, Any] = field(default_factory=dict)  # the manifest's compile_search
    why: str = ""
    threads: int | None = None  # the OpenMP threads the search's rounds ran on (None: not recorded)

    def record(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "overrides": self.overrides, "search": self.search}


@dataclass(frozen=True)
class Before:
    """The lock file as it was before a build wrote its search's choice: what a refused build's
    "to go back" offers (H51: `git checkout` of the file dropped an entry its first build had
    written and never committed, where going back meant that entry)."""

    path: Path
    key: Key
    text: str | None  # None: no file
    chosen: str | None  # its entry for the build's key, if any

    @classmethod
    def of(cls, spec_path: Path, key: Key | None) -> Before | None:
        path = lock_path(spec_path)
        if path is None or key is None:
            return None
        text = path.read_text() if path.is_file() else None
        entry = find(path, key, text)[0] if text is not None else None  # the text kept, as it was read
        return cls(path, key, text, entry.chosen if entry else None)

    def refused(
        self, chosen: str, keep_in: Path, dist_chosen: str | None = None, earlier: bool = False
    ) -> tuple[str, str]:
        """The line before dist/'s refusal of a build whose search wrote ``chosen`` in the lock: what
        plain builds now make, and the way back; the file as it was goes in ``keep_in`` (the build
        folder). ``dist_chosen``: the options of dist/'s wheel, where its manifest says. H53: a search
        that chose the entry's options again said "now names" them, and its copy replaced the one an
        earlier refusal had offered, the way back to dist/'s options. H56: so did a second refused
        search that chose other options again, whose lock as it found it names options dist/ refuses
        too: the way back is the one that leads to dist/'s options. ``earlier``: the build cache holds the
        build of this key from before this one (a build without an entry reuses it). With the line,
        the way back alone ('' where there is none), for the end of dist/'s hint: the last line on
        screen offered only --dist and --overwrite, the way back two lines above it (H62)."""
        again = self.chosen == chosen
        elsewhere = self.chosen is not None and dist_chosen is not None and self.chosen != dist_chosen
        said, back = (
            self._kept_earlier(keep_in, chosen, dist_chosen) if again or elsewhere else self._way_back(keep_in, earlier)
        )
        return (
            f"    the lock's entry {'still' if again else 'now'} names {chosen}: until dist/ takes this build "
            f"(--overwrite), plain builds make it and dist/ refuses them alike; {said}",
            back,
        )

    def _kept(self, keep_in: Path) -> Path:
        """Where the file as it was before a refused build is kept: one copy per build folder."""
        return keep_in / f"{self.path.name}.before"

    def _way_back(self, keep_in: Path, earlier: bool = False) -> tuple[str, str]:
        """The lock as it was, and what a build from it makes: without an entry, the build of this key
        from before this one (``earlier``: the build cache holds it), else a search. This build waits
        under its entry's key alone (H52 removed the file a refused build had made, and was refused
        again; H61's `git checkout` of it too)."""
        then = (
            "a build without an entry then reuses the build before this one, from the build cache"
            if earlier
            else "a build without an entry then searches again"
        )
        if self.text is None:
            back = f"remove {shown(self.path)} (this build made it)"
            return f"to go back, {back}: {then}", f"go back: {back}"
        was = f"its entry: {self.chosen}" if self.chosen is not None else "no entry for builds like this one"
        kept = self._kept(keep_in)
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(self.text)
        except OSError as exc:  # said on the way to dist/'s refusal, which stays the error
            why = exc.strerror or type(exc).__name__
            return (
                f"to go back, restore {shown(self.path)} as it was before this build ({was}; no copy of it could be "
                f"kept in {shown(keep_in)}: {why})" + (f": {then}" if self.chosen is None else ""),
                f"restore {shown(self.path)} as it was before this build",
            )
        copy = f"`cp {shown(kept)} {shown(self.path)}`"
        return (
            f"to go back to the lock as it was ({was}), {copy}" + (f": {then}" if self.chosen is None else ""),
            f"put the lock back: {copy}",
        )

    def _kept_earlier(self, keep_in: Path, chosen: str, dist_chosen: str | None) -> tuple[str, str]:
        """The way back an earlier refused build kept, where it leads elsewhere than ``chosen`` (to
        ``dist_chosen``, where dist/'s options are known)."""
        kept = self._kept(keep_in)
        try:
            earlier = find(kept, self.key)[0] if kept.is_file() else None
        except SpecError:  # not a lock any more: offered no longer
            earlier = None
        if earlier is not None and earlier.chosen != chosen and dist_chosen in (None, earlier.chosen):
            copy = f"`cp {shown(kept)} {shown(self.path)}`"
            return (
                f"to go back to the lock as it was before an earlier build changed it (its entry: {earlier.chosen}), "
                f"{copy}",
                f"put the lock back as it was before an earlier build changed it: {copy}",
            )
        if dist_chosen is not None and self.chosen not in (chosen, dist_chosen):
            return (
                f"no way back through the lock leads to dist/'s options ({dist_chosen}): as this build found it, its "
                f"entry named {self.chosen}, which dist/ refuses too; the hint below says the ways on",
                "",
            )
        return "the hint below says the ways on", ""


def shown(path: Path) -> str:
    """``path`` as a command to copy names it: from the current folder where it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def compile_keys(compile_section: dict[str, Any]) -> dict[str, Any]:
    """The spec's [compile] keys that decide the candidates (not whether or how long to search)."""
    return {k: v for k, v in sorted(compile_section.items()) if k not in CompileSection.SEARCH_KEYS}


def read(path: Path, text: str | None = None) -> list[dict[str, Any]]:
    """The file's entries ([] where there is no file); ``text``: the file's, read already. A damaged
    file names itself: it was committed with the spec, and a build must not silently search past it."""
    try:
        data = json.loads(path.read_text() if text is None else text)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"{path}: the compile-options lock cannot be read: {exc}",
            "restore it from version control, or delete it and build with --update-lock",
        ) from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if data.get("format") != FORMAT or not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SpecError(
            f"{path}: not a compile-options lock of format {FORMAT} (an 'entries' list)",
            "restore it from version control, or delete it and build with --update-lock",
        )
    return entries


def find(path: Path, key: Key, text: str | None = None) -> tuple[Locked | None, str]:
    """The entry for ``key``, or None and why none is used ("" where the file has none for the target)."""
    entries = read(path, text)
    for entry in entries:
        if all(entry.get(name) == value for name, value in key.record().items()):
            return Locked(
                path,
                str(entry["chosen"]),
                dict(entry.get("overrides") or {}),
                dict(entry.get("search") or {}),
                str(entry.get("why") or ""),
                entry.get("threads") if isinstance(entry.get("threads"), int) else None,
            ), ""
    same_target = [e for e in entries if e.get("target") == key.target]
    if not same_target:
        return None, ""
    nearest = max(same_target, key=lambda e: sum(e.get(n) == v for n, v in key.record().items()))
    differs = next(name for name in MATCHED if nearest.get(name) != key.record()[name])
    if differs == "compile":
        return None, f"{path.name} has a {key.target} entry for other [compile] keys than the spec's: ignored"
    return None, (
        f"{path.name} has a {key.target} entry for {differs.replace('_', ' ')} {nearest.get(differs)!r}, "
        f"not this build's {key.record()[differs]!r}: ignored"
    )


def write(
    path: Path,
    key: Key,
    chosen: str,
    overrides: dict[str, Any],
    search: dict[str, Any] | None = None,
    why: str = "",
    threads: int | None = None,
) -> None:
    """Put this key's entry in the file (replacing its old one, keeping the others), atomically.
    ``threads``: what the search's rounds ran on, kept beside the key, not in it (a lock made on a
    2-core CI machine serves a 64-core builder of the same CPU kind), and said where it differs."""
    entries = [e for e in read(path) if any(e.get(n) != v for n, v in key.record().items())]
    entries.append(
        {
            **key.record(),
            "chosen": chosen,
            "overrides": dict(sorted(overrides.items())),
            "search": search or {},
            "why": why,
            **({"threads": threads} if threads is not None else {}),
        }
    )
    entries.sort(key=lambda e: json.dumps([e.get(n) for n in MATCHED], sort_keys=True))
    text = json.dumps({"format": FORMAT, "about": ABOUT, "entries": entries}, indent=2, sort_keys=True) + "\n"
    aside = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        aside.write_text(text)
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def consult(
    spec_file: SpecFile, target: str, cpu_kind: str, update: bool, say: Callable[[str], None]
) -> tuple[Key | None, Locked | None]:
    """A build's lock key (None where no search would run, or the spec has no file to sit beside)
    and its matching entry, said either way: used, or ignored and why."""
    import torch

    path = lock_path(spec_file.path)
    key = Key(target, cpu_kind, torch.__version__, compile_keys(spec_file.spec.compile.model_dump(mode="json")))
    if not spec_file.spec.compile.search or path is None:
        if path is not None and not update:
            _say_unused(path, key, say)
        elif spec_file.spec.compile.search and not update:  # said: the unet's and BERT's wrote one (H48)
            say(
                "    the search's choice is locked nowhere: a --hf build without --spec has no spec file for a "
                "lock beside it (with --spec FILE, FILE's .lock.json keeps it; an unchanged rebuild reuses this "
                "build from the build cache)"
            )
        if update:
            say(
                "    --update-lock: nothing to lock, no option search runs here ("
                + ("the spec says [compile] search = false)" if path else "a spec with no file of its own)")
            )
        return None, None
    if update:
        # "replaces" only an entry there is (H58 read it where the lock had none for this CPU kind)
        entry = find(path, key)[0]
        does = f"replaces this build's entry in {path}" if entry else f"is added to {path}"
        say(f"    --update-lock: the option search runs, and its choice {does}")
        say(only_at_the_end("replaces" if entry else "adds", entry is not None))
        return key, None
    locked, why_not = find(path, key)
    if locked:
        # a newcomer's search, timed on one thread, chose for his 2-thread builds with no word of it
        threads = torch.get_num_threads()
        differs = locked.threads not in (None, threads)
        where = f" on {_threads(locked.threads)} (this build runs {threads})" if differs else ""
        say(
            f"    compile options from {path} ({key.describe()}): {locked.chosen}, as the search chose there{where}; "
            "no option search (--update-lock searches again)"
        )
    elif why_not:
        say(f"    {why_not}: the option search runs, and its choice is added to {path.name}")
        say(only_at_the_end("adds"))
    return key, locked


def entry(spec_path: Path, key: Key | None) -> Locked | None:
    """The lock's entry for ``key`` (None where there is none, or no key: no search, no lock file)."""
    path = lock_path(spec_path)
    return find(path, key)[0] if key is not None and path is not None and path.is_file() else None


def _say_unused(path: Path, key: Key, say: Callable[[str], None]) -> None:
    """With the search off (--no-search, search = false), an entry for this build is not used:
    said, where a newcomer's --no-search build compiled the spec's options with no word of the
    lock's choice for the same machine."""
    try:
        locked, _ = find(path, key)
    except SpecError:  # a damaged lock is not read here: the search that would read it is off
        return
    if locked and locked.overrides:  # an entry of the spec's own options is what this build compiles
        say(
            f"    {path.name} has this build's entry ({locked.chosen}), not used: the option search is off, so "
            "the spec's own options are compiled"
        )


def after_search(
    spec_path: Path,
    key: Key | None,
    tuned: Any,
    overrides: dict[str, Any],
    search: dict[str, Any],
    say: Callable[[str], None],
    refused: bool = False,
) -> Locked | None:
    """After a build whose search ran for a lock entry (``key``; None: no search, or no lock file):
    its choice becomes the entry, unless the search did not decide (it says why). The entry written,
    as a later build finds it, or None. ``refused``: dist/ refused the build's wheel (the line after
    says what the lock then makes, and the way back)."""
    if key is None:
        return None
    if why := tuned.not_decided():
        say(f"    the search did not decide ({why}): nothing locked in {lock_path(spec_path)} ({SEARCHES_AGAIN})")
        return None
    return keep_choice(spec_path, key, overrides, search, tuned, say, refused)


def keep_choice(
    spec_path: Path,
    key: Key,
    overrides: dict[str, Any],
    search: dict[str, Any],
    tuned: Any,
    say: Callable[[str], None],
    refused: bool = False,
) -> Locked:
    """After a build whose search ran: its choice becomes the key's entry. Committing the file is
    advised where dist/ took the build, or kept a wheel of the same options: not two lines before
    dist/'s refusal (H54), nor as waiting for a wheel dist/ had just kept its own over (H55)."""
    path = lock_path(spec_path)
    assert path is not None  # consult() gives a key only to a spec with a file of its own
    rest = {k: v for k, v in search.items() if k != "chosen"}
    previous = find(path, key)[0]
    write(path, key, search["chosen"], overrides, rest, tuned.why, tuned.threads)
    timed_on = f", timed on {_threads(tuned.threads)}" if tuned.threads else ""
    if previous is not None and previous.chosen == search["chosen"]:
        # H52 read "wrote the search's choice" after an --update-lock that chose as before as a new choice
        say(
            f"    the search chose {search['chosen']} again{timed_on}: {path}'s entry for builds like this one "
            f"({key.describe()}) still names it, with this search's timings (the file's diff is its record, not "
            "a new choice)"
        )
    else:
        say(
            f"    wrote the search's choice ({search['chosen']}{timed_on}) to {path}"
            # in place of what: H57 read an entry dist/ refused replaced by dist/'s options, unsaid
            + (f", in place of its entry's {previous.chosen}" if previous is not None else "")
            + f": builds like this one ({key.describe()}) use it and run no search"
            + ("" if refused else " (commit the file to keep that for everyone who builds this spec)")
        )
    if lower := _lower_median(tuned):
        say(lower)
    written = find(path, key)[0]
    assert written is not None  # just written
    return written


CLEARLY = 1.03  # a lower median said with the lock: lower by more than this factor


def _threads(count: int | None) -> str:
    return f"{count} thread" + ("" if count == 1 else "s")


def _lower_median(tuned: Any) -> str:
    """Where a candidate the choice beat only on the noise rule had the lower median, said with the
    lock: a newcomer's one-thread search, under load, kept spec-options (118 ms) over freezing
    (104 ms), whose two slow rounds overlapped; he would have committed that for everyone."""
    medians = {t.name: t.median_ms for t in tuned.trials if t.passed and t.median_ms is not None}
    chosen_ms = medians.get(tuned.chosen)
    if chosen_ms is None:
        return ""
    # a median 1% lower is what any two rounds differ by: said, it would follow nearly every lock
    lower = sorted((ms, name) for name, ms in medians.items() if ms * CLEARLY < chosen_ms)
    if not lower:
        return ""
    ms, name = lower[0]
    return (
        f"    ({name}'s median was lower, {figure(ms)} ms against {figure(chosen_ms)} ms, within its rounds' noise: a "
        "quieter machine, or one with other threads, may choose otherwise; `--update-lock` there searches again)"
    )
