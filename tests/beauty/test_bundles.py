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

LABS = {"lab-one": 11, "lab-two": 22}
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
            r = cli("study", "export", "--study", lab, "--out", str(root / f"{lab}-bundle"))
            assert r.exit_code == 0, r.output
            out["bundles"][lab] = root / f"{lab}-bundle"
            out["boards"][lab] = json.loads(cli("study", "leaderboard", "--study", lab, "--format", "json").stdout)
    with pytest.MonkeyPatch.context() as mp:
        settings = workspace(root / "importer", mp, tools=())  # no model, no images, no EPS reference
        out["settings"] = settings
        out["imports"] = [cli("study", "import-bundle", str(b)) for b in out["bundles"].values()]
        out["analyze"] = [cli("study", "analyze", "--study", lab, "--mixed-resamples", "3") for lab in LABS]
        out["boards_here"] = {lab: json.loads(cli("study", "leaderboard", "--study", lab, "--format", "json").stdout) for lab in LABS}
        out["report"] = cli("report", "--out", str(root / "site"))
        out["again"] = cli("study", "import-bundle", str(out["bundles"]["lab-one"]))
        yield out


def test_imported_bundles_analyse_like_the_native_studies(labs):
    for r in labs["imports"] + labs["analyze"]:
        assert r.exit_code == 0, r.output
    for lab in LABS:
        # Same answers, same pre-registered analysis settings: the same Beauty Index and intervals.
        assert labs["boards_here"][lab] == labs["boards"][lab]
    assert "SHA256SUMS verified" in labs["imports"][0].output
    assert labs["again"].exit_code == 1 and "already exists in this workspace" in labs["again"].output


def test_report_of_a_workspace_with_studies_and_no_reference(labs):
    """Item 2: no EPS reference, no model scored: study pages, the pooled page and an index that
    says what is there; no leaderboard invented."""
    r, site = labs["report"], labs["root"] / "site"
    assert r.exit_code == 0, r.output
    assert not (labs["settings"].reference_dir / "eps-reference-v1.json").exists()
    index = (site / "index.html").read_text()
    assert 'id="no-leaderboard"' in index and "No ImageBench model has been scored" in index
    assert 'id="leaderboard-table"' not in index and 'id="scatter"' not in index
    assert "0 ImageBench model(s), 2 Beauty Index studies, 0 VAB set collection(s)" in index
    for lab in LABS:
        assert f'href="studies/{lab}.html"' in index
        page = (site / "studies" / f"{lab}.html").read_text()
        assert 'id="hypotheses-table"' in page and "not pre-registered" not in page.lower()
    assert 'href="pooled/beauty-index.html"' in index


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
])
def test_a_damaged_bundle_is_refused_by_name(labs, tmp_path, monkeypatch, damage, message):
    bundle = tmp_path / "bundle"
    shutil.copytree(labs["bundles"]["lab-one"], bundle)
    if damage == "edit":
        data = (bundle / "answers.csv").read_bytes()
        (bundle / "answers.csv").write_bytes(data.replace(b",yes,", b",no,", 1))
    elif damage == "extra":
        (bundle / "notes.txt").write_text("added later")
    else:
        (bundle / "preregistration.json").unlink()
        sums = [line for line in (bundle / "SHA256SUMS").read_text().splitlines() if "preregistration.json" not in line]
        (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    workspace(tmp_path / "home", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(bundle))
    assert r.exit_code == 1 and message in r.output, r.output
    assert not (tmp_path / "home" / "studies" / "lab-one").exists()  # nothing written
