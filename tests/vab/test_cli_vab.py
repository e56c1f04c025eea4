"""`imagebench vab import-sets|import-answers|leaderboard|compare` end to end (in-process CLI), and
that `vab leaderboard` stays light (no torch, Prefect, GX)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.vab.test_sets import GOOD, _csv, _manifest, _png

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("IMAGEBENCH_HOME", str(h))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return h


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_vab_cli_import_leaderboard_compare(home, tmp_path):
    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    r = _invoke("vab", "import-sets", str(_manifest(src, GOOD)), "--name", "mine")
    assert r.exit_code == 0 and "2 tasks pinned" in r.output, r.output
    # the right judge, and one that always names shown slot 1 best and the last slot worst
    right = ["p1,0,1 2 3,2,3", "p1,1,3 1 2,3,1", "p1,2,2 3 1,1,2", "a1,0,1 2,1,", "a1,1,2 1,2,", "a1,2,2 1,2,"]
    slot1 = ["p1,0,1 2 3,1,3", "p1,1,3 1 2,1,3", "p1,2,2 3 1,1,3", "a1,0,1 2,1,", "a1,1,2 1,1,", "a1,2,2 1,1,"]
    for judge, rows in (("right", right), ("slot1", slot1)):
        r = _invoke("vab", "import-answers", str(_csv(tmp_path / f"{judge}.csv", rows)), "--sets", "mine", "--judge", judge)
        assert r.exit_code == 0 and f"imported 6 answers of judge {judge}" in r.output, r.output
    r = _invoke("vab", "leaderboard", "--sets", "mine", "--format", "json")
    assert r.exit_code == 0, r.output
    board = json.loads(r.stdout)
    assert [b["judge"] for b in board] == ["right", "slot1"]
    assert {k: board[0][k] for k in ("strict_best", "strict_worst", "strict_both", "tasks")} == {
        "strict_best": 100.0, "strict_worst": 100.0, "strict_both": 100.0, "tasks": 2}
    # slot1: p1's best (stored 2) is shown first only in trial 2, a1's (stored 1) only in trial 0
    assert (board[1]["strict_best"], board[1]["strict_both"], board[1]["judge_kind"]) == (0.0, 0.0, "import")
    assert board[1]["single_best"] == pytest.approx(100 * 2 / 6)
    r = _invoke("vab", "leaderboard", "--sets", "mine", "--by", "position", "--format", "json")
    rows = [x for x in json.loads(r.stdout) if x["judge"] == "slot1" and x["set_size"] == 3]
    assert [x["picked_best"] for x in rows] == [3, 0, 0]
    r = _invoke("vab", "leaderboard", "--sets", "mine", "--by", "size", "--format", "json")
    by_size = {(x["judge"], x["size"]): x for x in json.loads(r.stdout)}
    assert by_size[("right", 2)]["strict_worst"] is None and by_size[("right", 3)]["strict_both"] == 100.0
    r = _invoke("vab", "leaderboard", "--sets", "mine", "--by", "domain")
    assert r.exit_code == 0 and "photography" in r.output and "fine_art" in r.output, r.output
    r = _invoke("vab", "leaderboard", "--sets", "mine")
    assert r.exit_code == 0 and "random judge on this collection" in r.output and "26.5%" in r.output
    r = _invoke("vab", "compare", "right", "slot1", "--sets", "mine", "--format", "json")
    cmp = {x["metric"]: x for x in json.loads(r.stdout)}
    assert cmp["strict_both"]["only_a"] == 2 and cmp["strict_both"]["p_value"] == 0.5
    assert cmp["strict_worst"]["tasks"] == 1
    # the lake tables are DuckDB views of `imagebench sql`
    r = _invoke("sql", "SELECT judge, count(*) AS n FROM vab_trials GROUP BY judge ORDER BY judge", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"judge": "right", "n": 6}, {"judge": "slot1", "n": 6}], r.output
    r = _invoke("sql", "SELECT task_id, n_images FROM vab_tasks ORDER BY task_id", "--format", "json")
    assert json.loads(r.stdout) == [{"task_id": "a1", "n_images": 2}, {"task_id": "p1", "n_images": 3}], r.output
    # bad input: one line naming it, exit 1
    r = _invoke("vab", "leaderboard", "--sets", "nope")
    assert r.exit_code == 1 and "set collection 'nope' not found" in r.output
    r = _invoke("vab", "import-answers", str(_csv(tmp_path / "bad.csv", ["zz,0,1 2,1,"])), "--sets", "mine", "--judge", "j")
    assert r.exit_code == 1 and "line 2, task 'zz': not a task of set collection 'mine'" in r.output


def test_vab_leaderboard_is_light(home, tmp_path):
    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert _invoke("vab", "import-sets", str(_manifest(src, GOOD)), "--name", "mine").exit_code == 0
    assert _invoke("vab", "import-answers", str(_csv(tmp_path / "a.csv", ["p1,0,1 2 3,2,3"])), "--sets", "mine", "--judge", "j").exit_code == 0
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli import app\n"
        "r = CliRunner().invoke(app, ['vab', 'leaderboard', '--sets', 'mine', '--format', 'json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print([m for m in ('torch', 'prefect', 'great_expectations', 'transformers') if m in sys.modules])\n"
    )
    env = {"IMAGEBENCH_HOME": str(home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
