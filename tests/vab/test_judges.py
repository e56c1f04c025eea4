"""Judges under test, as plain functions: the BEST/WORST parser, argmax/argmin with ties counted as
failures, the answer cache keyed by judge identity, the demo sets' known order, judge names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.vab.judges import AnswerCache, ScalarSetJudge, SharpnessScorer, TrialAnswer, TrialItem, judge_with_cache, parse_best_worst, rank_scores


@pytest.mark.parametrize("text,n,want", [
    ("Image 2 has the best light.\nBEST: 2\nWORST: 3", 3, (2, 3, None)),
    ("**WORST: 1**\n**BEST:** 4", 4, (4, 1, None)),  # either order, markdown stripped
    ("BEST: Image 2\n\n", 2, (2, None, None)),
    ("BEST: 1", 2, (1, None, None)),
])
def test_parse_best_worst_reads_the_final_lines(text, n, want) -> None:
    assert parse_best_worst(text, n) == want


@pytest.mark.parametrize("text,n,why", [
    ("", 3, "empty answer"),
    ("I like the second.", 3, "is not 'BEST: <n>'"),
    ("BEST: 2", 3, "missing WORST line"),
    ("BEST: 2\nWORST: 2", 3, "the same image"),
    ("BEST: 5\nWORST: 1", 3, "out of range 1..3"),
    ("BEST: 1\nBEST: 2", 3, "two BEST lines"),
    ("BEST: 2\nso that is my answer", 2, "is not 'BEST: <n>'"),  # only the final line counts
])
def test_parse_best_worst_refuses_anything_else(text, n, why) -> None:
    best, worst, reason = parse_best_worst(text, n)
    assert best is None and worst is None and why in reason


def test_argmax_argmin_with_ties_counted_as_failures() -> None:
    def t(a):
        return a.best_shown, a.worst_shown, a.state

    assert t(rank_scores([0.1, 0.9, 0.5], want_worst=True)) == (2, 1, "ok")
    assert t(rank_scores([0.1, 0.9], want_worst=False)) == (2, None, "ok")
    tie = rank_scores([0.9, 0.9, 0.5], want_worst=True)
    assert (tie.best_shown, tie.state) == (None, "tie") and "tie for best at positions [1, 2]" in tie.detail
    low = rank_scores([0.2, 0.9, 0.2], want_worst=True)
    assert low.state == "tie" and "tie for worst at positions [1, 3]" in low.detail
    assert rank_scores([0.2, 0.9, 0.2], want_worst=False).state == "ok"  # a 2-image question has no worst


class _Counting:
    kind, name = "scalar", "counting"

    def __init__(self, ident: str) -> None:
        self.ident, self.calls = ident, 0

    def identity(self) -> str:
        return self.ident

    def judge(self, items):
        self.calls += len(items)
        return [TrialAnswer(1, 2, "ok") if it.trial < 2 else TrialAnswer(None, None, "error", "boom") for it in items]


def test_cache_by_judge_identity_keeps_settled_answers_only(tmp_path: Path) -> None:
    items = [TrialItem("t1", k, (1, 2, 3), ("a", "b", "c"), (f"s{k}1", f"s{k}2", f"s{k}3")) for k in range(3)]
    cache = AnswerCache(tmp_path)
    j = _Counting('{"judge":"x"}')
    answers, hits = judge_with_cache(j, items, cache)
    assert (hits, j.calls, [a.state for a in answers]) == (0, 3, ["ok", "ok", "error"])
    answers, hits = judge_with_cache(j, items, cache)
    assert (hits, j.calls) == (2, 4)  # the error is asked again, the settled answers are not
    other = _Counting('{"judge":"x","model":"v2"}')  # another identity: nothing reused
    assert judge_with_cache(other, items, cache)[1] == 0 and other.calls == 3


def test_sharpness_recovers_the_graded_demo_sets(tmp_path: Path) -> None:
    from tasks.vab.demo_sets import write_demo_sets

    manifest = write_demo_sets(tmp_path)
    judge = ScalarSetJudge(SharpnessScorer())
    tasks = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(tasks) == 6 and sorted({len(t["images"]) for t in tasks}) == [2, 3, 4, 5]
    assert len({t["best"] for t in tasks}) > 1  # the best is not always in the same stored slot
    items = [TrialItem(t["task_id"], 0, tuple(range(1, len(t["images"]) + 1)), tuple(str(tmp_path / p) for p in t["images"]),
                       ("",) * len(t["images"])) for t in tasks]
    got = [(a.best_shown, a.worst_shown, a.state) for a in judge.judge(items)]
    assert got == [(t["best"], t["worst"], "ok") for t in tasks]
    assert write_demo_sets(tmp_path).read_bytes() == manifest.read_bytes()  # deterministic


def test_unknown_judge_name_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    from schemas.settings import load_settings
    from tasks.vab.run import resolve_judges

    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("IMAGEBENCH_JUDGES_CONFIG", raising=False)
    monkeypatch.delenv("IMAGEBENCH_CONFIG", raising=False)
    with pytest.raises(ValueError, match=r"unknown judge 'gpt-9'; known: \['hpsv3', 'sharpness'\]"):
        resolve_judges(load_settings(), ["sharpness", "gpt-9"])
    assert [s.name for s in resolve_judges(load_settings(), ["sharpness", "sharpness"])] == ["sharpness"]


def test_an_endpoint_judge_whose_name_the_vab_tables_refuse_fails_before_any_work(tmp_path: Path, monkeypatch) -> None:
    """The endpoints config allows ``a..b``; VAB's one name rule does not: `vab run` says so before
    judging anything (it used to judge every trial and fail at the write)."""
    import yaml

    from schemas.settings import load_settings
    from tasks.vab.run import resolve_judges

    cfg = tmp_path / "judges.yaml"
    cfg.write_text(yaml.safe_dump({"judges": {name: {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
                                              for name in ("a..b", "fine")}}))
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
    monkeypatch.delenv("IMAGEBENCH_CONFIG", raising=False)
    assert [s.name for s in resolve_judges(load_settings(), ["fine"])] == ["fine"]
    with pytest.raises(ValueError, match=r"judge name 'a\.\.b' is not allowed: .*no '\.\.'"):
        resolve_judges(load_settings(), ["fine", "a..b"])


@pytest.mark.slow
def test_local_transformers_vlm_sees_every_image_of_the_trial_in_one_turn(tmp_path: Path, monkeypatch) -> None:
    """A tiny random Qwen2-VL: one generate() per trial with one image grid per shown image; its
    gibberish ends unparsable (asked twice), never a pick."""
    torch = pytest.importorskip("torch")
    import hashlib

    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from schemas.judges import Endpoint
    from tasks.hpsv3.tiny import write_tiny_base_model
    from tasks.judges import transformers_backend as tb
    from tasks.vab.demo_sets import write_demo_sets
    from tasks.vab.judges import VlmSetJudge

    out = write_tiny_base_model(tmp_path / "tiny-qwen2vl")
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(Qwen2VLConfig.from_pretrained(str(out))).save_pretrained(str(out))
    tb.load_local_vlm.cache_clear()
    task = json.loads(write_demo_sets(tmp_path / "sets").read_text().splitlines()[1])  # 3 images
    paths = tuple(str(tmp_path / "sets" / p) for p in task["images"])
    item = TrialItem(task["task_id"], 0, (1, 2, 3), paths, tuple(hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths))
    judge = VlmSetJudge("local", Endpoint(backend="transformers", model=str(out), max_tokens=16, timeout_s=120))
    grids = []
    vlm = judge.backend._vlm()
    real = vlm.model.generate
    monkeypatch.setattr(vlm.model, "generate", lambda **kw: grids.append(kw["image_grid_thw"].shape[0]) or real(**kw))
    [answer] = judge.judge([item])
    assert grids == [3, 3]  # 1 + unparsable_retries generations, each with the three images
    assert answer.state == "unparsable" and answer.best_shown is None and "is not 'BEST: <n>'" in answer.detail
    bad = TrialItem(item.task_id, 0, (1, 2, 3), paths, ("0" * 64,) + item.image_sha256[1:])
    [err] = judge.judge([bad])  # an image that changed since import: nothing generated, state error
    assert err.state == "error" and "does not have the recorded sha256" in err.detail and grids == [3, 3]


def test_a_scalar_judge_refuses_an_image_changed_since_import(tmp_path: Path) -> None:
    import hashlib

    from tasks.vab.demo_sets import write_demo_sets

    task = json.loads(write_demo_sets(tmp_path).read_text().splitlines()[1])  # 3 images
    paths = tuple(str(tmp_path / p) for p in task["images"])
    shas = tuple(hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths)
    item = TrialItem(task["task_id"], 0, (1, 2, 3), paths, shas)
    judge = ScalarSetJudge(SharpnessScorer())
    assert judge.judge([item])[0].state == "ok"
    Path(paths[1]).write_bytes(Path(paths[0]).read_bytes())  # replaced after import
    [a] = judge.judge([item])
    assert (a.state, a.best_shown) == ("error", None) and "changed since import" in a.detail and paths[1] in a.detail


def test_a_judge_that_is_down_gets_no_more_requests_and_every_trial_says_why(tmp_path: Path) -> None:
    from PIL import Image

    from schemas.judges import Endpoint
    from tasks.vab.judges import VlmSetJudge
    from tests.fake_openai import FakeOpenAI

    for i, colour in enumerate(((1, 2, 3), (3, 2, 1))):
        Image.new("RGB", (8, 8), colour).save(tmp_path / f"{i}.png")
    items = [TrialItem(f"t{i}", 0, (1, 2), (str(tmp_path / "0.png"), str(tmp_path / "1.png")), ("", "")) for i in range(5)]
    with FakeOpenAI("m", api_key="the-right-key") as srv:  # we send none: HTTP 401, the judge is down
        judge = VlmSetJudge("locked", Endpoint(backend="openai", model="m", base_url=srv.base_url, concurrency=1, max_retries=3))
        answers = judge.judge(items)
        assert len(srv.requests) == 1  # the other four trials were not sent
    assert {a.state for a in answers} == {"error"} and all("authentication refused" in a.detail for a in answers)
