"""Render ReportData into a self-contained static site (no network at view time).

Layout of ``out_dir``::

    index.html              leaderboard (sortable), Capability-vs-EPS scatter, heatmaps
    models/<page>.html      one page per model: every image with mu, verdict, rationale, state
    thumbs/<sha>-s.jpg      thumbnails (max 256 px), content-addressed: sha256 of the source bytes
    thumbs/<sha>-l.jpg      larger copy (max 1024 px) that a thumbnail links to (the original
                            bytes when they are a JPEG/WebP that small; .webp then)
    static/                 style.css, report.js (sorting + filters, plain JS), favicon.svg
    leaderboard.json        the leaderboard rows as data
    .imagebench-report      marker: this directory is a generated report (safe to rebuild into)

All text from data is HTML-escaped (Jinja2 autoescape; the SVG charts escape with html.escape),
and each page carries a Content-Security-Policy that allows only the site's own script file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from tasks.report.model import GroupScore, ImageRow, LeaderboardRow, ReportData
from tasks.scores import display  # the one number style of the terminal and the pages (docs/REPORT.md)
from tasks.scores.display import finite
from tasks.report.svg import HeatCol, HeatRow, ScatterPoint, heatmap, scatter

__all__ = ["MARKER", "ReportError", "build_report", "page_name"]

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
STATIC_FILES = ("style.css", "report.js", "favicon.svg")
MARKER = ".imagebench-report"
THUMB_VERSION = b"imagebench-thumb/1"  # part of the content address: change it when sizes/quality change
THUMB_SIZES = {"s": (256, 80), "l": (1024, 88)}  # suffix -> (max side, JPEG quality)
LARGE_EXTS = ("jpg", "webp")
THUMB_RE = re.compile(r"^[0-9a-f]{32}-(s\.jpg|l\.(jpg|webp))$")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
)
UNDECIDED = ("ERROR", "UNPARSABLE")
NO_IMAGE_STATES = ("missing", "quarantined")  # FAIL by rule (docs/STATISTICS.md)


class ReportError(RuntimeError):
    """The report cannot be written (e.g. the output directory holds something else)."""


# ---------------------------------------------------------------------------------------------
# names and formatting


def page_name(model_id: str) -> str:
    """A safe, case-insensitively unique file stem for a model page. Plain lower-case ids
    (``[a-z0-9][a-z0-9._-]*``, no ``..``) are kept as they are; anything else is sanitised and
    suffixed with a hash of the original id, so two ids never share a page."""
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,99}", model_id) and ".." not in model_id:
        return model_id
    base = re.sub(r"[^a-z0-9._-]+", "-", model_id.lower()).replace("..", "-").strip(".-_")[:60] or "model"
    return f"{base}-{hashlib.sha256(model_id.encode('utf-8')).hexdigest()[:10]}"


def _num(x: float | None) -> str:
    """A 0..100 score in the one style (``44.4``; ``–`` when absent)."""
    return display.score(x)


def ci_text(x: float | None, lo: float | None, hi: float | None) -> str:
    """``62.3 [58.1, 66.0]``; the bare value when there is no interval; ``–`` when no value."""
    return display.interval(x, lo, hi)


def rank_text(row: LeaderboardRow) -> str:
    """``2 (1–3)``: rank and its band; just ``2`` when the band is a single place."""
    if row.rank is None:
        return "–"
    best = row.rank if row.rank_best is None else row.rank_best
    worst = row.rank if row.rank_worst is None else row.rank_worst
    return str(row.rank) if best == worst == row.rank else f"{row.rank} ({best}–{worst})"


def row_flags(row: LeaderboardRow) -> list[tuple[str, str, str]]:
    """(text, css class, explanation) for every flag of a row, derived ones first, deduplicated."""
    out: list[tuple[str, str, str]] = []
    if row.uncalibrated:
        out.append(("UNCALIBRATED", "bad", "computed with demo weights: not a real HPSv3 score"))
    if not row.complete:
        out.append(("incomplete", "warn", "missing or quarantined images counted as losses"))
    if row.provisional:
        out.append(("provisional", "warn", "not every prompt has a PASS/FAIL verdict yet"))
    seen = {t.lower() for t, _, _ in out}
    for f in row.flags:
        if str(f).lower() not in seen:
            seen.add(str(f).lower())
            out.append((str(f), "info", str(f)))
    return out


# ---------------------------------------------------------------------------------------------
# files


def _write_text(path: Path, text: str) -> None:
    """Atomic write (temp file in the same directory, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prepare_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER).exists():
        raise ReportError(
            f"{out_dir} is not empty and holds no {MARKER} marker: refusing to write a report over "
            "other files (choose an empty or new directory)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text("generated by imagebench report; rebuilt in place\n", encoding="utf-8")


@dataclass
class Thumb:
    small: str | None = None  # path relative to out_dir ("thumbs/<sha>-s.jpg")
    large: str | None = None
    width: int | None = None  # of the small thumbnail
    height: int | None = None
    problem: str | None = None  # why there is no thumbnail (file not found, cannot decode)


def _resolve(image_path: Path | str | None, root: Path | None) -> Path | None:
    if image_path is None or str(image_path) == "":
        return None
    p = Path(image_path)
    if not p.is_absolute() and root is not None:
        p = Path(root) / p
    return p


def _save_jpeg(img: object, dest: Path, quality: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        img.save(tmp, "JPEG", quality=quality)  # type: ignore[attr-defined]
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _make_thumbs(src: Path, thumbs_dir: Path) -> Thumb:
    """Small JPEG thumbnail + larger copy, named by the sha256 of the source bytes. The larger
    copy is the original bytes when they already are a JPEG/WebP of at most 1024 px, else a JPEG."""
    from PIL import Image, ImageOps

    try:
        data = src.read_bytes()
    except FileNotFoundError:
        return Thumb(problem="image file not found")
    except OSError as exc:
        return Thumb(problem=f"image file unreadable ({exc.__class__.__name__})")
    digest = hashlib.sha256(THUMB_VERSION + b"\0" + data).hexdigest()[:32]
    small = thumbs_dir / f"{digest}-s.jpg"
    if small.exists():
        large = next(
            (thumbs_dir / f"{digest}-l.{e}" for e in LARGE_EXTS if (thumbs_dir / f"{digest}-l.{e}").exists()), None
        )
        if large is not None:
            try:
                with Image.open(small) as im:
                    w, h = im.size
                return Thumb(f"thumbs/{small.name}", f"thumbs/{large.name}", w, h)
            except Exception:  # a damaged cached thumbnail: make it again
                pass
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            animated = getattr(im, "is_animated", False)
            side_s, q_s = THUMB_SIZES["s"]
            side_l, q_l = THUMB_SIZES["l"]
            if fmt == "JPEG":
                im.draft("RGB", (side_l, side_l))  # decode big JPEGs at a reduced scale
            im.load()
            orig_size = im.size
            im = ImageOps.exif_transpose(im)
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                rgba = im.convert("RGBA")
                bg = Image.new("RGB", rgba.size, (255, 255, 255))
                bg.paste(rgba, mask=rgba.getchannel("A"))
                im = bg
            else:
                im = im.convert("RGB")
            if fmt in ("JPEG", "WEBP") and not animated and max(orig_size) <= side_l:
                large = thumbs_dir / f"{digest}-l.{'jpg' if fmt == 'JPEG' else 'webp'}"
                _write_bytes(large, data)
            else:
                big = im.copy()
                big.thumbnail((side_l, side_l), Image.Resampling.LANCZOS)
                large = thumbs_dir / f"{digest}-l.jpg"
                _save_jpeg(big, large, q_l)
            t = im.copy()
            t.thumbnail((side_s, side_s), Image.Resampling.BICUBIC)
            _save_jpeg(t, small, q_s)
    except Exception as exc:  # not an image, truncated, decompression bomb, ...
        return Thumb(problem=f"image cannot be decoded ({exc.__class__.__name__})")
    return Thumb(f"thumbs/{small.name}", f"thumbs/{large.name}", t.size[0], t.size[1])


def _write_bytes(dest: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _all_thumbs(images: list[ImageRow], root: Path | None, thumbs_dir: Path) -> dict[Path, Thumb]:
    thumbs_dir.mkdir(parents=True, exist_ok=True)
    paths = sorted({p for r in images if r.state == "ok" and (p := _resolve(r.image_path, root)) is not None})
    if not paths:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        return dict(zip(paths, pool.map(lambda p: _make_thumbs(p, thumbs_dir), paths), strict=True))


# ---------------------------------------------------------------------------------------------
# view models


@dataclass
class RowView:
    row: LeaderboardRow
    page: str  # "models/<name>.html" (relative to index)
    rank_text: str
    overall: str
    capability: str
    eps: str
    judged: str  # "12/192": prompts a judge decided (docs/STATISTICS.md section 1)
    judged_title: str
    decided: str  # "27/192 (14.1%)": PASS/FAIL, missing and quarantined images included; the coverage
    eps_scored: str
    flags: list[tuple[str, str, str]]
    flags_text: str


@dataclass
class CardView:
    img: ImageRow
    thumb: Thumb | None
    state_label: str  # "ok", "missing", "quarantined: not_decodable", "unreadable: ..."
    shown: bool  # a thumbnail is shown (else a placeholder)
    verdict_class: str
    filter_key: str  # PASS / FAIL / undecided / unjudged / noimage (model page filter)
    mu: str
    verdict_text: str = "not judged"  # what the image counted as: PASS / FAIL / ERROR / UNPARSABLE / not judged
    counted: str = ""  # why, when no judge decided it ("counted as FAIL: missing image")


def _order_rows(rows: list[LeaderboardRow]) -> list[LeaderboardRow]:
    """The headline first (Overall, then EPS for a model not judged yet), as the arenas list theirs:
    the rank band is shown beside it, never the order (issue 26 item 5)."""

    def key(r: LeaderboardRow) -> tuple:
        ov, ep = finite(r.overall), finite(r.eps)
        return (ov is None, -(ov or 0.0), ep is None, -(ep or 0.0), r.model_id)

    return sorted(rows, key=key)


def _categories(data: ReportData) -> list[str]:
    seen: list[str] = []
    for src in (
        [data.categories or []],
        [list(v) for v in data.by_category.values()],
        [[i.category for i in data.images]],
    ):
        for lst in src:
            for c in lst:
                if c not in seen:
                    seen.append(c)
    if data.categories:
        return seen
    try:
        from schemas.suite import CATEGORIES
    except Exception:  # pragma: no cover - the report does not need the suite
        return seen
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(seen, key=lambda c: (order.get(c, len(order)), seen.index(c)))


def _tag_groups(data: ReportData, categories: list[str]) -> list[tuple[str | None, str]]:
    """(category, tag) in category order, tags in first-seen order."""
    tag_cat: dict[str, str | None] = {}
    for i in data.images:
        tag_cat.setdefault(i.tag, i.category)
    if data.tag_categories:
        tag_cat.update(data.tag_categories)
    tags: list[str] = list(tag_cat)
    for per in data.by_tag.values():
        for t in per:
            if t not in tag_cat:
                tag_cat[t] = None
                tags.append(t)
    cat_order = {c: i for i, c in enumerate(categories)}
    first = {t: i for i, t in enumerate(tags)}
    tags = sorted(tags, key=lambda t: (cat_order.get(tag_cat[t] or "", len(cat_order)), first[t]))
    return [(tag_cat[t], t) for t in tags]


def _state_label(img: ImageRow, thumb: Thumb | None) -> tuple[str, bool]:
    if img.state == "ok":
        if thumb is None:
            return "ok, but no image file recorded", False
        if thumb.problem:
            return thumb.problem, False
        return "image ok", True
    if img.state == "quarantined":
        return f"quarantined: {img.reason}" if img.reason else "quarantined", False
    if img.state == "missing":
        return "missing: no image submitted", False
    return img.state or "unknown state", False


def _card(img: ImageRow, thumbs: dict[Path, Thumb], root: Path | None) -> CardView:
    p = _resolve(img.image_path, root) if img.state == "ok" else None
    thumb = thumbs.get(p) if p is not None else None
    label, shown = _state_label(img, thumb)
    v = (img.verdict or "").upper()
    counted = ""
    if img.state in NO_IMAGE_STATES:  # no image: a FAIL by rule, in the headline and every breakdown
        v, counted = "FAIL", f"counted as FAIL: {img.state} image"
    if img.state in NO_IMAGE_STATES or not shown:
        fkey = "noimage"
    elif v in ("PASS", "FAIL"):
        fkey = v
    elif v in UNDECIDED:
        fkey = "undecided"
    else:
        fkey = "unjudged"
    return CardView(
        img=img,
        thumb=thumb if shown else None,
        state_label=label,
        shown=shown,
        verdict_class={"PASS": "pass", "FAIL": "fail"}.get(v, "undecided" if v in UNDECIDED else "none"),
        filter_key=fkey,
        mu=display.mu(img.mu),
        verdict_text=v or "not judged",
        counted=counted,
    )


def _row_view(r: LeaderboardRow, page: str) -> RowView:
    flags = row_flags(r)
    judged_title = (f"{r.judged} of {r.total} prompts decided by a judge (PASS/FAIL on the model's image)"
                    if r.judged is not None and r.total else "")
    decided = display.count_of(r.decided, r.total)
    return RowView(
        row=r,
        page=page,
        rank_text=rank_text(r),
        overall=ci_text(r.overall, r.overall_lo, r.overall_hi),
        capability=ci_text(r.capability, r.capability_lo, r.capability_hi),
        eps=ci_text(r.eps, r.eps_lo, r.eps_hi),
        judged=display.count_of(r.judged, r.total),
        judged_title=judged_title,
        decided=decided if finite(r.coverage) is None else f"{decided} ({display.share(r.coverage)})",
        eps_scored=(
            f"{r.eps_prompts_scored}/{r.eps_prompts_eligible}"
            if r.eps_prompts_scored is not None and r.eps_prompts_eligible is not None
            else "–"
        ),
        flags=flags,
        flags_text=" ".join(t for t, _, _ in flags),
    )


def _dv(x: float | None) -> str:
    """Sort value of a numeric cell (empty: sorted last)."""
    x = finite(x)
    return "" if x is None else repr(x)


# ---------------------------------------------------------------------------------------------
# charts


def _scatter_svg(views: list[RowView], href_prefix: str) -> tuple[str, list[RowView]]:
    points, left_out = [], []
    for v in views:
        r = v.row
        x, y = finite(r.eps), finite(r.capability)
        if x is None or y is None:
            left_out.append(v)
            continue
        points.append(
            ScatterPoint(
                label=r.model_id,
                href=href_prefix + v.page,
                x=x,
                x_lo=finite(r.eps_lo),
                x_hi=finite(r.eps_hi),
                y=y,
                y_lo=finite(r.capability_lo),
                y_hi=finite(r.capability_hi),
                hollow=r.provisional,
                tooltip=f"{r.model_id}\nCapability {v.capability}\nEPS {v.eps}"
                + (f"\n{v.flags_text}" if v.flags_text else ""),
            )
        )
    svg = scatter(
        points,
        x_label="EPS (HPSv3 preference vs reference, 95% CI)",
        y_label="Capability (% PASS, 95% CI)",
        title="Capability vs EPS",
    )
    return svg, left_out


def _has_any(per_model: dict[str, dict[str, GroupScore]], attr: str) -> bool:
    return any(finite(getattr(g, attr)) is not None for m in per_model.values() for g in m.values())


def _cell_text(g: GroupScore | None, attr: str, val: float | None) -> str:
    """A heatmap cell's tooltip value: Capability carries its PASS / FAIL counts (FAILs of
    missing or quarantined images named: they count, as in the headline) and decided/total, and
    says "not judged" when the model has no figure at all (no verdict came from a judge)."""
    n = f" (n={g.n})" if g and g.n is not None else ""
    if attr != "capability" or g is None or g.decided is None or g.n is None:
        return f"{_num(val)}{n}"
    counts = f"{g.decided}/{g.n} decided"
    if val is None:
        fails = f", {g.decided} missing/quarantined FAIL" if g.decided else ""
        return f"not judged ({counts}{fails}; no judge verdict)"
    tally = ""
    if g.passed is not None and g.failed is not None:
        tally = f"{g.passed} PASS, {g.failed} FAIL" + (f" ({g.no_image} without an image)" if g.no_image else "") + "; "
    return f"{_num(val)} ({tally}{counts}, {g.judged} by a judge)"


def group_total(groups: list[GroupScore]) -> GroupScore | None:
    """The groups' counts summed: the model's own (its Capability is the headline, since a
    group's Capability is PASS / decided over the same prompts). None without counts."""
    fields = ("n", "decided", "judged", "passed", "failed", "no_image", "undecided")
    if not groups or any(getattr(g, f) is None for g in groups for f in fields):
        return None
    total = GroupScore(**{f: sum(getattr(g, f) for g in groups) for f in fields})
    if total.decided and any(finite(g.capability) is not None for g in groups):
        total.capability = 100.0 * total.passed / total.decided
    return total


def _category_heatmap(views: list[RowView], cats: list[str], data: ReportData, attr: str, label: str, uid: str) -> str:
    rows = [HeatRow(v.row.model_id, v.page) for v in views]
    cols = [HeatCol(c) for c in cats]
    cells = []
    for v in views:
        per = data.by_category.get(v.row.model_id, {})
        line = []
        for c in cats:
            g = per.get(c)
            val = finite(getattr(g, attr)) if g else None
            line.append((val, f"{v.row.model_id} × {c}: {label} {_cell_text(g, attr, val)}"))
        cells.append(line)
    return heatmap(rows, cols, cells, title=f"{label} by category", uid=uid, cell_w=92)


def _tag_heatmap(
    views: list[RowView], tags: list[tuple[str | None, str]], data: ReportData, attr: str, label: str, uid: str
) -> str:
    rows = [HeatRow(t, None, c or "other") for c, t in tags]
    cols = [HeatCol(v.row.model_id, v.page) for v in views]
    cells = []
    for c, t in tags:
        line = []
        for v in views:
            g = data.by_tag.get(v.row.model_id, {}).get(t)
            val = finite(getattr(g, attr)) if g else None
            line.append((val, f"{v.row.model_id} × {t} ({c}): {label} {_cell_text(g, attr, val)}"))
        cells.append(line)
    return heatmap(rows, cols, cells, title=f"{label} by tag", uid=uid, cell_w=52, cell_h=20)


# ---------------------------------------------------------------------------------------------
# the build


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = _num
    env.filters["dv"] = _dv
    env.filters["url"] = lambda s: quote(str(s), safe="/")
    return env


def build_report(data: ReportData, out_dir: Path, studies: list | tuple = (), vab: list | tuple = (),
                 leaderboard_note: str | None = None) -> Path:
    """Write the static site for ``data`` into ``out_dir`` and return the path of ``index.html``.

    ``studies``: links to Beauty Index study pages (tasks.report.study) listed on the index.
    ``vab``: links to VAB set collection pages (tasks.report.vab) listed on the index.
    ``leaderboard_note``: why there is no ImageBench leaderboard (a workspace of studies only,
    tasks/report/site.py): the index says so instead of drawing empty leaderboard sections.
    Rebuilding into the same directory is cheap (thumbnails are content-addressed and reused) and
    leaves no stale model pages or thumbnails behind. Refuses a non-empty directory that is not a
    previous report."""
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    env = _env()
    root = Path(data.image_root) if data.image_root is not None else None

    ordered = _order_rows(list(data.rows))
    ids = [r.model_id for r in ordered]
    dupes = [m for m, n in Counter(ids).items() if n > 1]
    if dupes:
        raise ReportError(f"models listed twice on the leaderboard: {dupes}")
    pages: dict[str, str] = {}
    taken: set[str] = set()
    for m in ids + sorted({i.model_id for i in data.images} - set(ids)):
        name = page_name(m)
        if name.lower() in taken:  # cannot happen for distinct ids unless hashes collide
            raise ReportError(f"two models map to the page name {name!r}")
        taken.add(name.lower())
        pages[m] = f"models/{name}.html"

    views = [_row_view(r, pages[r.model_id]) for r in ordered]
    categories = _categories(data)
    tags = _tag_groups(data, categories)
    thumbs = _all_thumbs(data.images, root, out_dir / "thumbs")

    # static assets
    (out_dir / "static").mkdir(exist_ok=True)
    for name in STATIC_FILES:
        shutil.copyfile(STATIC / name, out_dir / "static" / name)

    any_uncal = any(r.uncalibrated for r in ordered)
    common = {"title": data.title, "meta": data.meta, "generated_at": data.generated_at, "csp": CSP}

    # index
    scatter_svg, not_plotted = _scatter_svg(views, "")
    charts: list[tuple[str, str, str]] = []  # (id, heading, svg)
    if categories and _has_any(data.by_category, "capability"):
        charts.append(
            (
                "cap-by-category",
                "Capability by category",
                _category_heatmap(views, categories, data, "capability", "Capability", "hm-cap-cat"),
            )
        )
    if categories and _has_any(data.by_category, "eps"):
        charts.append(
            (
                "eps-by-category",
                "EPS by category",
                _category_heatmap(views, categories, data, "eps", "EPS", "hm-eps-cat"),
            )
        )
    tag_charts: list[tuple[str, str, str]] = []
    if tags and _has_any(data.by_tag, "capability"):
        tag_charts.append(
            (
                "cap-by-tag",
                "Capability by tag",
                _tag_heatmap(views, tags, data, "capability", "Capability", "hm-cap-tag"),
            )
        )
    if tags and _has_any(data.by_tag, "eps"):
        tag_charts.append(("eps-by-tag", "EPS by tag", _tag_heatmap(views, tags, data, "eps", "EPS", "hm-eps-tag")))
    index_html = env.get_template("index.html").render(
        **common,
        root="",
        views=views,
        any_uncalibrated=any_uncal,
        any_incomplete=any(not r.complete for r in ordered),
        any_provisional=any(r.provisional for r in ordered),
        scatter=Markup(scatter_svg),
        not_plotted=not_plotted,
        charts=[(i, h, Markup(s)) for i, h, s in charts],
        tag_charts=[(i, h, Markup(s)) for i, h, s in tag_charts],
        studies=list(studies),
        vab=list(vab),
        leaderboard_note=leaderboard_note,
    )
    index = out_dir / "index.html"
    _write_text(index, index_html)

    # model pages
    by_model: dict[str, list[ImageRow]] = defaultdict(list)
    for img in data.images:
        by_model[img.model_id].append(img)
    rows_by_id = {r.model_id: v for r, v in zip(ordered, views, strict=True)}
    tmpl = env.get_template("model.html")
    cat_order = {c: i for i, c in enumerate(categories)}
    for m, page in pages.items():
        imgs = sorted(
            by_model.get(m, []), key=lambda i: (cat_order.get(i.category, len(cat_order)), i.category, i.prompt_id)
        )
        groups: list[tuple[str, str, list[CardView], Counter]] = []
        for img in imgs:
            if not groups or groups[-1][0] != img.category:
                groups.append((img.category, f"cat-{len(groups) + 1}", [], Counter()))
            card = _card(img, thumbs, root)
            groups[-1][2].append(card)
            groups[-1][3][card.filter_key] += 1
            groups[-1][3]["nofail"] += bool(card.counted)  # no image: counted as FAIL
        per_cat = data.by_category.get(m, {})
        per_tag = data.by_tag.get(m, {})
        view = rows_by_id.get(m)
        html = tmpl.render(
            **common,
            root="../",
            model_id=m,
            view=view,
            uncalibrated=bool(view and view.row.uncalibrated),
            groups=groups,
            totals=sum((g[3] for g in groups), Counter()),
            n_cards=sum(len(g[2]) for g in groups),  # "All (n)": every card once
            cat_rows=[(c, per_cat[c]) for c in categories if c in per_cat],
            cat_total=group_total([per_cat[c] for c in categories if c in per_cat]),
            tag_rows=[(c, t, per_tag[t]) for c, t in tags if t in per_tag],
        )
        _write_text(out_dir / page, html)

    # data
    rows_json = []
    for r, v in zip(ordered, views, strict=True):
        d = dataclasses.asdict(r)
        d = {k: (finite(x) if isinstance(x, float) else x) for k, x in d.items()}
        d["page"] = v.page
        rows_json.append(d)
    _write_text(
        out_dir / "leaderboard.json",
        json.dumps({"title": data.title, "meta": data.meta, "rows": rows_json}, indent=1, ensure_ascii=False) + "\n",
    )

    # prune what an earlier build left behind
    keep_pages = {Path(p).name for p in pages.values()}
    for f in (out_dir / "models").glob("*.html"):
        if f.name not in keep_pages:
            f.unlink()
    keep_thumbs = {Path(x).name for t in thumbs.values() for x in (t.small, t.large) if x}
    for f in (out_dir / "thumbs").iterdir():
        if THUMB_RE.match(f.name) and f.name not in keep_thumbs:
            f.unlink()
    return index
