"""`make bench-serve`'s requests/s at equal p99 (benchmarks/serve_slo.py): the rate at which each
server's p99 reaches a bound, from the rates it was measured at, and how far each is known."""

from __future__ import annotations

import pytest

from benchmarks import serve_slo


def rows(engine: str, points: list[tuple[float, float]], setup: str = "/predict/batched") -> list[dict]:
    return [{"engine": engine, "setup": setup, "rps": rps, "p50_ms": p99 / 2, "p99_ms": p99} for rps, p99 in points]


SETUPS = {name: {"label": f"`{name}`"} for name in ("/predict", "/predict/batched")}


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
    assert by_times[4]["ratio_mark"] == "" and by_times[4]["ratio"] == pytest.approx(
        (20 + 10 * 120 / 220) / (10 + 10 * 50 / 250)
    )
    assert by_times[8]["ratio_mark"] == ">="  # the wheel never passed 400 ms
    lines = "\n".join(
        serve_slo.markdown_lines(
            {
                "setups": SETUPS,
                "paced_requests": 240,
                "equal_p99": {"alone_p50_ms": alone_p50, "rows": measured, "bounds": list(by_times.values())},
            },
            1.5,
        )
    )
    assert "| `/predict/batched` | 2x = 100 ms | 20.9 | < 10.0 | ≥ 2.09x |" in lines
    assert lines.endswith(
        "met at 3 of 3 setup and bound pairs (`/predict/batched` at 2x, `/predict/batched` at 4x, "
        "`/predict/batched` at 8x); with each engine on its best setup, at 3 of 3 bounds."
    )


def test_each_setup_is_compared_on_its_own_rows():
    # direct calls: the wheel keeps 100 ms up to 15 req/s, eager up to 5; batched: both up to 20
    measured = (
        rows("wheel", [(5, 60), (10, 90), (20, 110)], "/predict")
        + rows("eager", [(5, 100), (10, 300)], "/predict")
        + rows("wheel", [(10, 50), (30, 150)])
        + rows("eager", [(10, 50), (30, 150)])
    )
    table = serve_slo.at_bounds(measured, 50.0)
    by_key = {(e["setup"], e["times"]): e for e in table}
    assert [e["setup"] for e in table] == ["/predict"] * 3 + ["/predict/batched"] * 3  # in the order measured
    assert by_key["/predict", 2]["wheel"] == pytest.approx(15.0) and by_key["/predict", 2]["eager"] == pytest.approx(
        5.0
    )
    assert by_key["/predict", 2]["ratio"] == pytest.approx(3.0) and by_key["/predict", 2]["ratio_mark"] == ""
    assert by_key["/predict/batched", 2]["ratio"] == pytest.approx(1.0)
    lines = "\n".join(
        serve_slo.markdown_lines(
            {
                "setups": SETUPS,
                "paced_requests": 600,
                "equal_p99": {"alone_p50_ms": 50.0, "rows": measured, "bounds": table},
            },
            1.5,
        )
    )
    assert "| `/predict` | 2x = 100 ms | 15.0 | 5.0 | 3.00x |" in lines
    assert "met at 2 of 6 setup and bound pairs (`/predict` at 2x, `/predict` at 4x)" in lines  # 4x: ≥ 2.67x


def test_each_engine_on_its_best_setup_is_compared_too():
    # within 100 ms: the wheel serves 15 req/s direct and 12 batched, eager 5 direct and 11 batched
    measured = (
        rows("wheel", [(5, 60), (10, 90), (20, 110)], "/predict")
        + rows("eager", [(5, 100), (10, 300)], "/predict")
        + rows("wheel", [(4, 50), (12, 100), (30, 150)])
        + rows("eager", [(4, 50), (11, 100), (30, 150)])
    )
    table = serve_slo.at_bounds(measured, 50.0)
    two = serve_slo.best_setups(table)[0]
    assert (two["wheel"], two["wheel_setup"]) == (pytest.approx(15.0), "/predict")
    assert (two["eager"], two["eager_setup"]) == (pytest.approx(11.0), "/predict/batched")
    assert two["ratio"] == pytest.approx(15 / 11)  # not the direct route's 3x
    lines = "\n".join(
        serve_slo.markdown_lines(
            {
                "setups": SETUPS,
                "paced_requests": 600,
                "equal_p99": {"alone_p50_ms": 50.0, "rows": measured, "bounds": table},
            },
            1.5,
        )
    )
    assert "| 2x = 100 ms | 15.0 (`/predict`) | 11.0 (`/predict/batched`) | 1.36x |" in lines
    assert "on its best setup, at 0 of 3 bounds" in lines.splitlines()[-1]


def test_a_rate_only_known_to_be_lower_loses_to_a_measured_one():
    measured = (
        rows("wheel", [(5, 200), (10, 300)], "/predict")
        + rows("wheel", [(2, 90), (10, 300)])
        + rows("eager", [(5, 200)], "/predict")
        + rows("eager", [(2, 200)])
    )
    two = serve_slo.best_setups(serve_slo.at_bounds(measured, 50.0))[0]
    assert (two["wheel_mark"], two["wheel_setup"]) == ("", "/predict/batched")  # 2.x measured beats "< 5"
    assert (two["eager_mark"], two["eager"]) == ("<", 5)  # both below: the higher bound of the two


def test_a_call_per_core_is_a_setup_of_its_own_where_there_are_several_cores():
    assert list(serve_slo.setups(1)) == ["/predict", "/predict/batched"]
    per_core = serve_slo.setups(4)["/predict x4"]
    assert (per_core.path, per_core.slots, per_core.label) == ("/predict", 4, "`/predict`, 4 slots")
