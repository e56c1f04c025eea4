"""VAB as the authors' toolkit runs it (issue 17): the release's Parquet layout, eval.py's trial
orders and prompts, its result files, and summarize.py's numbers.

The reference is the toolkit's own output: tests/vab/fixtures/official/ was made by
make_fixture.py running the toolkit's eval.py/summarize.py functions (commit in toolkit.json) on
the fixture's result files; CI has no copy of the toolkit, so the fixture is committed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from flows.cli import app
from schemas.settings import load_settings
from tasks.vab.official import OfficialTrial, judge_scores, random_guess
from tasks.vab.prompts import message_parts, parse_official
from tasks.vab.trials import official_orders

FIX = Path(__file__).resolve().parent / "fixtures" / "official"
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _png(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (72, 64), color).save(buf, format="PNG")
    return buf.getvalue()


def release_table(tasks: list[dict]) -> pa.Table:
    """The release's layout exactly: the toolkit's columns, images as HF image structs."""
    cols = {k: [] for k in ("task_id", "domain", "substyle", "n_images", "images", "labels", "ground_truth_best", "ground_truth_worst")}
    for i, t in enumerate(tasks):
        for k in cols:
            if k != "images":
                cols[k].append(t[k])
        cols["images"].append([{"bytes": _png((20 * i + 7 * k, 250 - 20 * k, 30 * k + i)), "path": f"{t['task_id']}_{k}.png"}
                               for k in range(t["n_images"])])
    types = {"n_images": pa.int64(), "images": pa.list_(IMAGE), "labels": pa.list_(pa.string())}
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})


def write_release(folder: Path, tasks: list[dict], shards: int = 1) -> Path:
    """A folder as Hugging Face stores the dataset: data/test-0000i-of-0000n.parquet."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    step = -(-len(tasks) // shards)
    for s in range(shards):
        pq.write_table(release_table(tasks[s * step:(s + 1) * step]), folder / "data" / f"test-{s:05d}-of-{shards:05d}.parquet")
    return folder


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("IMAGEBENCH_HOME", str(h))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return h


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _close(a, b, path="", absent=lambda path: False) -> None:
    """Same keys (in the same order) and numbers within 1e-9; where ``absent(path)``, ours is None
    and summarize.py's 0 (a figure with no task behind it: absent, never 0; issue 25 item 6)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (path, list(a), list(b) if isinstance(b, dict) else b)
        for k in a:
            _close(a[k], b[k], f"{path}/{k}", absent)
    elif absent(path):
        assert a is None and b == 0, (path, a, b)
    else:
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-9, (path, a, b)


def judge_two_both(path: str) -> bool:
    """judge-two is a --prompt-type pick_best run: every pick_best_and_worst figure of it is absent."""
    return path.startswith("/judge-two/") and "pick_best_and_worst" in path


def absent_in_table(text: str, judge: str = "judge-two") -> str:
    """summarize.py's table with ``judge``'s tb1 cells (no pick_best_and_worst answer behind them)
    printed as absent, '-', where summarize.py prints 0.0%."""
    out, section = [], ""
    for line in text.splitlines(keepends=True):
        if line.startswith("  Overall") or line.startswith("  By "):
            section = line
        if line.startswith(f"   {judge} "):
            cells = line.rstrip("\n").split("|")
            tb1 = [3, 6] if section.startswith("  Overall") else range(1, len(cells)) if "(tb1)" in section else []
            for i in tb1:
                assert cells[i].strip() == "0.0%", (line, i)
                cells[i] = cells[i].replace("0.0%", "   -")
            line = "|".join(cells) + "\n"
        out.append(line)
    return "".join(out)


# ---- trials and prompts, against eval.py's own output --------------------------------------------
def test_trial_orders_are_eval_py_generate_permutations() -> None:
    golden = json.loads((FIX / "permutations.json").read_text())
    assert len(golden) == 509
    for key, perms in golden.items():
        task_id, n = key.rsplit("/", 1)
        assert official_orders(task_id, int(n)) == [[p + 1 for p in perm] for perm in perms], key
    # distinct for 3+ images; 2 images may repeat (eval.py keeps any shuffle then)
    assert all(len({tuple(p) for p in perms}) == 3 for key, perms in golden.items() if not key.endswith("/2"))
    assert any(len({tuple(p) for p in perms}) < 3 for key, perms in golden.items() if key.endswith("/2"))


def test_official_prompt_is_eval_py_build_messages() -> None:
    golden = json.loads((FIX / "messages.json").read_text())
    assert len(golden) == 14
    for key, parts in golden.items():
        pt, n = key.split("/")
        ours = message_parts("vab-official-v1", pt, int(n), "photography")
        assert [p if isinstance(p, str) else f"IMAGE {p}" for p in ours] == parts, key
    with pytest.raises(ValueError, match="no prompt type 'pick_best_and_worst' for 2 images"):
        message_parts("vab-official-v1", "pick_best_and_worst", 2, "photography")


@pytest.mark.parametrize("text,pt,n,want", [
    ("I think so.\nBEST: c", "pick_best", 3, (3, None, None)),  # letter case ignored
    ("BEST: B and then BEST: A", "pick_best", 2, (2, None, None)),  # the first match counts
    ("**WORST: A**", "pick_worst", 4, (None, 1, None)),
    ("WORST: D\nBEST: A", "pick_best_and_worst", 4, (1, 4, None)),
    ("BEST: B\nWORST: B", "pick_best_and_worst", 3, (2, 2, None)),  # one image best and worst: read, as eval.py (issue 25 item 3)
])
def test_official_parser_reads_like_eval_py(text, pt, n, want) -> None:
    assert parse_official(text, pt, n) == want


@pytest.mark.parametrize("text,pt,n,why", [
    ("BEST: E", "pick_best", 4, "no 'BEST: X' with X one of A, B, C, D"),
    ("BEST: A", "pick_best_and_worst", 3, "no 'WORST: X'"),
    ("BEST:AB", "pick_best", 3, "no 'BEST: X'"),
])
def test_official_parser_refuses(text, pt, n, why) -> None:
    best, worst, reason = parse_official(text, pt, n)
    assert (best, worst) == (None, None) and why in reason


# ---- the math, on hand-computed cases -------------------------------------------------------------
def _t(task, pt, trial, *, error=False, best=None, worst=None, domain="photograph", n=3):
    parsed = not error and (best is not None or worst is not None)
    correct = parsed and best is not False and worst is not False
    return OfficialTrial(task, pt, trial, error, parsed, bool(correct), best, worst, domain, n)


def test_official_scores_by_hand() -> None:
    """Two 3-image photograph tasks and one 2-image fine-art task:
    pick_best  T1: right x3 -> p^3 right; T2: right, unparsable, right -> wrong; T3: all errors -> left out.
    pick_worst T1: right, error, right -> counted, wrong (2 non-error trials); T2: right x3; T3 (2 images): right x3.
    pbw T1: (b,w) right, unparsable, right -> 2 parsed of 3: not right; T2: best right x3, worst wrong in trial 1;
        T3 (derived, 2 images): trial 0 and 2 right, trial 1 absent (its pick_best was unparsable in eval.py)."""
    pb, pw, bw = "pick_best", "pick_worst", "pick_best_and_worst"
    trials = [
        _t("T1", pb, 0, best=True), _t("T1", pb, 1, best=True), _t("T1", pb, 2, best=True),
        _t("T2", pb, 0, best=True), _t("T2", pb, 1), _t("T2", pb, 2, best=True),
        *(_t("T3", pb, k, error=True, domain="fine-art", n=2) for k in range(3)),
        _t("T1", pw, 0, worst=True), _t("T1", pw, 1, error=True), _t("T1", pw, 2, worst=True),
        *(_t("T2", pw, k, worst=True) for k in range(3)),
        *(_t("T3", pw, k, worst=True, domain="fine-art", n=2) for k in range(3)),
        _t("T1", bw, 0, best=True, worst=True), _t("T1", bw, 1), _t("T1", bw, 2, best=True, worst=True),
        _t("T2", bw, 0, best=True, worst=True), _t("T2", bw, 1, best=True, worst=False), _t("T2", bw, 2, best=True, worst=True),
        _t("T3", bw, 0, best=True, worst=True, domain="fine-art", n=2), _t("T3", bw, 2, best=True, worst=True, domain="fine-art", n=2),
    ]
    s = judge_scores(trials)
    assert s["pick_best"] == {"accuracy": 0.5}  # T1 of {T1, T2}
    assert s["pick_worst"] == {"accuracy": 2 / 3}  # T2, T3 of 3
    assert s["pick_best_and_worst"] == {"accuracy_best": 1 / 3, "accuracy_worst": 0, "accuracy_both": 0}  # T2 best only
    # fine-art's pick_best: its one task (T3) all errors, none counted: absent (summarize.py: 0)
    assert s["by_domain"]["fine-art"] == {"pick_best": None, "pick_best_and_worst_both": 0, "pick_worst": 1.0}
    assert s["by_domain"]["illustration"] == {"pick_best": None, "pick_best_and_worst_both": None, "pick_worst": None}
    assert s["by_n_images"]["3"] == {"pick_best": 0.5, "pick_best_and_worst_both": 0, "pick_worst": 0.5}
    # ap@1: pick_best per trial 2/2, 1/2, 2/2; pick_worst 3/3, 2/2, 3/3; pbw both (parsed only) 3/3, 0/1, 3/3
    assert s["avg_pass_at_1"] == {"pick_best": pytest.approx((1 + 0.5 + 1) / 3), "pick_best_and_worst_both": pytest.approx(2 / 3),
                                  "pick_worst": 1.0}
    assert s["avg_pass_at_1_by_n_images"]["2"] == {"pick_best": None, "pick_best_and_worst_both": 1.0, "pick_worst": 1.0}
    # a pick_best-only judge: no pick_worst keys at all, pick_best_and_worst absent (summarize.py: all 0)
    only = judge_scores([_t("T1", pb, k, best=k != 1) for k in range(3)])
    assert "pick_worst" not in only and "pick_worst" not in only["by_domain"]["photograph"]
    assert only["pick_best_and_worst"] == {"accuracy_best": None, "accuracy_worst": None, "accuracy_both": None}
    assert only["avg_pass_at_1"] == {"pick_best": pytest.approx(2 / 3), "pick_best_and_worst_both": None}


def test_random_guess_by_hand() -> None:
    r = random_guess([("photograph", 2), ("photograph", 3), ("fine-art", 4)])
    assert r["pick_best"]["accuracy"] == pytest.approx((1 / 8 + 1 / 27 + 1 / 64) / 3)
    assert r["pick_best_and_worst"] == {"accuracy_both": pytest.approx((1 / 8 + 1 / 216 + 1 / 1728) / 3)}
    assert r["avg_pass_at_1"]["pick_best_and_worst_both"] == pytest.approx((1 / 2 + 1 / 6 + 1 / 12) / 3)
    assert list(r["by_domain"]) == ["fine-art", "photograph"]  # only domains with tasks, summarize.py's order
    assert r["by_n_images"]["3"] == {"pick_best": pytest.approx(1 / 27), "pick_worst": pytest.approx(1 / 27),
                                     "pick_best_and_worst_both": pytest.approx(1 / 216)}


# ---- end to end: the release, eval.py's files, summarize.py's numbers ----------------------------
def test_release_results_and_summary_equal_the_official(home, tmp_path) -> None:
    tasks = json.loads((FIX / "tasks.json").read_text())
    rel = write_release(tmp_path / "Visual-Aesthetic-Benchmark", tasks, shards=2)
    r = _invoke("vab", "import-sets", rel, "--name", "rel")
    assert r.exit_code == 0 and "9 tasks pinned" in r.output, r.output
    for f in ("judge-one.json", "judge-two.json"):
        r = _invoke("vab", "import-results", FIX / "results" / f, "--sets", "rel")
        assert r.exit_code == 0 and f"judge {f[:-5]}" in r.output, r.output
    r = _invoke("vab", "import-results", FIX / "results" / "judge-one.json", "--sets", "rel")  # again: replaces, same rows
    assert "80 answers of judge judge-one (error 4, ok 73, unparsable 3; 8 derived" in r.output, r.output
    r = _invoke("vab", "summarize", "--sets", "rel", "--format", "json")
    assert r.exit_code == 0, r.output
    _close(json.loads(r.stdout), json.loads((FIX / "summary.json").read_text()), absent=judge_two_both)
    r = _invoke("vab", "summarize", "--sets", "rel")
    assert r.exit_code == 0 and r.stdout == absent_in_table((FIX / "summary.txt").read_text())
    # our stricter leaderboard beside it: an error is a wrong trial, no task leaves the total
    board = {b["judge"]: b for b in json.loads(_invoke("vab", "leaderboard", "--sets", "rel", "--format", "json").stdout)}
    one = board["judge-one"]
    assert one["strict_best"] == pytest.approx(100 * 5 / 9)  # official 5/8 = 62.5%: vab-0008 errored, left out there
    assert one["invalid_trials"] == 4 + 3 and one["tasks"] == 9  # 4 errors + 3 unparsable
    assert board["judge-two"]["strict_both"] is None  # never asked pick_best_and_worst: absent, not 0


def test_summarize_orders_judges_as_summarize_py_orders_result_files(home, tmp_path) -> None:
    """summarize.py puts "Random Guess" first, then reads ``sorted(results_dir.glob("*.json"))``:
    judges in the order of their file names ``<model>.json``, not of their names. "gpt-4o-mini.json"
    sorts before "gpt-4o.json" ('-' before '.'), which sorts before "gpt-4o2.json" ('.' before '2');
    by name alone gpt-4o would come first."""
    tasks = json.loads((FIX / "tasks.json").read_text())
    assert _invoke("vab", "import-sets", write_release(tmp_path / "rel", tasks), "--name", "rel").exit_code == 0
    for name, f in (("gpt-4o", "judge-one.json"), ("gpt-4o2", "judge-two.json"), ("gpt-4o-mini", "judge-two.json")):
        r = _invoke("vab", "import-results", FIX / "results" / f, "--sets", "rel", "--judge", name)
        assert r.exit_code == 0, r.output
    official_order = ["Random Guess", "gpt-4o-mini", "gpt-4o", "gpt-4o2"]
    r = _invoke("vab", "summarize", "--sets", "rel", "--format", "json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert list(got) == official_order
    want = json.loads((FIX / "summary.json").read_text())
    _close(got["gpt-4o"], want["judge-one"])
    _close(got["gpt-4o-mini"], want["judge-two"], "/judge-two", absent=judge_two_both)
    r = _invoke("vab", "summarize", "--sets", "rel")
    assert r.exit_code == 0, r.output
    # every table (overall, 3 by domain, 3 by image count) lists the judges in that order
    models = [line.split("|")[0].strip() for line in r.stdout.splitlines()
              if line.startswith("   ") and "|" in line and not line.split("|")[0].strip() == "Model"]
    assert models == official_order * 7


def test_release_layout_checked_row_by_row(home, tmp_path) -> None:
    from tasks.vab.sets import BadSets, import_any, load_sets, trial_scheme

    settings = load_settings()
    good = json.loads((FIX / "tasks.json").read_text())[:3]
    bad = [dict(good[2], task_id="b1", ground_truth_worst="C"),  # best = worst
           dict(good[2], task_id="b2", domain="sculpture"),
           dict(good[2], task_id="b3", n_images=4),
           dict(good[0], task_id="b4", ground_truth_worst="A"),  # 2 images: worst must be the other one
           dict(good[2], task_id="b5", ground_truth_best="Z")]
    pq.write_table(release_table(good + bad), tmp_path / "test.parquet")
    with pytest.raises(BadSets) as info:
        import_any(settings, tmp_path / "test.parquet", "r")
    assert info.value.problems == {
        "'b1'": "ground_truth_best and ground_truth_worst are the same image (C)",
        "'b2'": "domain 'sculpture' is not one of fine-art, illustration, photograph",
        "'b3'": "n_images=4 but 4 image(s) and 3 label(s)",
        "'b4'": "ground_truth_worst 'A' of a 2-image task must be the other image",
        "'b5'": "ground_truth_best 'Z' is not one of the labels ['A', 'B', 'C']",
    }
    res = import_any(settings, tmp_path / "test.parquet", "r", skip_bad=True)
    loaded = {t.task_id: t for t in load_sets(settings, "r")}
    assert res.tasks == 3 and set(loaded) == {"vab-0001", "vab-0002", "vab-0003"}
    t3 = loaded["vab-0003"]  # illustration, labels ABC, best C, worst A
    assert (t3.domain, t3.labels, t3.best, t3.worst, t3.substyle) == ("illustration", ["A", "B", "C"], 3, 1, "ink")
    assert loaded["vab-0001"].domain == "photography" and loaded["vab-0002"].domain == "fine_art"
    assert loaded["vab-0002"].worst is None and trial_scheme(settings, "r") == "vab-official-v1"
    pq.write_table(release_table(good).drop(["labels"]), tmp_path / "old.parquet")
    with pytest.raises(ValueError, match=r"not the VAB release layout: no column\(s\) labels"):
        import_any(settings, tmp_path / "old.parquet", "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no data/test-\*.parquet in this folder"):
        import_any(settings, tmp_path / "empty", "x")


def test_our_prompt_and_the_expert_pages_use_each_domains_rubric() -> None:
    from tasks.vab.panel import _rubric
    from tasks.vab.prompts import prompt_sha256, question_for

    ill, art = question_for(3, "illustration"), question_for(3, "fine_art")
    assert "focus and clarity, form and proportion, colour design, detail control and finish, stylistic fit" in ill
    assert "completion" in art and "completion" not in ill and "the illustration domain" in ill
    assert "Form and proportion" in _rubric("illustration") and "Form and proportion" not in _rubric("fine_art")
    assert message_parts("vab-best-worst-v2", "best_worst", 2, "photography")[:2] == ["Image 1:", 0]
    assert prompt_sha256("vab-best-worst-v2") != prompt_sha256("vab-official-v1")


# ---- what is sent with the official prompt (tasks/vab/official_request.py; against eval.py itself:
# tests/vab/test_official_toolkit.py) ---------------------------------------------------------------
@pytest.mark.parametrize("model,t,want", [
    ("gpt-4o", 1.0, {"max_tokens": 8192, "temperature": 1.0}),
    ("gpt-4o", 0.0, {"max_tokens": 8192, "temperature": 0.0}),
    ("gpt-5", 0.0, {"max_completion_tokens": 8192}),  # litellm drops a gpt-5 temperature other than 1
    ("openai/gpt-5-mini", 1.0, {"max_completion_tokens": 8192, "temperature": 1.0}),
    ("gpt-5.2-pro", 0.5, {"max_completion_tokens": 8192}),
    ("gpt-5.2", 0.5, {"max_completion_tokens": 8192, "temperature": 0.5}),
    ("gpt-5-chat-latest", 0.0, {"max_tokens": 8192, "temperature": 0.0}),
    ("o4-mini", 0.7, {"max_completion_tokens": 8192}),
    ("o4-mini-custom", 0.7, {"max_tokens": 8192, "temperature": 0.7}),  # not in litellm's list: a chat model to it
])
def test_official_request_parameters(model, t, want) -> None:
    from tasks.vab.official_request import request_params

    assert request_params(model, t) == want


def test_official_http_retry_waits_as_the_openai_client() -> None:
    import random

    from tasks.vab.official_request import http_retryable, http_wait_s

    assert [http_retryable(s, {}) for s in (408, 409, 425, 429, 500, 503, 400, 401, 404)] == [True] * 2 + [False] + [True] * 3 + [False] * 3
    assert http_retryable(500, {"x-should-retry": "false"}) is False and http_retryable(400, {"x-should-retry": "true"}) is True
    assert http_wait_s(0, {"retry-after": "3"}) == 3.0 and http_wait_s(0, {"retry-after-ms": "1500"}) == 1.5
    rng = random.Random(0)
    for retry, base in ((0, 0.5), (1, 1.0), (5, 8.0)):  # no usable Retry-After (absent, 0, over 60 s): backoff, less up to 25%
        for headers in ({}, {"retry-after": "0"}, {"retry-after": "120"}):
            assert 0.75 * base <= http_wait_s(retry, headers, rng) <= base
