"""The manifest's helpers every layer may use: its file hashes and its JSON.
Its type is the runtime's (runtime/_schema.py); the package stage makes it (stages/manifest.py).
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import IO, Any

from ..wheel_template.runtime import _integrity as wheel_integrity
from ..wheel_template.runtime._schema import Manifest
from .wording import listed

# The wheel's own integrity check hashes files the same way.
sha256_file = wheel_integrity.sha256_file


def dumps(manifest: Manifest) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


# Manifest keys that differ whenever the model or its compile does (file hashes, cache keys):
# named only where nothing that causes them differs.
_FOLLOWS = ("artifacts", "golden", "content_hash", "compile_cache_key")


def read_wheel_manifest(wheel: Path | IO[bytes]) -> dict[str, Any] | None:
    """A modelwheel wheel's ``<import_name>/manifest.json`` (None where it is not one, or unreadable):
    a file, or the bytes of one (an index's)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/manifest.json")]
            found = json.loads(archive.read(names[0])) if len(names) == 1 else None
    except (OSError, zipfile.BadZipFile, ValueError, KeyError):
        return None
    return found if isinstance(found, dict) else None


def differences(kept: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The top-level manifest keys whose values differ, causes first, each with both values where
    they are short ('opt_path: /a/x/1/cpu in the kept wheel, /b/x/1/cpu in this build')."""
    keys = sorted(key for key in kept.keys() | new.keys() if kept.get(key) != new.get(key))
    causes = [key for key in keys if key not in _FOLLOWS]
    if not causes or (causes == ["compile_search"] and _same_choice(kept, new)):
        causes = keys  # a search's record alone changes no file: files that differ too are said (--keep-debug)
    return [_described(key, kept.get(key), new.get(key)) for key in causes]


def record_only(kept: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the two manifests differ in the search's record alone: the same options chosen, other
    candidates timed, no file other (dist_guard keeps such a wheel: it serves as well)."""
    return [key for key in kept.keys() | new.keys() if kept.get(key) != new.get(key)] == [
        "compile_search"
    ] and _same_choice(kept, new)


def _same_choice(kept: dict[str, Any], new: dict[str, Any]) -> bool:
    first, second = kept.get("compile_search"), new.get("compile_search")
    return isinstance(first, dict) and isinstance(second, dict) and first.get("chosen") == second.get("chosen")


def _record_differs(kept: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs in two records of searches that chose the same: the candidates timed, or the
    reasons those not tried were left out (a newcomer read "the kept wheel records spec-options as
    timed, this build's spec-options": the difference was a refusal's reason)."""
    kept_tried, new_tried = ([c.get("name", "?") for c in r.get("candidates", ())] for r in (kept, new))
    if kept_tried != new_tried:
        kept_said, new_said = (_tried(tried, r) for tried, r in ((kept_tried, kept), (new_tried, new)))
        # "chosen from", not "timed": a wheel built from a lock records the lock's search, which timed them
        # elsewhere (H63 read "the kept wheel records … as timed" of a build that timed nothing)
        return f"the kept wheel's options were chosen from {kept_said}, this build's from {new_said}"
    kept_why, new_why = ({s.get("name", "?"): s.get("reason") for s in r.get("not_tried", ())} for r in (kept, new))
    left_out = [name for name in {**kept_why, **new_why} if kept_why.get(name) != new_why.get(name)]
    tried = f"{listed(kept_tried) or 'none'} tried in both"
    if not left_out:
        return f"{tried}; another of its fields differs"
    # each side's reason, in its first words, for the candidates that share them (H60 could not parse
    # "the reason bf16-autocast, freezing, … was not tried differs")
    groups: dict[tuple[str, str], list[str]] = {}
    for name in left_out:
        groups.setdefault((_first_words(kept_why.get(name)), _first_words(new_why.get(name))), []).append(name)
    said = [
        f"{listed(names)} not tried for the same reason in both, with other figures"  # a refusal's diffs, say
        if kept_said == new_said
        else f"{listed(names)}: {_left_out(kept_said, 'the kept wheel')}, {_left_out(new_said, 'this build')}"
        for (kept_said, new_said), names in groups.items()
    ]
    return f"{tried}; " + "; ".join(said)


def _tried(names: list[str], record: dict[str, Any]) -> str:
    """The candidates a record timed; one alone, with none left out, was no search (--no-search,
    `search = false` or a lock's entry): H62 read "this build's spec-options" with no reason beside
    the kept wheel's three."""
    if len(names) == 1 and not record.get("not_tried"):
        return f"{names[0]} alone (no search)"
    return listed(names) or "none"


def _first_words(reason: str | None) -> str:
    return re.split(r": | \(", reason, maxsplit=1)[0] if reason else ""


def _left_out(reason: str, whose: str) -> str:
    """Why candidates were not tried in ``whose`` search, or that they were none of its candidates."""
    return f"not tried in {whose} ({reason})" if reason else f"not among {whose}'s candidates"


def _described(key: str, kept: Any, new: Any) -> str:
    if key == "torch" and isinstance(kept, dict) and isinstance(new, dict):
        kept, new = kept.get("version"), new.get("version")
    if key == "compile_search" and isinstance(kept, dict) and isinstance(new, dict):  # the two choices, named
        if kept.get("chosen") == new.get("chosen"):  # the same choice, reached by other candidates (the noise)
            return (
                f"compile_search (only its record: {kept.get('chosen')} chosen in both; {_record_differs(kept, new)})"
            )
        key, kept, new = "compile_search (the options chosen)", kept.get("chosen"), new.get("chosen")
    if kept != new and all(isinstance(v, (str, int, float, type(None))) for v in (kept, new)):
        if len(f"{kept}{new}") <= 160:
            return f"{key}: {kept} in the kept wheel, {new} in this build"
    return key
