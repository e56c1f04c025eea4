"""Hand-written SVG charts (no plotting dependency): the Capability-vs-EPS scatter, heatmaps and bars
with 95% intervals (the Beauty Index pages and the VAB pages draw theirs with one helper).

Every string from data goes through ``esc``; the charts are inlined in the pages, so each cell
and point carries a ``<title>`` (the browser's tooltip) and points/labels link to model pages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

__all__ = ["HeatCol", "HeatRow", "IntervalBar", "ScatterPoint", "beauty_index_bars", "color_for", "heatmap", "interval_bars", "scatter"]

CHAR_W = 6.6  # average width of one character at 12px (label layout estimate)
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif\""


def esc(s: object) -> str:
    return escape(str(s), quote=True)


def fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


# viridis, 5 stops: perceptually uniform and readable for colour-blind readers
_STOPS = [
    (0.0, (0x44, 0x01, 0x54)),
    (0.25, (0x3B, 0x52, 0x8B)),
    (0.5, (0x21, 0x91, 0x8C)),
    (0.75, (0x5E, 0xC9, 0x62)),
    (1.0, (0xFD, 0xE7, 0x25)),
]


def color_for(value: float | None, lo: float = 0.0, hi: float = 100.0) -> tuple[str, str]:
    """(fill, text colour) for a value on [lo, hi]; grey for None."""
    if value is None:
        return "#ececec", "#777777"
    t = 0.0 if hi <= lo else min(1.0, max(0.0, (value - lo) / (hi - lo)))
    for (t0, c0), (t1, c1) in zip(_STOPS, _STOPS[1:], strict=False):
        if t <= t1:
            u = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
            rgb = tuple(round(a + (b - a) * u) for a, b in zip(c0, c1, strict=True))
            break
    lum = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    return "#{:02x}{:02x}{:02x}".format(*rgb), ("#111111" if lum > 140 else "#ffffff")


def _truncate(s: str, max_px: float) -> str:
    n = max(4, int(max_px / CHAR_W))
    return s if len(s) <= n else s[: n - 1] + "…"


def _wrap2(label: str, max_px: float) -> list[str] | None:
    """``label`` in at most two lines of ``max_px`` (split at the best space), or None."""
    if len(label) * CHAR_W <= max_px:
        return [label]
    best = None
    for i, ch in enumerate(label):
        if ch == " ":
            a, b = label[:i], label[i + 1 :]
            w = max(len(a), len(b)) * CHAR_W
            if w <= max_px and (best is None or w < best[0]):
                best = (w, [a, b])
    return best[1] if best else None


# ---------------------------------------------------------------------------------------------
# scatter


@dataclass
class ScatterPoint:
    label: str
    href: str | None
    x: float
    x_lo: float | None
    x_hi: float | None
    y: float
    y_lo: float | None
    y_hi: float | None
    hollow: bool = False  # provisional
    tooltip: str = ""


def _axis_range(values: list[float]) -> tuple[float, float, float]:
    lo, hi = min(values), max(values)
    lo, hi = lo - 3, hi + 3
    if hi - lo < 20:
        mid = (lo + hi) / 2
        lo, hi = mid - 10, mid + 10
    step = 10.0 if hi - lo > 40 else 5.0
    lo = max(0.0, math.floor(lo / step) * step)
    hi = min(100.0, math.ceil(hi / step) * step)
    if hi - lo < step:  # clamped into a sliver at 0 or 100
        lo, hi = (0.0, 20.0) if lo < 50 else (80.0, 100.0)
    return lo, hi, step


def scatter(
    points: list[ScatterPoint], *, x_label: str, y_label: str, title: str, width: int = 720, height: int = 480
) -> str:
    ml, mr, mt, mb = 60, 30, 24, 52
    pw, ph = width - ml - mr, height - mt - mb
    out = [
        # class "scales": drawn at the page's width (style.css), so a phone sees every point, smaller,
        # instead of the left part of a 720 px drawing (issue 26 item 7)
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart scatter scales" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" preserveAspectRatio="xMidYMid meet" role="img" aria-label="{esc(title)}" '
        f'{FONT} font-size="12">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    if not points:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">no model has both scores yet</text></svg>'
        )
        return "\n".join(out)
    xs = [v for p in points for v in (p.x, p.x_lo, p.x_hi) if v is not None]
    ys = [v for p in points for v in (p.y, p.y_lo, p.y_hi) if v is not None]
    x0, x1, xstep = _axis_range(xs)
    y0, y1, ystep = _axis_range(ys)

    def sx(v: float) -> float:
        return ml + (min(max(v, x0), x1) - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        return mt + ph - (min(max(v, y0), y1) - y0) / (y1 - y0) * ph

    # grid + ticks
    out.append('<g class="grid" stroke="#e3e3e3" stroke-width="1">')
    v = x0
    while v <= x1 + 1e-9:
        out.append(f'<line x1="{sx(v):.1f}" y1="{mt}" x2="{sx(v):.1f}" y2="{mt + ph}"/>')
        v += xstep
    v = y0
    while v <= y1 + 1e-9:
        out.append(f'<line x1="{ml}" y1="{sy(v):.1f}" x2="{ml + pw}" y2="{sy(v):.1f}"/>')
        v += ystep
    out.append("</g>")
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append('<g class="ticks" fill="#555">')
    v = x0
    while v <= x1 + 1e-9:
        out.append(f'<text x="{sx(v):.1f}" y="{mt + ph + 16}" text-anchor="middle">{v:g}</text>')
        v += xstep
    v = y0
    while v <= y1 + 1e-9:
        out.append(f'<text x="{ml - 8}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += ystep
    out.append("</g>")
    out.append(
        f'<text x="{ml + pw / 2}" y="{height - 12}" text-anchor="middle" font-weight="600" fill="#333">{esc(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(16 {mt + ph / 2}) rotate(-90)" text-anchor="middle" font-weight="600" fill="#333">'
        f"{esc(y_label)}</text>"
    )

    # labels: greedy placement (right, left, above, below, then further out) avoiding earlier labels
    placed: list[tuple[float, float, float, float]] = []
    marks = [(sx(p.x), sy(p.y)) for p in points]

    def overlaps(b: tuple[float, float, float, float]) -> bool:
        if b[0] < 2 or b[2] > width - 2 or b[1] < 2 or b[3] > height - 2:
            return True
        for o in placed:
            if b[0] < o[2] and b[2] > o[0] and b[1] < o[3] and b[3] > o[1]:
                return True
        return any(b[0] - 4 < mx < b[2] + 4 and b[1] - 4 < my < b[3] + 4 for mx, my in marks)

    order = sorted(range(len(points)), key=lambda i: (-points[i].y, points[i].x))
    # model -> (x, y, anchor, leader line?) or None: no free place (the label would cover
    # another one; the point keeps its name in its tooltip and in every table)
    label_pos: dict[int, tuple[float, float, str, bool] | None] = {}
    for i in order:
        p = points[i]
        cx, cy = marks[i]
        text = _truncate(p.label, 200)
        w, h = len(text) * CHAR_W, 13.0
        cands = []
        # Close to the point first; a cluster of points pushes labels further out, where a
        # leader line ties each label to its point.
        for d in (8, 20, 34, 52, 74, 100, 130):
            cands += [
                (cx + d, cy + 4, "start"),
                (cx - d, cy + 4, "end"),
                (cx - w / 2, cy - d + 2, "start"),
                (cx - w / 2, cy + d + 8, "start"),
                (cx + d, cy - d + 2, "start"),
                (cx - d, cy + d + 8, "end"),
                (cx + d, cy + d + 8, "start"),
                (cx - d, cy - d + 2, "end"),
            ]
        label_pos[i] = None
        for tx, ty, anchor in cands:
            left = tx if anchor == "start" else tx - w
            box = (left, ty - h + 3, left + w, ty + 3)
            if not overlaps(box):
                placed.append(box)
                label_pos[i] = (tx, ty, anchor, abs(tx - cx) > 40 or abs(ty - cy) > 40)
                break

    for i, p in enumerate(points):
        cx, cy = marks[i]
        color = "#1f5fbf"
        out.append(f'<g class="point" data-model="{esc(p.label)}">')
        out.append(f"<title>{esc(p.tooltip or p.label)}</title>")
        if p.href:
            out.append(f'<a href="{esc(p.href)}">')
        if p.x_lo is not None and p.x_hi is not None:
            out.append(
                f'<line class="errbar" x1="{sx(p.x_lo):.1f}" y1="{cy:.1f}" x2="{sx(p.x_hi):.1f}" y2="{cy:.1f}" '
                f'stroke="{color}" stroke-opacity="0.55" stroke-width="1.5"/>'
            )
            for e in (p.x_lo, p.x_hi):
                out.append(
                    f'<line x1="{sx(e):.1f}" y1="{cy - 4:.1f}" x2="{sx(e):.1f}" y2="{cy + 4:.1f}" stroke="{color}" stroke-opacity="0.55"/>'
                )
        if p.y_lo is not None and p.y_hi is not None:
            out.append(
                f'<line class="errbar" x1="{cx:.1f}" y1="{sy(p.y_lo):.1f}" x2="{cx:.1f}" y2="{sy(p.y_hi):.1f}" '
                f'stroke="{color}" stroke-opacity="0.55" stroke-width="1.5"/>'
            )
            for e in (p.y_lo, p.y_hi):
                out.append(
                    f'<line x1="{cx - 4:.1f}" y1="{sy(e):.1f}" x2="{cx + 4:.1f}" y2="{sy(e):.1f}" stroke="{color}" stroke-opacity="0.55"/>'
                )
        fill = "#ffffff" if p.hollow else color
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5.5" fill="{fill}" stroke="{color}" stroke-width="2"/>')
        if label_pos[i] is not None:
            tx, ty, anchor, leader = label_pos[i]
            if leader:  # from the point to the near edge of its label
                out.append(
                    f'<line class="leader" x1="{cx:.1f}" y1="{cy:.1f}" x2="{tx:.1f}" y2="{ty - 4:.1f}" '
                    f'stroke="#999999" stroke-width="0.8"/>'
                )
            out.append(
                f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" fill="#222" paint-order="stroke" '
                f'stroke="#ffffff" stroke-width="3" stroke-linejoin="round">{esc(_truncate(p.label, 200))}</text>'
            )
        if p.href:
            out.append("</a>")
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# heatmap


@dataclass
class HeatRow:
    label: str
    href: str | None = None
    group: str | None = None  # a group heading is drawn when this changes between rows


@dataclass
class HeatCol:
    label: str
    href: str | None = None


def heatmap(
    rows: list[HeatRow],
    cols: list[HeatCol],
    cells: list[list[tuple[float | None, str]]],
    *,
    title: str,
    uid: str,
    cell_w: int = 62,
    cell_h: int = 24,
    digits: int = 0,
) -> str:
    """``cells[r][c] = (value 0..100 or None, tooltip)``. Values are printed in the cells and in
    each cell's ``<title>``; rows/columns with an ``href`` link to it."""
    label_w = min(
        260.0,
        max([len(r.label) for r in rows] + [len(g) for g in {r.group for r in rows if r.group}] + [6]) * CHAR_W + 14,
    )
    longest_col = max([len(c.label) for c in cols] + [4])
    # column labels: horizontal (wrapped on spaces into <= 2 lines) when they fit, else rotated
    wrapped = [_wrap2(c.label, cell_w - 12) for c in cols]
    rotate = any(w is None for w in wrapped)
    angle = 40.0
    if rotate:
        col_text = min(longest_col * CHAR_W, 200.0)
        header_h = col_text * math.sin(math.radians(angle)) + 18
        right_pad = max(20.0, col_text * math.cos(math.radians(angle)) - cell_w * 0.5)
    else:
        lines = max(len(w) for w in wrapped if w is not None) if wrapped else 1
        header_h, right_pad = 12.0 + 14.0 * lines, 10.0
    group_h = 22
    n_groups = sum(1 for i, r in enumerate(rows) if r.group and (i == 0 or rows[i - 1].group != r.group))
    legend_h = 44
    lw = min(240.0, max(120.0, cell_w * len(cols)))  # legend bar width
    width = max(label_w + cell_w * len(cols) + right_pad, label_w + lw + 110)
    height = header_h + cell_h * len(rows) + group_h * n_groups + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart heatmap" id="{esc(uid)}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{esc(title)}" {FONT} font-size="12">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    # column headers
    for j, c in enumerate(cols):
        x = label_w + cell_w * j + cell_w / 2
        text = esc(_truncate(c.label, 200))
        if rotate:
            el = (
                f'<text transform="translate({x - 4:.1f} {header_h - 6:.1f}) rotate(-{angle:g})" text-anchor="start" '
                f'fill="#222">{text}<title>{esc(c.label)}</title></text>'
            )
        else:
            parts = wrapped[j] or [c.label]
            y0 = header_h - 8 - 14 * (len(parts) - 1)
            spans = "".join(
                f'<tspan x="{x:.1f}" y="{y0 + 14 * k:.1f}">{esc(part)}</tspan>' for k, part in enumerate(parts)
            )
            el = f'<text text-anchor="middle" fill="#222">{spans}<title>{esc(c.label)}</title></text>'
        out.append(f'<a href="{esc(c.href)}">{el}</a>' if c.href else el)
    y = header_h
    prev_group: str | None = None
    for i, r in enumerate(rows):
        if r.group and r.group != prev_group:
            out.append(
                f'<text class="group" x="4" y="{y + group_h - 6:.1f}" font-weight="700" fill="#333">{esc(r.group)}</text>'
            )
            y += group_h
        prev_group = r.group
        text = esc(_truncate(r.label, label_w - 14))
        el = f'<text x="{label_w - 8:.1f}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end" fill="#222">{text}<title>{esc(r.label)}</title></text>'
        out.append(f'<a href="{esc(r.href)}">{el}</a>' if r.href else el)
        for j, _c in enumerate(cols):
            value, tip = cells[i][j]
            fill, ink = color_for(value)
            x = label_w + cell_w * j
            dv = "" if value is None else f"{value:.4f}"
            out.append(
                f'<g class="cell" data-row="{esc(r.label)}" data-col="{esc(cols[j].label)}" data-value="{dv}">'
                f"<title>{esc(tip)}</title>"
                f'<rect x="{x + 1:.1f}" y="{y + 1:.1f}" width="{cell_w - 2}" height="{cell_h - 2}" rx="2" fill="{fill}"/>'
                f'<text x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="middle" fill="{ink}" '
                f'font-size="11">{fmt(value, digits)}</text></g>'
            )
        y += cell_h
    # legend
    lx, ly = label_w, y + 14
    gid = f"{uid}-grad"
    out.append(f'<defs><linearGradient id="{esc(gid)}" x1="0" x2="1" y1="0" y2="0">')
    for t, rgb in _STOPS:
        out.append(f'<stop offset="{t:g}" stop-color="#%02x%02x%02x"/>' % rgb)
    out.append("</linearGradient></defs>")
    out.append(f'<rect x="{lx:.1f}" y="{ly:.1f}" width="{lw:.1f}" height="10" fill="url(#{esc(gid)})"/>')
    out.append(f'<text x="{lx:.1f}" y="{ly + 24:.1f}" fill="#555" font-size="11">0</text>')
    out.append(f'<text x="{lx + lw:.1f}" y="{ly + 24:.1f}" fill="#555" font-size="11" text-anchor="end">100</text>')
    fill, _ = color_for(None)
    out.append(f'<rect x="{lx + lw + 16:.1f}" y="{ly:.1f}" width="14" height="10" fill="{fill}"/>')
    out.append(f'<text x="{lx + lw + 34:.1f}" y="{ly + 9:.1f}" fill="#555" font-size="11">no score</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# bars with 95% intervals (the study page, the pooled forest, the VAB pages)


@dataclass(frozen=True)
class IntervalBar:
    """One row of :func:`interval_bars`: ``value`` on 0-100 (None: label only) and its interval."""

    label: str
    value: float | None
    lo: float | None = None
    hi: float | None = None
    tip: str = ""  # the row's <title> (the browser's tooltip)
    text: str = ""  # the value written beside the bar
    kind: str = ""  # a class of the row beside "bar" (ours, published, baseline)
    fill: str = "#3b528b"


def interval_bars(bars: list[IntervalBar], uid: str, title: str, *, bar_w: float, label_w: float | None = None,
                  aria: str | None = None, data: str = "label") -> str:
    """Horizontal bars (0-100) with 95% interval whiskers, one row per bar, in one of two layouts.
    ``label_w`` given: the labels right-aligned in a column that wide left of the bars, the values
    in a column right of them, a fixed size (the study page, the pooled forest). None: each label
    above its bar and the value right of the bar *and* of its whisker, never across it, in a
    viewBox at width 100% (class ``scales``: the chart shrinks with the page instead of being
    clipped; the VAB pages). ``data``: the row attribute that carries the label (``data-<data>``)."""
    above = label_w is None
    row_h = 44 if above else 26
    x0 = 8.0 if above else label_w
    width, height = x0 + bar_w + (64.0 if above else 90), row_h * len(bars) + (30 if above else 40)
    size = 'width="100%" preserveAspectRatio="xMinYMin meet"' if above else f'width="{width:.0f}" height="{height:.0f}"'
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars{" scales" if above else ""}" id="{esc(uid)}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" {size} role="img" aria-label="{esc(aria or title)}" {FONT} '
           f'font-size="{14 if above else 12}">',
           f"<title>{esc(title)}</title>",
           f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>']
    for t in (0, 25, 50, 75, 100):
        x = x0 + bar_w * t / 100
        out.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - (22 if above else 26):.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x:.1f}" y="{height - (8 if above else 10):.1f}" text-anchor="{"start" if above and t == 0 else "middle"}" '
                   f'fill="#555" font-size="{12 if above else 11}">{t}</text>')
    for i, b in enumerate(bars):
        y, v = (4 if above else 6) + row_h * i, b.value
        ym = y + (28 if above else 11)  # the bar's middle
        out.append(f'<g class="bar{" " + b.kind if b.kind else ""}" data-{data}="{esc(b.label)}" '
                   f'data-value="{"" if v is None else f"{v:.4f}"}"><title>{esc(b.tip)}</title>')
        if above:
            out.append(f'<text class="label" x="{x0:.1f}" y="{y + 14:.1f}" fill="#222">{esc(b.label)}</text>')
        else:
            out.append(f'<text x="{x0 - 8:.1f}" y="{y + 15:.1f}" text-anchor="end" fill="#222">{esc(b.label)}</text>')
        if v is not None:
            out.append(f'<rect x="{x0:.1f}" y="{ym - 7:.1f}" width="{bar_w * v / 100:.1f}" height="14" fill="{b.fill}"/>')
            end = v
            if b.lo is not None and b.hi is not None:
                xl, xh = x0 + bar_w * b.lo / 100, x0 + bar_w * b.hi / 100
                if above:
                    out.append(f'<g class="whisker" stroke="#111" stroke-width="1.5"><line x1="{xl:.1f}" y1="{ym:.1f}" x2="{xh:.1f}" '
                               f'y2="{ym:.1f}"/><line x1="{xl:.1f}" y1="{ym - 5:.1f}" x2="{xl:.1f}" y2="{ym + 5:.1f}"/>'
                               f'<line x1="{xh:.1f}" y1="{ym - 5:.1f}" x2="{xh:.1f}" y2="{ym + 5:.1f}"/></g>')
                    end = max(v, b.hi)
                else:
                    out.append(f'<line x1="{xl:.1f}" y1="{ym:.1f}" x2="{xh:.1f}" y2="{ym:.1f}" stroke="#111" stroke-width="1.5"/>')
                    for xe in (xl, xh):
                        out.append(f'<line x1="{xe:.1f}" y1="{ym - 5:.1f}" x2="{xe:.1f}" y2="{ym + 5:.1f}" stroke="#111" stroke-width="1.5"/>')
            if above:
                out.append(f'<text class="value" x="{x0 + bar_w * end / 100 + 5:.1f}" y="{ym + 5:.1f}" fill="#222">{b.text}</text>')
            else:
                out.append(f'<text x="{x0 + bar_w + 8:.1f}" y="{ym + 4:.1f}" fill="#222">{b.text}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _fnan(x, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def beauty_index_bars(rows: list[dict], uid: str = "bi-bars") -> str:
    """The Beauty Index per tool (study_index rows: tool, beauty_index and its interval, answers),
    best first, as :func:`interval_bars` (the study page; each tool of the pooled page's forest)."""
    label_w = min(240.0, max([len(r["tool"]) for r in rows] + [6]) * 6.6 + 14)
    bars = []
    for r in rows:
        bi, lo, hi = r["beauty_index"], r["beauty_index_lo"], r["beauty_index_hi"]
        ci = f"{_fnan(bi)} [{_fnan(lo)}, {_fnan(hi)}]" if bi is not None else "–"
        bars.append(IntervalBar(r["tool"], bi, lo, hi, tip=f"{r['tool']}: {ci} ({r['answers']} answers)", text=_fnan(bi)))
    return interval_bars(bars, uid, "Beauty Index per tool (95% intervals)", bar_w=420.0, label_w=label_w,
                         aria="Beauty Index per tool", data="tool")
