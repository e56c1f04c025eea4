"""bench/harness.py: the benchmarks' shared shape (interleaved rounds, statistics, ratio, markdown,
summary row, plot), on fake variants that return fixed samples: exact inputs, exact outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import harness
finally:
    sys.path.remove(str(BENCH))


class NoMeter:
    """Stands in for common.CpuMeter: other processes used a fixed share."""

    def others(self) -> float:
        return 0.25


def _fixed(values: list[float], calls: list[str], name: str):
    """A variant returning the next of ``values`` (as metric "ips"), recording that it ran."""
    it = iter(values)

    def variant() -> dict[str, float]:
        calls.append(name)
        return {"ips": next(it)}

    return variant


def test_spread_median_min_max_of_odd_and_even_counts():
    assert harness.Spread.of([3.0, 1.0, 2.0]) == harness.Spread(2.0, 1.0, 3.0, 3)
    assert harness.Spread.of([4.0, 1.0, 2.0, 3.0]) == harness.Spread(2.5, 1.0, 4.0, 4)  # mean of the middle two
    assert harness.Spread.of([1.0, 2.0]).as_dict() == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}
    assert harness.Spread(1.09, 1.02, 1.174, 3).fmt() == "**1.09x** (1.02-1.17)"
    with pytest.raises(ValueError):
        harness.Spread.of([])


def test_ratio_of_medians_and_per_round():
    r = harness.ratio([20.0, 18.0, 17.0], [10.0, 10.0, 10.0])
    assert r.value == 1.8
    assert r.per_round == (2.0, 1.8, 1.7)
    assert r.spread == harness.Spread(1.8, 1.7, 2.0, 3)
    assert r.fmt() == "**1.80x** (single rounds: 1.70 to 2.00)"
    with pytest.raises(ValueError):
        harness.ratio([1.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("rotate", [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c")]),
        ("alternate", [("a", "b", "c"), ("c", "b", "a"), ("a", "b", "c"), ("c", "b", "a")]),
        ("fixed", [("a", "b", "c")] * 4),
    ],
)
def test_round_order(how, expected):
    assert [harness.round_order(["a", "b", "c"], r, how) for r in range(4)] == expected


def test_round_order_rejects_an_unknown_order():
    with pytest.raises(ValueError):
        harness.round_order(["a"], 0, "random")  # type: ignore[arg-type]


def test_interleave_runs_each_variant_once_per_round_in_rotating_order_and_collects_its_samples():
    calls: list[str] = []
    variants = {"1": _fixed([10.0, 11.0, 9.0], calls, "1"), "2": _fixed([17.0, 18.0, 18.9], calls, "2"),
                "0": _fixed([9.0, 9.0, 9.0], calls, "0")}
    seen: list[tuple[int, int]] = []
    s = harness.interleave(variants, 3, "rotate", meter=NoMeter, on_round=lambda r, got: seen.append((r, got.rounds)))
    assert calls == ["1", "2", "0", "2", "0", "1", "0", "1", "2"]
    assert s.orders == [("1", "2", "0"), ("2", "0", "1"), ("0", "1", "2")]
    assert seen == [(0, 1), (1, 2), (2, 3)]  # after each round, with that round's samples in
    assert s.variants == ("1", "2", "0") and s.rounds == 3
    assert s.of("1", "ips") == [10.0, 11.0, 9.0]  # aligned by round, not by call order
    assert s.of("2", "ips") == [17.0, 18.0, 18.9]
    assert s.median("1", "ips") == 10.0 and s.last("2", "ips") == 18.9
    assert s.of("0", "others") == [0.25] * 3  # the meter's, as the variant gave none
    assert len(s.of("0", "wall_s")) == 3 and len(s.of("0", "cpu_s")) == 3  # the harness's own timing
    r = s.ratio("2", "1", "ips")
    assert r.value == 1.8 and r.per_round == (17.0 / 10.0, 18.0 / 11.0, 18.9 / 9.0)
    assert s.others_max() == 0.25


def test_interleave_alternates_from_start_and_keeps_the_variants_own_wall_time_and_others():
    calls: list[str] = []

    def timed(name: str, wall: float):
        def variant() -> dict[str, float]:
            calls.append(name)
            return {"wall_s": wall, "cpu_s": wall / 2, "others": 0.5 if name == "loop" else 0.0}

        return variant

    s = harness.interleave({"loop": timed("loop", 5.0), "batched": timed("batched", 4.0)}, 2, "alternate", start=1,
                           meter=NoMeter)
    assert calls == ["batched", "loop", "loop", "batched"]  # round 1 runs backwards first
    assert s.of("loop", "wall_s") == [5.0, 5.0] and s.of("batched", "cpu_s") == [2.0, 2.0]
    assert s.best("batched") == 4.0
    assert s.others_max() == 0.5
    assert s.as_dict() == {"rounds": 2, "orders": [["batched", "loop"], ["loop", "batched"]],
                           "values": {"loop": {"wall_s": [5.0, 5.0], "cpu_s": [2.5, 2.5], "others": [0.5, 0.5]},
                                      "batched": {"wall_s": [4.0, 4.0], "cpu_s": [2.0, 2.0], "others": [0.0, 0.0]}}}


def test_interleave_a_plain_number_is_the_value_metric_and_nothing_is_timed_only():
    s = harness.interleave({"x": lambda: 3, "y": lambda: None}, 1, meter=NoMeter)
    assert s.of("x") == [3.0]
    assert set(s.values["y"]) == {"wall_s", "cpu_s", "others"}


def test_table_and_summary_row():
    assert harness.table(["variant", "median s"], [["sorted", "0.0100"], ["sort", 0.02]]) == [
        "| variant | median s |",
        "|---|---|",
        "| sorted | 0.0100 |",
        "| sort | 0.02 |",
    ]
    assert (harness.summary_row("(g) preprocessing images/s, 2 workers / 1 worker", "**1.73x** (bit-identical: True)",
                                ">= 1.7", "2026-11-26, full")
            == "| (g) preprocessing images/s, 2 workers / 1 worker | **1.73x** (bit-identical: True) | >= 1.7 | 2026-11-26, full |")
    assert harness.summary_row("(f) x **0.44x**", "<= 0.25", "2026-11-26, quick") == "| (f) x **0.44x** | <= 0.25 | 2026-11-26, quick |"


def test_disturbed_note_warns_from_15_percent():
    assert harness.disturbed_note(0.149) == ["Other processes used at most 15% of the machine's CPU while this was measured.", ""]
    note = harness.disturbed_note(0.15)
    assert note[0].startswith("> **Disturbed measurement**: other processes used up to 15% of the machine's CPU") and note[1] == ""


def test_section_text_and_context():
    text = harness.section("(k) Example", ["body line"], "Measured then.", "| (k) | 1x | ~1 | d, full |")
    assert text == "## (k) Example\n\nMeasured then.\n\n<!-- summary: | (k) | 1x | ~1 | d, full | -->\nbody line\n"
    ctx = harness.Context(Path("/tmp/w"), quick=True, log=print, date="2026-11-26")
    assert ctx.mode == "quick" and ctx.measured == "2026-11-26, quick"


def test_svg_lines_draws_one_polyline_per_series_with_labelled_points():
    svg = harness.svg_lines("title", "models", "ms per image", [2, 4],
                            [("overhead", "#d62728", [20.0, 10.0]), ("inference", "#1f77b4", [5.0, 5.0])])
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" width="560" height="320"') and svg.endswith("</svg>\n")
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 4
    assert ">title</text>" in svg and ">models</text>" in svg and ">ms per image</text>" in svg
    assert '<text x="442" y="54">overhead</text>' in svg  # the legend, right of the plot
    # y axis 0..22 (the largest value x 1.1), a grid line every 10
    assert [f'text-anchor="end">{v}</text>' in svg for v in (0, 5, 10, 20, 30)] == [True, False, True, True, False]


def test_the_example_in_the_docstring_is_a_whole_section():
    """The minimal section of harness.py's docstring (and bench/README.md) runs as written."""
    code = harness.__doc__.split("The smallest one:\n\n")[1].split("\n\nNothing here")[0]
    ns: dict = {}
    exec("\n".join(line[4:] for line in code.splitlines()), ns)  # noqa: S102 - our own docstring
    sys.path.insert(0, str(BENCH))
    try:
        rep = ns["report"](harness.Context(Path("/tmp/unused"), quick=True, log=print, date="2026-11-26"))
    finally:
        sys.path.remove(str(BENCH))
    assert rep.summary.startswith("| (k) sorted() / list.sort() | **") and rep.summary.endswith(" | ~1 | 2026-11-26, quick |")
    assert rep.body[:2] == ["| variant | median s |", "|---|---|"] and len(rep.body) == 4
    assert rep.raw["k"]["rounds"] == 3
    readme = (BENCH / "README.md").read_text(encoding="utf-8").split("**Adding a benchmark**")[1].split("```")[1]
    assert [line for line in code.splitlines() if line.strip()] == [
        "    " + line for line in readme.splitlines()[3:] if line.strip()]  # the same file in bench/README.md
