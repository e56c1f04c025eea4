"""A model's Capability traced through every breakdown (issue 15, item 6).

demo-patchy showed 37.0 (10 PASS of 27 decided) while its category table, heatmaps and
`imagebench breakdown` showed only Text Rendering and "-" for the categories whose decided FAILs
all came from missing images. Here the real demo-patchy model (every 16th image missing, three
invalid objects) on the suite's first 40 prompts, nothing for the rest, scored by a real flow run
with the real Tesseract judge: every breakdown adds up to the leaderboard's Capability, and each
image card says what the image counted as."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

MODEL = "demo-patchy"
SHOWN = 40  # prompts the model has objects for (the rest: missing)


def invoke(*args: str):
    from flows.cli import app

    r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def _json(output: str):
    return json.loads(output[output.index("["):output.rindex("]") + 1])


class _Table(HTMLParser):
    """Rows (lists of cell texts) of the table with the given id, tbody and tfoot apart."""

    def __init__(self, table_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.table_id, self.inside, self.part = table_id, False, None
        self.rows: dict[str, list[list[str]]] = {"tbody": [], "tfoot": []}
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag in ("tbody", "tfoot"):
            self.part = tag
        elif self.inside and self.part and tag == "tr":
            self.rows[self.part].append([])
        elif self.inside and self.part and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if self.inside and tag in ("td", "th") and self.cell is not None and self.part:
            self.rows[self.part][-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag in ("tbody", "tfoot"):
            self.part = None
        elif tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_every_breakdown_of_a_patchy_model_adds_up_to_its_capability(built_reference, tmp_path):
    from schemas.settings import load_settings
    from tasks.store.demo import CONTENDERS, DEMO_PHOTOS, load_photo, render_model
    from tasks.scores.suite import load_suite

    home, objects, _ = built_reference
    suite = load_suite(load_settings().suite_path)
    patchy = next(m for m in CONTENDERS if m.model_id == MODEL)
    photos = [load_photo(name) for name in DEMO_PHOTOS]
    for key, data in render_model(patchy, [(p.prompt_id, p.prompt) for p in suite.prompts[:SHOWN]], photos).items():
        path = objects / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    invoke("score", "--model", MODEL)

    (row,) = [r for r in _json(invoke("leaderboard", "--format", "json")) if r["model_id"] == MODEL]
    passed, decided = row["verdicts_pass"], row["verdicts_pass"] + row["verdicts_fail"]
    n_missing = len(suite.prompts) - SHOWN + SHOWN // patchy.missing_every
    assert row["images_missing"] == n_missing and row["images_quarantined"] == patchy.corrupt_prompts
    assert passed > 0  # the OCR judge read the demo's text on some Text Rendering images
    assert row["capability"] == pytest.approx(100.0 * passed / decided)
    # decided = the judged Text Rendering images + every image that never came (FAIL by rule)
    assert decided > n_missing + patchy.corrupt_prompts

    for by in ("category", "subcategory", "tag", "difficulty"):
        groups = _json(invoke("breakdown", "--model", MODEL, "--by", by, "--format", "json"))
        assert sum(g["prompts"] for g in groups) == len(suite.prompts)
        assert sum(g["pass"] for g in groups) == passed, by
        assert sum(g["decided"] for g in groups) == decided, by
        assert sum(g["fail_no_image"] for g in groups) == n_missing + patchy.corrupt_prompts, by
        for g in groups:
            assert g["decided"] == g["pass"] + g["fail"] and g["prompts"] == g["decided"] + g["undecided"], g
            if g["decided"]:  # a figure wherever the headline counts something
                assert g["capability"] == pytest.approx(100.0 * g["pass"] / g["decided"]), g
            else:
                assert g["capability"] is None, g
    cats = {g["category"]: g for g in _json(invoke("breakdown", "--model", MODEL, "--format", "json"))}
    # Categories the model sent nothing for: all FAIL, shown as 0.0 (was "-").
    assert cats["Human Realism"]["capability"] == 0.0
    assert cats["Human Realism"]["fail_no_image"] == cats["Human Realism"]["prompts"]
    table = invoke("breakdown", "--model", MODEL)
    last = [line for line in table.splitlines() if line.startswith("│")][-1]
    # the terminal writes it in the one number style (docs/REPORT.md): one decimal
    assert last.split("│")[1].strip() == "all" and last.split("│")[2].strip() == f"{row['capability']:.1f}"

    # The static site: the model page's category table and total, the heatmap cells, the cards.
    out = tmp_path / "site"
    invoke("report", "--out", str(out))
    page = (out / "models" / f"{MODEL}.html").read_text(encoding="utf-8")
    parsed = _Table("by-category")
    parsed.feed(page)
    body, (foot,) = parsed.rows["tbody"], parsed.rows["tfoot"]
    assert [r[0] for r in body] == list(cats)
    # columns: category, capability, PASS, FAIL, of which no image, undecided, EPS, prompts
    assert sum(int(r[2]) for r in body) == passed == int(foot[2])
    assert sum(int(r[2]) + int(r[3]) for r in body) == decided == int(foot[2]) + int(foot[3])
    assert foot[1] == f"{row['capability']:.1f}"
    for r in body:
        assert r[1] == f"{cats[r[0]]['capability']:.1f}"
    index = (out / "index.html").read_text(encoding="utf-8")
    for cat, g in cats.items():
        cell = re.search(rf'<g class="cell" data-row="{MODEL}" data-col="{re.escape(cat)}" data-value="([^"]*)">'
                         r"<title>([^<]*)</title>", index)
        assert cell and float(cell.group(1)) == pytest.approx(g["capability"], abs=1e-3), (cat, cell)
        assert f"{g['pass']} PASS, {g['fail']} FAIL" in cell.group(2)
    assert page.count("counted as FAIL: quarantined image") == patchy.corrupt_prompts
    assert page.count("counted as FAIL: missing image") == n_missing
    # Every FAIL the headline counts is a card that says FAIL (the judge's and the no-image ones).
    assert page.count('<span class="verdict fail">FAIL</span>') == decided - passed
    assert page.count('<span class="verdict pass">PASS</span>') == passed
