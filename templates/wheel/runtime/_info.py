"""``model-<name> info``: what the wheel holds, in a screenful; ``info --json`` prints the manifest.

A newcomer's ``model-unet info`` printed the whole 162-line manifest, every candidate's compile
options among it, to learn what the model takes and how it was built. Imports neither torch nor
numpy: the command runs where torch is not installed (``pip install --no-deps``).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from ._schema import Manifest, NotTried
from ._targets import for_manifest, option_notes


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _manylinux_tag(dist_name: str) -> str | None:
    """The installed wheel's manylinux platform tag (``manylinux_2_35``), from its WHEEL file: the
    manifest is written before auditwheel gives the tag. None where pip did not install it."""
    try:
        text = importlib.metadata.distribution(dist_name).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return None
    found = re.search(r"^Tag: \S+-(manylinux_(\d+)_(\d+))_\w+$", text, re.MULTILINE)
    return found.group(1) if found else None


def _platform(m: Manifest) -> str:
    facts: dict[str, Any] = dict(m["platform"])
    machine = facts.pop("machine", "")
    # the build machine's glibc, not what the wheel needs: a newcomer read "glibc 2.36" against its
    # manylinux_2_35 tag as a mistake, and then could not see the tag itself
    glibc = facts.pop("glibc", None)
    said = [machine] + [f"{key} {value}" for key, value in facts.items()]
    tag = _manylinux_tag(m["dist_name"])
    if glibc and tag:
        oldest = ".".join(tag.split("_")[1:3])
        said.append(f"on glibc {glibc} (its {tag} tag: it runs on glibc {oldest} and newer)")
    elif glibc:
        said.append(f"on glibc {glibc} (the wheel's manylinux tag names the oldest glibc it runs on)")
    return ", ".join(said)


def _weights(m: Manifest) -> str:
    weights = m["weights"]
    if not weights["external"]:
        return f"in the compiled model (sha256 {weights['sha256'][:16]}…)"
    size = f", {_megabytes(weights['size'])}" if "size" in weights else ""
    return (
        f"{weights.get('file', 'a file')} beside it{size}: another file of the same tensors by "
        "load(weights=...) or model.swap_weights(...)"
    )


def _compiled(m: Manifest) -> str:
    notes = option_notes(m["target"])
    # a note says what an option does, so only beside one that is on: "freezing False (the weights
    # folded into the compiled code …)" read to a newcomer as if they were
    options = [
        f"{key} {value}" + (f" ({notes[key]})" if key in notes and value is not False else "")
        for key, value in m["compile_options"].items()
    ]
    # "the ... candidate's options": "freezing: …, freezing True" read as the option said twice; with
    # the search off there were no candidates, only the spec's options
    search = m["compile_search"]
    own = search["chosen"] == search["candidates"][0]["name"]  # kept, or the search off: one phrasing for both
    whose = "the spec's own options" if own else f"the {search['chosen']} candidate's options"
    return f"{whose}: {', '.join(sorted(options))}"


def _not_tried(not_tried: list[NotTried]) -> str:
    """The candidates left out, grouped by why (the noise, the budget, what the model runs): a
    newcomer's `info` listed them without the reason, where the noise had decided the build."""
    by_reason: dict[str, list[str]] = {}
    for entry in not_tried:
        reason = entry["reason"].split(" (the build's report has", 1)[0]  # the report is not at hand here
        # the reason, not its figures (`info --json` has them): bf16's diffs ended the row in "))"
        reason = reason.split(": ", 1)[0]
        by_reason.setdefault(reason, []).append(entry["name"])
    return "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())


def _search(m: Manifest) -> str:
    search = m["compile_search"]
    tried = [c["name"] for c in search["candidates"]]
    left_out = f"; not tried: {_not_tried(search['not_tried'])}" if search["not_tried"] else ""
    if len(tried) > 1:
        # "kept": "chose spec-options" read as if it had won; its speed-up is not here: timings differ
        # run to run, and the wheel's bytes must not
        verb = "kept" if search["chosen"] == tried[0] else "chose"
        why = " (none faster beyond the timing noise)" if verb == "kept" else ""
        return (
            f"{verb} {search['chosen']}{why} among {', '.join(tried)}{left_out}; its timings are in the build's "
            "summary and report (the wheel keeps none, so that a rebuild gives the same bytes)"
        )
    if left_out:  # a search that compiled no other (the noise, the budget)
        return f"tried {search['chosen']} only{left_out}"
    return SEARCH_OFF


# the build's summary says it in the same words (pipeline/summary.py)
SEARCH_OFF = "off: the spec's options alone ([compile] search = false, or --no-search)"


def _verified(m: Manifest) -> str:
    verification, cases = m["verification"], len(m["verification"]["cases"])
    outcome = "passed" if verification["passed"] else "FAILED"
    sizes = m["static"]["sizes"].values() if "static" in m else []
    golden = len(m["golden"]["cases"]) + sum(len(size["golden_cases"]) for size in sizes)
    return (
        f"{cases} cases against {verification.get('reference', 'eager')} at build time: {outcome}; "
        f"`{m['dist_name']} verify` runs its {golden} golden cases here"
    )


def summary(m: Manifest, artifacts_dir: Path) -> list[str]:
    """The lines ``info`` prints: one a row, the row's name first, as the build's summary has them."""
    target = m["target"] if m["device"] == m["target"] else f"{m['target']} ({m['device']})"
    rows = [
        ("target", f"{target}, torch {m['torch']['version']}, built for {_platform(m)}"),
        ("runs on", for_manifest(m).where_it_runs(m)),
        ("inputs", "; ".join(f"{i['name']} {i['dtype']} [{', '.join(map(str, i['shape']))}]" for i in m["inputs"])),
    ]
    if m["dims"]:
        dims = "; ".join(f"{n} from {d['min']} to {d['max']} (example {d['example']})" for n, d in m["dims"].items())
        rows.append(("dims", dims))
    outputs = "; ".join(f"{o['name']} {o['dtype']} (rtol {o['rtol']:g}, atol {o['atol']:g})" for o in m["outputs"])
    rows.append(("outputs", outputs + (", returned as a tuple in this order" if m["returns_tuple"] else "")))
    if "static" in m:
        static = m["static"]
        sizes = ", ".join(sorted(static["sizes"], key=int))
        padded = ", the sizes between padded" if static["pad"] else ""
        rows.append(("static", f"{static['dim']} {sizes}, each compiled on its own{padded}"))
    if "checkpoint" in m:
        checkpoint = m["checkpoint"]
        rows.append(("checkpoint", f"{checkpoint['folder']} ({checkpoint['task']}, {checkpoint['class']})"))
    rows += [("weights", _weights(m)), ("compiled", _compiled(m)), ("search", _search(m)), ("verified", _verified(m))]
    library = m["artifacts"].get(m["library"])
    size = f" ({_megabytes(library['size'])})" if library else ""
    where = "" if m["relocatable"] else f"; its kernels addressed by {m['opt_path']}"
    rows.append(("files", f"{m['library']}{size} in {artifacts_dir}{where}"))
    title = f"{m['dist_name']} {m['full_version']}" + (f": {m['description']}" if m["description"] else "")
    width = max(len(name) for name, _ in rows)
    return [
        title,
        *(f"  {name.ljust(width)}  {text}" for name, text in rows),
        f"the whole manifest, as JSON: {m['dist_name']} info --json",
    ]
