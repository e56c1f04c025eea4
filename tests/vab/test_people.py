"""The VAB people math (tasks/vab/people.py) on cases computed by hand."""

from __future__ import annotations

import pytest

from tasks.panel.store import PanelError
from tasks.vab.panel import expert_queue, parse_score
from tasks.vab import people


def _rank(expert, task, best, worst=None):
    return {"expert": expert, "task_id": task, "best": best, "worst": worst}


def test_consensus_tie_rule():
    # best votes 1:2, 2:2 -> tie; image 2 has one worst vote, image 1 none -> best = 1. worst: 4 has 2 votes.
    c = people.consensus_of("t", 4, [(1, 4), (2, 4), (1, 2), (2, 3)])
    assert (c.best, c.worst, c.best_votes, c.worst_votes) == (1, 4, (2, 2, 0, 0), (0, 1, 1, 2))
    # still tied after the worst votes: no consensus, never a guess
    c = people.consensus_of("t", 4, [(1, 4), (2, 4), (1, 3), (2, 3)])
    assert (c.best, c.worst) == (None, None)  # worst 3:2, 4:2, both 0 best votes -> tied too
    assert people.consensus_of("t", 2, [(1, None), (2, None)]).best is None
    assert people.consensus_of("t", 2, [(1, None), (2, None), (2, None)]).best == 2


def test_agreement_fleiss_and_krippendorff_by_hand():
    rows = [_rank("e1", "t1", 1), _rank("e1", "t2", 2), _rank("e1", "t3", 3),
            _rank("e2", "t1", 1), _rank("e2", "t2", 2), _rank("e2", "t3", 1)]
    a = people.agreement(rows, "best")
    # Fleiss: P-bar = 2/3, Pe = (1/2)^2 + (1/3)^2 + (1/6)^2 = 7/18 -> kappa = 5/11.
    assert a["fleiss_kappa"] == pytest.approx(5 / 11)
    # Krippendorff (nominal): Do = 2/6, De = 22/30 -> alpha = 6/11.
    assert a["krippendorff_alpha"] == pytest.approx(6 / 11)
    assert (a["experts"], a["tasks"], a["fleiss_tasks"]) == (2, 3, 3)
    # a missing answer: alpha still uses it, Fleiss only the complete tasks
    b = people.agreement(rows[:-1], "best")
    assert b["fleiss_tasks"] == 2 and b["krippendorff_alpha"] is not None


def test_leave_one_expert_out_by_hand():
    n = {"a": 3, "b": 2}
    rows = [_rank("e1", "a", 1, 3), _rank("e2", "a", 1, 3), _rank("e3", "a", 2, 3),
            _rank("e1", "b", 1), _rank("e2", "b", 1), _rank("e3", "b", 1)]
    got = people.leave_one_expert_out(rows, n)
    # e1, e2 on task a: the others tie on best (1 vs 2, no worst votes) -> excluded; worst 3 agreed.
    # e3 on task a: the others say 1 / 3 -> best wrong, worst right. Task b: all right.
    assert got["pooled"] == {"best": 75.0, "worst": 100.0, "both": 75.0, "tasks_best": 4, "tasks_worst": 3,
                             "tasks_both": 4, "excluded": 2}
    e3 = next(e for e in got["experts"] if e["expert"] == "e3")
    assert (e3["best"], e3["worst"], e3["both"]) == (50.0, 100.0, 50.0)


def test_scores_vs_ranking_by_hand():
    n = {"a": 3, "b": 3, "c": 3}
    rank = [_rank("e1", "a", 1, 3), _rank("e1", "b", 1, 3), _rank("e1", "c", 1, 3)]
    scores = [{"expert": "e1", "task_id": "a", "scores": [9, 5, 1]},     # tau 1, top-1 consistent
              {"expert": "e1", "task_id": "b", "scores": [5, 9, 1]},     # tau (2-1)/3, top-1 inconsistent
              {"expert": "e1", "task_id": "c", "scores": [5, 5, 5]}]     # tau undefined, tied top inconsistent
    got = people.scores_vs_ranking(rank, scores, n)
    assert got["pairs"] == 3 and got["tau_undefined"] == 1
    assert got["mean_tau"] == pytest.approx((1 + 1 / 3) / 2, abs=1e-6)
    assert got["top1_consistency"] == pytest.approx(100 / 3, abs=1e-3)
    assert people.score_labels([9, 9, 1]) == (None, 3)


def test_bad_answers_are_named():
    with pytest.raises(people.PeopleError, match="task 'a', expert 'e1': worst=1"):
        people.leave_one_expert_out([_rank("e1", "a", 1, 1)], {"a": 3})
    with pytest.raises(people.PeopleError, match="expert 'e1' answered task 'a' twice"):
        people.consensus_labels([_rank("e1", "a", 1, 3)] * 2, {"a": 3})
    with pytest.raises(people.PeopleError, match="needs 3 scores in 0..10"):
        people.scores_vs_ranking([], [{"expert": "e1", "task_id": "a", "scores": [11, 1, 2]}], {"a": 3})
    assert parse_score("7,5", 1) == 7.5 and parse_score("10", 1) == 10.0
    for bad in ("7.55", "-1", "x", "10.1"):
        with pytest.raises(PanelError, match="image 2"):
            parse_score(bad, 2)


def test_expert_queues_are_reproducible_and_differ():
    tasks = [("a", 3), ("b", 2), ("c", 6)]
    q1, q1b, q2 = expert_queue(7, "e1", tasks), expert_queue(7, "e1", tasks), expert_queue(7, "e2", tasks)
    assert q1 == q1b and q1 != q2
    assert [i["protocol"] for i in q1] == ["rank"] * 3 + ["score"] * 3
    assert all(sorted(i["shown_order"]) == list(range(1, dict(tasks)[i["task_id"]] + 1)) for i in q1)


def test_open_names_the_task_of_an_unreadable_image_and_keeps_nothing(tmp_path):
    import io

    from PIL import Image

    from schemas.vab import VabTask
    from tasks.vab.panel import open_store, open_vab_study
    from tests.panel.conftest import make_settings

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "PNG")
    tasks = [VabTask(task_id="ok-1", domain="photography", images=["a", "b"], best=1),
             VabTask(task_id="broken-2", domain="fine_art", images=["c", "d", "e"], best=1, worst=2)]
    settings = make_settings(tmp_path)
    read = lambda t, i: b"not an image" if (t.task_id, i) == ("broken-2", 1) else buf.getvalue()  # noqa: E731
    with pytest.raises(PanelError, match=r"task 'broken-2': image 2 \(d\) cannot be shown"):
        open_vab_study(settings, "s1", "sets", tasks, ["x1"], read_image=read)
    store = open_store(settings, "s1")
    assert not store.exists() and not list((tmp_path / "vab_studies" / "s1" / "images").iterdir())
    store.dispose()
    with pytest.raises(PanelError, match="task id used twice: ok-1"):
        open_vab_study(settings, "s1", "sets", [tasks[0], tasks[0]], ["x1"], read_image=read)
    with pytest.raises(PanelError, match="expert labels"):
        open_vab_study(settings, "s1", "sets", tasks[:1], ["x1", "x1"], read_image=read)
    assert open_vab_study(settings, "s1", "sets", tasks[:1], ["x1"], read_image=read).tokens.keys() == {"x1"}
