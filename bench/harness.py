"""The shape every benchmark section shares, written once: named variants run in interleaved
rounds (so a busy machine slows every side of a ratio alike), their samples, median / min / max,
a ratio against a baseline measured in the same run with its spread over the rounds, the markdown
table and the summary row of RESULTS.md, and a small stand-alone SVG line plot.

A section module (bench/bench_*.py) exposes ``report(ctx: Context) -> Report``; run_bench.py runs
it and writes its markdown between the section's markers in RESULTS.md. The smallest one:

    from harness import Context, Report, interleave, summary_row, table

    def report(ctx: Context) -> Report:
        data = list(range(200_000, 0, -1))
        s = interleave({"sorted": lambda: sorted(data), "sort": lambda: data.copy().sort()},
                       rounds=3 if ctx.quick else 9)
        r = s.ratio("sorted", "sort", "wall_s")
        body = table(["variant", "median s"], [[v, f"{s.median(v, 'wall_s'):.4f}"] for v in s.variants])
        return Report({"k": s.as_dict()}, body,
                      summary_row("(k) sorted() / list.sort()", r.fmt(), "~1", ctx.measured))

Nothing here reads the clock except :func:`interleave` around each variant call, and nothing
asserts on a time.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

Order = Literal["rotate", "alternate", "fixed"]
# A variant: one timed call. The harness's wall time, CPU time and CPU meter are its sample; a
# returned number is kept too (the "value" metric), and so are returned named metrics, of which a
# "wall_s", "cpu_s" or "others" replaces the harness's own (a variant that times only part of its
# call, or runs a subprocess whose CPU the meter would count as another process's). Anything else
# it returns (a sorted list, a result object) is ignored.
Variant = Callable[[], Any]


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Median (the mean of the two middle values for an even count, as numpy's), min, max, n."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        if not values:
            raise ValueError("no samples")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}

    def fmt(self, digits: int = 2, unit: str = "x") -> str:
        """``**1.09x** (1.02-1.17)``: the median in bold, the range after it."""
        return f"**{self.median:.{digits}f}{unit}** ({self.min:.{digits}f}-{self.max:.{digits}f})"


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator: ``value`` is the ratio of their medians, ``per_round`` the ratio in
    each round (both sides measured back to back), whose spread says how much one round moves."""

    value: float
    per_round: tuple[float, ...]

    @property
    def spread(self) -> Spread:
        return Spread.of(self.per_round)

    def fmt(self, digits: int = 2) -> str:
        """``**1.73x** (single rounds: 1.70 to 1.75)``."""
        lo, hi = min(self.per_round), max(self.per_round)
        return f"**{self.value:.{digits}f}x** (single rounds: {lo:.{digits}f} to {hi:.{digits}f})"


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Ratio:
    """Ratio of two variants' samples, taken in the same rounds (same length, aligned by round)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"samples of different rounds: {len(numerator)} vs {len(denominator)}")
    per_round = tuple(a / b for a, b in zip(numerator, denominator))
    return Ratio(statistics.median(numerator) / statistics.median(denominator), per_round)


# --------------------------------------------------------------------------------------------
# Interleaved rounds
# --------------------------------------------------------------------------------------------


def round_order(names: Sequence[str], r: int, how: Order = "rotate") -> tuple[str, ...]:
    """The order of round ``r``: ``rotate`` starts each round one variant later (a, b, c; b, c, a;
    ...), ``alternate`` runs every other round backwards (a, b, c; c, b, a; ...), ``fixed`` keeps
    the order (for variants whose order is part of what is measured)."""
    names = tuple(names)
    if how == "rotate":
        k = r % len(names)
        return names[k:] + names[:k]
    if how == "alternate":
        return names if r % 2 == 0 else names[::-1]
    if how == "fixed":
        return names
    raise ValueError(f"unknown order {how!r}")


@dataclass
class Samples:
    """What :func:`interleave` collected: per variant and metric, one value per round."""

    variants: tuple[str, ...]
    orders: list[tuple[str, ...]] = field(default_factory=list)  # the order each round ran in
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.orders)

    def of(self, variant: str, metric: str = "value") -> list[float]:
        return self.values[variant][metric]

    def last(self, variant: str, metric: str = "value") -> float:
        return self.values[variant][metric][-1]

    def spread(self, variant: str, metric: str = "value") -> Spread:
        return Spread.of(self.of(variant, metric))

    def median(self, variant: str, metric: str = "value") -> float:
        return statistics.median(self.of(variant, metric))

    def best(self, variant: str, metric: str = "wall_s") -> float:
        """The shortest: interference from other processes only ever adds time."""
        return min(self.of(variant, metric))

    def ratio(self, numerator: str, denominator: str, metric: str = "value") -> Ratio:
        return ratio(self.of(numerator, metric), self.of(denominator, metric))

    def others_max(self) -> float:
        return max(max(m.get("others", [0.0])) for m in self.values.values())

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "orders": [list(o) for o in self.orders], "values": self.values}


def interleave(variants: Mapping[str, Variant], rounds: int, how: Order = "rotate", *, start: int = 0,
               on_round: Callable[[int, Samples], None] | None = None, meter: Callable[[], Any] | None = None) -> Samples:
    """Run every variant once per round, in :func:`round_order` (round ``start + r``), timing each
    call (``wall_s``; ``cpu_s``: this process's CPU time) and metering the CPU other processes used
    meanwhile (``others``, see common.CpuMeter) unless the variant returns its own. ``on_round(r, samples)`` after each round
    (to log it). ``meter``: a factory of objects with ``others()``; common.CpuMeter by default."""
    if meter is None:
        from common import CpuMeter as meter
    names = tuple(variants)
    out = Samples(names, [], {n: {} for n in names})
    for r in range(rounds):
        order = round_order(names, start + r, how)
        out.orders.append(order)
        for name in order:
            m = meter()
            c0, t0 = time.process_time(), time.perf_counter()
            got = variants[name]()
            sample = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
            if isinstance(got, Mapping):
                sample.update({k: float(v) for k, v in got.items()})
            elif isinstance(got, (int, float)) and not isinstance(got, bool):
                sample["value"] = float(got)
            if "others" not in sample:
                sample["others"] = m.others()
            for k, v in sample.items():
                out.values[name].setdefault(k, []).append(v)
        if on_round is not None:
            on_round(r, out)
    return out


# --------------------------------------------------------------------------------------------
# Markdown: tables, the summary row, the section
# --------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table: header, separator, one line per row (cells as given, str() applied)."""
    return [_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)]


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def summary_row(*cells: str) -> str:
    """One row of RESULTS.md's summary table: ``| benchmark | ratio | target | measured |`` (a row
    whose benchmark cell already says its ratio gives three cells)."""
    return _row(cells)


def disturbed_note(others_max: float) -> list[str]:
    """The line above a section's tables saying how much of the CPU other processes used (a warning
    from 15% up)."""
    if others_max < 0.15:
        return [f"Other processes used at most {others_max:.0%} of the machine's CPU while this was measured.", ""]
    return [
        f"> **Disturbed measurement**: other processes used up to {others_max:.0%} of the machine's CPU while this "
        "was measured. Contention slows the two sides of a ratio unevenly (torch's OpenMP threads even spin, "
        "burning CPU time, while they wait for a descheduled sibling); rerun on a quiet machine for reliable ratios.",
        "",
    ]


@dataclass
class Context:
    """What run_bench.py hands every section: where to work, how big, and what is shared."""

    work: Path
    quick: bool
    log: Callable[[str], None]
    date: str = ""  # UTC date of the run, YYYY-MM-DD
    tiny: Any = None  # common.TinyModel, when a section of this run needs it
    ref_ws: Any = None  # common.Workspace holding the frozen reference, when needed
    baseline_src: Path | None = None
    results: Path | None = None  # the results file (a section may write a plot beside it)
    write: bool = True  # False with --no-write: nothing is written beside the results

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    @property
    def measured(self) -> str:
        """The summary row's last cell: ``2026-11-26, full``."""
        return f"{self.date}, {self.mode}"


@dataclass
class Report:
    """A section's outcome: every number (for --no-write's JSON, keyed as RESULTS' raw dump), its
    markdown body, its summary row, and a note for the log line that says it is done."""

    raw: dict[str, Any]
    body: list[str]
    summary: str
    note: str = ""


def section(title: str, body: Sequence[str], stamp: str, summary: str) -> str:
    """A section of RESULTS.md: title, when and how it was measured, the summary row (as a comment
    the summary table is rebuilt from), then the body."""
    return "\n".join([f"## {title}", "", stamp, "", f"<!-- summary: {summary} -->", *body, ""])


# --------------------------------------------------------------------------------------------
# Plot: lines over a shared x axis, as a small stand-alone SVG (matplotlib is not a dependency)
# --------------------------------------------------------------------------------------------


def svg_lines(title: str, x_label: str, y_label: str, xs: Sequence[float],
              series: Sequence[tuple[str, str, Sequence[float]]], size: tuple[int, int] = (560, 320)) -> str:
    """``series``: (name, colour, one y per x). Points labelled with their value, legend on the right."""
    w, h = size
    left, right, top, bottom = 60, 150, 30, 50
    ymax = max(v for _, _, vals in series for v in vals) * 1.1 or 1.0
    xmax = max(xs) * 1.05
    px = lambda x: left + (w - left - right) * x / xmax  # noqa: E731
    py = lambda y: top + (h - top - bottom) * (1 - y / ymax)  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">{title}</text>',
        f'<line x1="{left}" y1="{py(0)}" x2="{w - right}" y2="{py(0)}" stroke="black"/>',
        f'<line x1="{left}" y1="{py(0)}" x2="{left}" y2="{top}" stroke="black"/>',
    ]
    step = 10 ** math.floor(math.log10(ymax / 2)) if ymax > 0 else 1
    while ymax / step > 8:
        step *= 2
    y = 0.0
    while y <= ymax:
        parts.append(f'<line x1="{left - 4}" y1="{py(y):.1f}" x2="{w - right}" y2="{py(y):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step
    for x in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{py(0) + 16:.1f}" text-anchor="middle">{x}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 10}" text-anchor="middle">{x_label}</text>')
    parts.append(f'<text x="14" y="{(top + h - bottom) / 2}" transform="rotate(-90 14 {(top + h - bottom) / 2})" '
                 f'text-anchor="middle">{y_label}</text>')
    for k, (name, colour, vals) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, vals))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, v in zip(xs, vals):
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>')
            parts.append(f'<text x="{px(x) + 5:.1f}" y="{py(v) - 5:.1f}" fill="{colour}">{v:.0f}</text>')
        ly = top + 20 + 18 * k
        parts.append(f'<line x1="{w - right + 10}" y1="{ly}" x2="{w - right + 28}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{w - right + 32}" y="{ly + 4}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
