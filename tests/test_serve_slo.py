"""`make bench-serve`'s requests/s at equal p99 (benchmarks/serve_slo.py): the rate at which each
server's p99 reaches a bound, from the rates it was measured at, and how far each is known."""

from __future__ import annotations

import pytest

from benchmarks import serve_slo


def rows(engine: str, points: list[tuple[float, float]]) -> list[dict]:
    return [{"engine": engine, "rps": rps, "p50_ms": p99 / 2, "p99_ms": p99} for rps, p99 in points]


def test_the_rate_within_a_bound_is_interpolated_between_the_rates_around_it():
    measured = rows("wheel", [(10, 100), (20, 200), (30, 600)])
    assert serve_slo.rate_within(measured, "wheel", 400) == (pytest.approx(25.0), "")
    assert serve_slo.rate_within(measured, "wheel", 150) == (pytest.approx(15.0), "")


def test_a_bound_never_reached_or_passed_from_the_start_is_marked_open():
    measured = rows("wheel", [(10, 100), (20, 200)])
    assert serve_slo.rate_within(measured, "wheel", 500) == (20, ">=")
    assert serve_slo.rate_within(measured, "wheel", 50) == (10, "<")


def test_the_ratio_at_a_bound_says_when_it_is_only_a_lower_or_upper_bound():
    measured = rows("wheel", [(10, 50), (20, 80), (30, 300)]) + rows("eager", [(10, 150), (20, 400), (30, 900)])
    alone_p50 = 50.0  # bounds 100, 200 and 400 ms
    by_times = {e["times"]: e for e in serve_slo.at_bounds(measured, alone_p50)}
    assert by_times[2]["ratio_mark"] == ">="  # eager passes 100 ms even at its lowest rate
    assert by_times[2]["ratio"] == pytest.approx((20 + 10 * 20 / 220) / 10)
    assert by_times[4]["ratio_mark"] == "" and by_times[4]["ratio"] == pytest.approx((20 + 10 * 120 / 220) / (10 + 10 * 50 / 250))
    assert by_times[8]["ratio_mark"] == ">="  # the wheel never passed 400 ms
    lines = "\n".join(serve_slo.markdown_lines({"paced_requests": 240, "equal_p99": {
        "alone_p50_ms": alone_p50, "rows": measured, "bounds": list(by_times.values())}}, 1.5))
    assert "| 2x = 100 ms | 20.9 | < 10.0 | ≥ 2.09x |" in lines
    assert "met at 3 of 3 bounds" in lines
