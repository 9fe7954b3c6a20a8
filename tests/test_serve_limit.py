"""`make bench-serve`'s account of what limits the wheel's lead with batching
(benchmarks/serve_limit.py): each engine's model call alone at batch 1 and the batch max, timed
for real, and the most a batched server can serve, read from the full batch's calls."""

from __future__ import annotations

import subprocess
import sys

from benchmarks import serve_limit

from .conftest import TINY_SPEC, wheel_manifest


def call(median_ms: float, low: float, high: float) -> dict:
    return {"median_ms": median_ms, "spread_ms": [low, high]}


def test_the_most_with_full_batches_is_eagers_full_batch_call_over_the_wheels():
    limit = {
        "batches": [1, 8],
        "rounds": 3,
        "calls": {
            "wheel": {"1": call(49.0, 48.0, 50.5), "8": call(320.0, 318.0, 330.0)},
            "eager": {"1": call(66.0, 64.3, 66.5), "8": call(368.0, 360.0, 371.0)},
        },
    }
    assert serve_limit.most_ratio(limit) == 368.0 / 320.0  # batch 1's larger lead does not count here
    lines = "\n".join(serve_limit.markdown_lines(limit, 1.5))
    assert "| 1 | 49.0 [48.0–50.5] | 66.0 [64.3–66.5] | 1.35x |" in lines
    assert "| 8 | 320.0 [318.0–330.0] | 368.0 [360.0–371.0] | 1.15x |" in lines
    assert (
        "full batches of 8 back to back: there the wheel serves at most 1.15x eager's requests/s, below the 1.5x target"
        in lines
    )
    limit["calls"]["wheel"]["8"] = call(200.0, 199.0, 201.0)
    assert "at most 1.84x eager's requests/s, at or above the 1.5x target" in "\n".join(
        serve_limit.markdown_lines(limit, 1.5)
    )


def test_the_batch_max_is_the_first_inputs_batch_dims_largest_size(wheel):
    assert serve_limit.batch_max(wheel_manifest(wheel)) == 4  # tests/models/tiny/spec.toml: [dims.batch] max


def test_both_engines_calls_are_timed_alone_as_the_servers_make_them(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)], check=True
    )
    limit = serve_limit.measure(TINY_SPEC, site, "model_tiny", [1, 4], rounds=1)
    for engine in ("wheel", "eager"):
        for batch in ("1", "4"):
            timed = limit["calls"][engine][batch]
            assert timed["rounds"] == 1 and timed["runs"] >= 10, timed
            assert 0 < timed["spread_ms"][0] <= timed["median_ms"] <= timed["spread_ms"][1], timed
    assert serve_limit.most_ratio(limit) > 0
