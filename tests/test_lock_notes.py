"""What a build says about the compile-options lock before and after its search, in lines that agree
with each other (test_lock.py has the lock file itself)."""

from __future__ import annotations

import torch

from pipeline import targets
from pipeline.features import lock
from pipeline.spec import load_spec

from .conftest import GOOD, spec_copy


def test_an_ignored_entry_says_the_choice_is_added_only_where_the_search_runs_to_its_end(tmp_path):
    """A newcomer read "its choice is added to spec.lock.json", then, the search stopped by the noise,
    "nothing locked in spec.lock.json": the first line now says when the choice is added."""
    spec = load_spec(spec_copy(tmp_path / "m", GOOD.replace("search = false", "search = true")))
    kind = targets.get("cpu").machine()
    compile_keys = lock.compile_keys(spec.spec.compile.model_dump(mode="json"))
    lock.write(tmp_path / "m" / "spec.lock.json", lock.Key("cpu", kind, "2.0.0+cpu", compile_keys), "freezing", {})
    said: list[str] = []
    key, locked = lock.consult(spec, "cpu", kind, False, said.append)
    assert key is not None and locked is None
    assert said[0].endswith(": ignored: the option search runs, and its choice is added to spec.lock.json"), said
    assert said[1:] == [
        "    (only where the search decides: one the noise stops before it compiles a candidate, one whose budget "
        "leaves room for no other candidate, or whose rounds cannot tell the candidates apart, adds nothing)"
    ]
    # --update-lock's line says the same: "added" where the lock has no entry for this build (H58 read
    # "replaces this build's entry" where there was none), "replaces" where it has one
    said.clear()
    lock.consult(spec, "cpu", kind, True, said.append)
    lock_file = spec.path.parent / "spec.lock.json"
    assert said[0] == f"    --update-lock: the option search runs, and its choice is added to {lock_file}", said
    assert said[1].endswith("or whose rounds cannot tell the candidates apart, adds nothing)"), said
    lock.write(
        tmp_path / "m" / "spec.lock.json", lock.Key("cpu", kind, torch.__version__, compile_keys), "freezing", {}
    )
    said.clear()
    lock.consult(spec, "cpu", kind, True, said.append)
    assert said[0].startswith("    --update-lock: the option search runs, and its choice replaces this build's entry")
    # and the entry stays where the search's choice is not faster than its options beyond the noise (H67)
    assert said[1:] == [
        "    (it replaces nothing where the search does not decide (one the noise stops before it compiles a "
        "candidate, one whose budget leaves room for no other candidate, or whose rounds cannot tell the candidates "
        "apart), or where its choice is not faster than the entry's options beyond the noise)"
    ]
