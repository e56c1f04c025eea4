"""Capability adds up in plain SQL, and "judged" means one thing everywhere (issue 26 item 3).

The `verdicts` table has no row for the FAILs of missing or quarantined images, so an analyst's
`avg(verdict = 'PASS')` over demo-patchy gave 100.0 where the leaderboard said 44.4; the leaderboard
printed "judged 14%" (the decided share, those FAILs included) where `breakdown` said 12 judged;
the model page's "All (207)" sat over 192 cards. Here a real scoring run (the real demo-patchy
model: missing and invalid images, the real Tesseract judge) beside the baselines, one of them
given imported verdicts (PASS, FAIL, ERROR, UNPARSABLE, and a PASS for a prompt it has no image
for); then the one line of SQL that docs/LAKE.md documents, run with a plain `duckdb` connection on
the catalog file, gives the leaderboard's Capability of every model, and every output counts the
same prompts as judged."""

from __future__ import annotations

import csv
import json
import re
from html import unescape
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PATCHY = "demo-patchy"
SHOWN = 40  # prompts demo-patchy has objects for (the rest: missing)


def invoke(*args: str, columns: int = 240) -> str:
    from flows.cli import app

    r = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.stdout


def documented_query() -> str:
    """The one line under "The leaderboard's Capability of every model, in one line:" in docs/LAKE.md."""
    text = (REPO / "docs" / "LAKE.md").read_text(encoding="utf-8")
    after = text.split("The leaderboard's Capability of every model, in one line:", 1)[1]
    block = re.search(r"```sql\n(.*?)```", after, re.S).group(1).strip()
    assert "\n" not in block, block  # one line, as documented
    return block


@pytest.fixture(scope="module")
def scored(built_reference_template, tiny_model, tmp_path_factory):
    """A workspace (a copy of the built reference's) where demo-patchy was scored by a real flow run
    and base-a got imported verdicts; yields (settings, suite)."""
    import shutil

    from schemas.settings import load_settings
    from tasks.runs import pinned, units_aggregate
    from tasks.store.demo import CONTENDERS, DEMO_PHOTOS, load_photo, render_model
    from tests.flows.conftest import use_workspace

    root = tmp_path_factory.mktemp("capability-sql")
    shutil.copytree(built_reference_template / "home", root / "home")
    with pytest.MonkeyPatch.context() as mp:
        use_workspace(root, mp, tiny_model, reference_from=built_reference_template / "reference")
        settings = load_settings()
        settings.catalog_path.unlink()
        suite = pinned.load_pinned_suite(settings)
        units_aggregate.refresh(settings, suite)
        patchy = next(m for m in CONTENDERS if m.model_id == PATCHY)
        photos = [load_photo(name) for name in DEMO_PHOTOS]
        objects = root / "home" / "objects"
        for key, data in render_model(patchy, [(p.prompt_id, p.prompt) for p in suite.prompts[:SHOWN]], photos).items():
            (objects / key).parent.mkdir(parents=True, exist_ok=True)
            (objects / key).write_bytes(data)
        invoke("score", "--model", PATCHY)
        # base-a has images for the EPS-eligible prompts only: a verdict for another prompt is one
        # for an image that never came (FAIL whatever it says).
        eligible = [p.prompt_id for p in suite.prompts if p.eps_eligible]
        other = next(p.prompt_id for p in suite.prompts if not p.eps_eligible)
        verdicts = [(eligible[0], "PASS"), (eligible[1], "PASS"), (eligible[2], "PASS"), (eligible[3], "FAIL"),
                    (eligible[4], "ERROR"), (eligible[5], "UNPARSABLE"), (other, "PASS")]
        path = root / "verdicts.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model_id", "prompt_id", "verdict", "judge"])
            w.writerows(["base-a", p, v, "lab-judge"] for p, v in verdicts)
        invoke("import-verdicts", str(path))
        yield settings, suite, root


def test_the_documented_line_recomputes_every_published_capability(scored):
    import duckdb

    settings, suite, _ = scored
    board = {r["model_id"]: r for r in json.loads(invoke("leaderboard", "--format", "json"))}
    assert {PATCHY, "base-a", "base-b"} <= set(board)
    patchy, base_a, base_b = board[PATCHY], board["base-a"], board["base-b"]
    assert patchy["images_missing"] > 0 and patchy["images_quarantined"] > 0 and patchy["verdicts_pass"] > 0
    assert base_a["capability"] == pytest.approx(100 * 3 / (4 + base_a["images_missing"]))  # 3 PASS of 4 judged + FAILs by rule
    assert base_b["capability"] is None  # no judge decided anything: no figure, whatever the FAILs by rule

    # A plain DuckDB client on the catalog file, read-only: no imagebench code.
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    try:
        got = dict(con.execute(documented_query()).fetchall())
        naive = con.execute("SELECT 100 * avg(CAST(verdict = 'PASS' AS INTEGER)) FROM verdicts WHERE model_id = ?",
                            [PATCHY]).fetchone()[0]
        counts = {m: (j, d, n) for m, j, d, n in con.execute(
            "SELECT model_id, count(*) FILTER (judged), count(*) FILTER (decided), count(*) FROM capability_items GROUP BY model_id"
        ).fetchall()}
        no_image = con.execute("SELECT count(*) FROM capability_items WHERE model_id = ? AND why LIKE '% image'",
                               [PATCHY]).fetchone()[0]
    finally:
        con.close()
    assert set(got) == set(board)
    for m, row in board.items():
        if row["capability"] is None:
            assert got[m] is None, m
        else:
            assert got[m] == pytest.approx(row["capability"], rel=1e-12, abs=1e-12), m
        assert counts[m] == (row["judged"], row["decided"], row["prompts"]) == (
            row["judged"], row["verdicts_pass"] + row["verdicts_fail"], len(suite.prompts)), m
        assert row["coverage"] == pytest.approx(row["decided"] / row["prompts"])
    # What the issue found: the verdicts table alone does not give Capability.
    assert naive != pytest.approx(patchy["capability"])
    assert no_image == patchy["images_missing"] + patchy["images_quarantined"]
    assert patchy["judged"] == patchy["decided"] - no_image


def test_judged_means_the_same_on_every_output(scored):
    settings, suite, root = scored
    board = {r["model_id"]: r for r in json.loads(invoke("leaderboard", "--format", "json"))}
    table = invoke("leaderboard", columns=100)
    invoke("report", "--out", str(root / "site"))
    index = (root / "site" / "index.html").read_text(encoding="utf-8")
    for m, row in board.items():
        judged = f"{row['judged']}/{row['prompts']}"
        groups = json.loads(invoke("breakdown", "--model", m, "--format", "json"))
        assert sum(g["judged"] for g in groups) == row["judged"], m
        assert sum(g["decided"] for g in groups) == row["decided"], m
        line = next(line for line in table.splitlines() if f" {m} " in f" {line} ")
        assert f" {judged} " in f" {line} ", (m, line)
        cell = re.search(rf'<tr data-model="{re.escape(m)}".*?<td class="num judged"[^>]*>([^<]*)</td>', index, re.S)
        assert cell.group(1) == judged, m
        page = (root / "site" / "models" / f"{m}.html").read_text(encoding="utf-8")
        assert re.search(r'<dd id="judged"[^>]*>([^<]*)</dd>', page).group(1) == judged, m
        decided = re.search(r'<dd id="decided"[^>]*>([^<]*)</dd>', page).group(1)
        assert decided == f"{row['decided']}/{row['prompts']} ({100 * row['coverage']:.1f}%)", m
        # The model page's filters: "All" counts each card once.
        cards = page.count('<article class="card')
        assert cards == len(suite.prompts)
        assert f'data-filter="all" aria-pressed="true">All ({cards})</button>' in page, m
    patchy = board[PATCHY]
    # The same figure in the same style on the terminal, the breakdown and the pages.
    cap = f"{patchy['capability']:.1f}"
    total = invoke("breakdown", "--model", PATCHY).splitlines()
    last = [line for line in total if line.startswith("│")][-1].split("│")
    assert last[1].strip() == "all" and last[2].strip() == cap
    coverage_col = [h.strip() for h in next(line for line in total if "coverage" in line).split("┃")].index("coverage")
    assert last[coverage_col].strip() == f"{100 * patchy['coverage']:.1f}%"
    page = unescape((root / "site" / "models" / f"{PATCHY}.html").read_text(encoding="utf-8"))
    shown = re.search(r"<dt>Capability</dt><dd>([^<]*)</dd>", page).group(1)
    assert shown.startswith(cap + " [") and shown in table
