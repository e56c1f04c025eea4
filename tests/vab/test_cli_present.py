"""How `vab leaderboard` and `vab compare` show their numbers (issue 17 items 10 and 11): people,
who answer once, in their own one-trial column with the one-trial random judge; Wilson intervals
that are not [100, 100] at 100%; p-values never printed as 0; `--by` JSON at full precision.
A 32-task collection imported through the CLI, answers imported as a user would, and one expert's
answers written to the lake as the panel export writes them."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.vab import VAB_TRIALS
from tests.vab.test_sets import _csv, _manifest, _png

N2 = 30  # 2-image tasks (stored order: best first)
HUMAN = "expert-0123456789ab"


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def collection(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    src = tmp_path / "src"
    tasks = []
    for i in range(N2):
        a, b = _png(src / f"t{i}a.png", (8 * i, 40, 200 - 5 * i)), _png(src / f"t{i}b.png", (8 * i, 90, 60 + 3 * i))
        tasks.append({"task_id": f"t{i:02d}", "domain": "photography" if i % 2 else "fine_art", "images": [a, b], "best": 1})
    for i in range(2):  # two 3-image tasks: best 1, worst 3
        imgs = [_png(src / f"u{i}{k}.png", (20 + 70 * k, 30 * i, 99)) for k in range(3)]
        tasks.append({"task_id": f"u{i}", "domain": "illustration", "images": imgs, "best": 1, "worst": 3})
    r = _invoke("vab", "import-sets", str(_manifest(src, tasks)), "--name", "many")
    assert r.exit_code == 0, r.output
    return tmp_path, tasks


def _answers(tmp_path, judge, tasks, right) -> None:
    """3 trials per task, each in another order (rotations of the stored one: 3+ images must show 3
    different orders); ``right(task_id)`` says whether the judge is right."""
    rows = []
    for t in tasks:
        n = len(t["images"])
        ok = right(t["task_id"])
        best, worst = (1, n if n > 2 else None) if ok else (2, 1 if n > 2 else None)  # stored positions
        for k in range(3):
            order = [(i + k) % n + 1 for i in range(n)]
            shown_best = order.index(best) + 1
            shown_worst = "" if worst is None else order.index(worst) + 1
            rows.append(f"{t['task_id']},{k},{' '.join(map(str, order))},{shown_best},{shown_worst}")
    r = _invoke("vab", "import-answers", str(_csv(tmp_path / f"{judge}.csv", rows)), "--sets", "many", "--judge", judge)
    assert r.exit_code == 0, r.output


def _expert(tasks, right_ids) -> None:
    """One expert's answers as `vab panel export` writes them: judge_kind human, trial 0 only."""
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.vab.tables import replace_judge_trials

    now = datetime.now(timezone.utc)
    rows = []
    for t in tasks:
        n, ok = len(t["images"]), t["task_id"] in right_ids
        best, worst = (1, 3 if n > 2 else None) if ok else (2, 1 if n > 2 else None)
        rows.append({"sets": "many", "judge": HUMAN, "judge_kind": "human", "judge_identity": '{"study": "s"}',
                     "task_id": t["task_id"], "trial": 0, "order": list(range(1, n + 1)), "best_shown": best,
                     "worst_shown": worst, "best": best, "worst": worst, "state": "ok", "detail": None, "decided_at": now})
    replace_judge_trials(Lake(load_settings().lake_dir), "many", HUMAN, pa.Table.from_pylist(rows, schema=VAB_TRIALS))


def test_people_get_their_own_column_and_random_line(collection):
    tmp_path, tasks = collection
    _answers(tmp_path, "right", tasks, lambda tid: True)
    _answers(tmp_path, "third", tasks, lambda tid: tid < "t10")  # t00..t09: 10 of 32 right
    _expert(tasks, {t["task_id"] for t in tasks[:24]})  # 24 of 32 right in its one trial
    r = _invoke("vab", "leaderboard", "--sets", "many", "--format", "json")
    assert r.exit_code == 0, r.output
    board = {b["judge"]: b for b in json.loads(r.stdout)}
    assert [b["judge"] for b in json.loads(r.stdout)] == ["right", "third", HUMAN]  # people after machines
    e = board[HUMAN]
    assert e["trials_per_task"] == 1 and e["strict_both"] is None and e["strict_both_lo"] is None
    assert e["single_both"] == 75.0 and 0 < e["single_both_lo"] < 75.0 < e["single_both_hi"] < 100
    m = board["right"]
    assert m["trials_per_task"] == 3 and m["strict_both"] == 100.0 and m["single_both"] == 100.0
    # Wilson at 32 of 32 is honest at the edge; the bootstrap beside it is not
    assert 85.0 < m["strict_both_lo"] < 100.0 == m["strict_both_hi"] and m["strict_both_boot_lo"] == 100.0
    assert board["third"]["strict_both"] == 100 * 10 / 32  # full precision, not 31.2

    cmp = _invoke("vab", "compare", "right", HUMAN, "--sets", "many")
    assert cmp.exit_code == 0 and f"{HUMAN} answered each task once" in " ".join(cmp.output.split())
    assert "answered each task once" not in _invoke("vab", "compare", "right", "third", "--sets", "many").output
    table = _invoke("vab", "leaderboard", "--sets", "many")
    assert table.exit_code == 0, table.output
    line = next(x for x in table.output.splitlines() if HUMAN in x)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    assert cells[2] == "1" and cells[3] == "–" and cells[4].startswith("75.0 [")  # not in the strict column
    # random judge: 30 tasks of 2 images (3 trials 1/8, one trial 1/2), 2 of 3 (1/216, 1/6)
    strict = 100 * (30 / 8 + 2 / 216) / 32
    one = 100 * (30 / 2 + 2 / 6) / 32
    flat = " ".join(table.output.split())
    assert f"strict both (3 trials) {strict:.2f}%" in flat and f"one-trial both {one:.1f}%" in flat


def test_by_breakdowns_keep_full_precision_in_json(collection):
    tmp_path, tasks = collection
    _answers(tmp_path, "third", tasks, lambda tid: tid in {"t01", "t03", "t05", "t07"})  # 4 of the 15 photography tasks
    for by, key in (("domain", "photography"), ("size", 2)):
        r = _invoke("vab", "leaderboard", "--sets", "many", "--by", by, "--format", "json")
        assert r.exit_code == 0, r.output
        row = next(x for x in json.loads(r.stdout) if x[by] == key)
        want = 100 * 4 / (15 if by == "domain" else 30)
        assert row["strict_both"] == want and row["single_both"] == want and row["trials_per_task"] == 3
    r = _invoke("vab", "leaderboard", "--sets", "many", "--by", "domain")  # the table still rounds
    assert "26.7" in r.output and "26.67" not in r.output


def test_compare_never_prints_a_tiny_p_value_as_zero(collection):
    tmp_path, tasks = collection
    _answers(tmp_path, "right", tasks, lambda tid: True)
    _answers(tmp_path, "wrong", tasks, lambda tid: False)
    r = _invoke("vab", "compare", "right", "wrong", "--sets", "many", "--format", "json")
    assert r.exit_code == 0, r.output
    cmp = {x["metric"]: x for x in json.loads(r.stdout)}
    # McNemar exact: 32 discordant tasks all one way, p = 2 * 2^-32
    assert cmp["strict_both"]["only_a"] == 32 and cmp["strict_both"]["p_value"] == 2 * 0.5**32
    assert cmp["strict_worst"]["p_value"] == 0.5  # 2 tasks with a worst label
    r = _invoke("vab", "compare", "right", "wrong", "--sets", "many")
    line = next(x for x in r.output.splitlines() if "strict_both" in x)
    assert line.split("│")[-2].strip() == "4.7e-10"
