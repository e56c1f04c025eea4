"""eval.py result files imported as they are, and what is refused (issue 17 items 2, 4, 7, 8, 12):
partial files read as eval.py reads them, derived 2-image rows, repeated orders, best = worst,
the one judge-name rule, `vab judges remove`, a 0-based manifest, missing HPSv3 weights."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from schemas.settings import load_settings
from tests.vab.test_official import FIX, _invoke, home, write_release  # noqa: F401 (home: a fixture)

REPO = Path(__file__).resolve().parents[2]
RESULTS = json.loads((FIX / "results" / "judge-one.json").read_text())


@pytest.fixture
def rel(home, tmp_path):  # noqa: F811
    tasks = json.loads((FIX / "tasks.json").read_text())
    r = _invoke("vab", "import-sets", write_release(tmp_path / "release", tasks), "--name", "rel")
    assert r.exit_code == 0, r.output
    return load_settings()


def _trials(settings, judge=None):
    from tasks.lake.tables import Lake
    from tasks.vab.tables import read_partition

    rows = read_partition(Lake(settings.lake_dir), "vab_trials", "rel").to_pylist()
    return [r for r in rows if judge is None or r["judge"] == judge]


def _write_json(path: Path, results: list[dict], model="org/sub/judge-x") -> Path:
    path.write_text(json.dumps({"metadata": {**RESULTS["metadata"], "model": model}, "summary": {}, "results": results}))
    return path


def test_partial_file_read_as_eval_py_reads_it(rel, tmp_path) -> None:
    """A .partial.jsonl as eval.py appends it: an error later answered, a cut-off last line, no
    derived rows yet. Read: the answer replaces the error, the cut line is skipped and counted,
    the 2-image pick_best_and_worst rows are derived as eval.py derives them at the end."""
    rows = [r for r in RESULTS["results"] if "derived_from" not in r]
    first = next(r for r in rows if r["task_id"] == "vab-0001" and r["prompt_type"] == "pick_best" and r["trial"] == 0)
    err = {k: first[k] for k in ("task_id", "prompt_type", "trial", "permutation", "ground_truth", "domain", "substyle", "n_images")}
    lines = [json.dumps(dict(err, error="Timeout: read timed out"))] + [json.dumps(r) for r in rows] + ['{"task_id": "vab-00']
    part = tmp_path / "judge-p.partial.jsonl"
    part.write_text("\n".join(lines) + "\n")
    r = _invoke("vab", "import-results", part, "--sets", "rel")
    assert r.exit_code == 0, r.output
    assert "imported 80 answers of judge judge-p" in r.output and "8 derived" in r.output
    assert "1 unreadable line(s) skipped" in r.output
    mine = {(x["task_id"], x["prompt_type"], x["trial"]): x for x in _trials(rel, "judge-p")}
    assert mine[("vab-0001", "pick_best", 0)]["state"] == "ok"  # the later answer won over the error
    d = mine[("vab-0002", "pick_best_and_worst", 2)]  # 2 images, labels AB, best B: derived best B, worst A
    assert (d["best"], d["worst"], d["state"], d["detail"]) == (2, 1, "ok", "derived from pick_best")
    assert ("vab-0002", "pick_best_and_worst", 1) not in mine  # its pick_best was unparsable: nothing derived
    # the same answers as the finished .json: the same official numbers
    assert _invoke("vab", "import-results", FIX / "results" / "judge-one.json", "--sets", "rel").exit_code == 0
    r = json.loads(_invoke("vab", "summarize", "--sets", "rel", "--format", "json").stdout)
    assert r["judge-p"] == r["judge-one"]


def test_bad_result_rows_are_named_and_nothing_is_stored(rel, tmp_path) -> None:
    rows = [dict(r) for r in RESULTS["results"]]

    def find(task, pt, trial):
        return next(i for i, r in enumerate(rows) if (r["task_id"], r["prompt_type"], r["trial"]) == (task, pt, trial))

    i = find("vab-0005", "pick_best", 1)
    rows[i] = dict(rows[i], permutation=list(rows[find("vab-0005", "pick_best", 0)]["permutation"]))
    i = find("vab-0006", "pick_worst", 2)
    rows[i] = dict(rows[i], ground_truth={"worst": "A"})
    i = find("vab-0007", "pick_best", 0)
    rows[i] = dict(rows[i], correct=False)
    rows.append(dict(rows[0], task_id="vab-9999"))
    r = _invoke("vab", "import-results", _write_json(tmp_path / "bad.json", rows), "--sets", "rel")
    assert r.exit_code == 1, r.output
    for part in ("task 'vab-0006', pick_worst trial 2: ground_truth {'worst': 'A'} differs from the set collection's labels",
                 "task 'vab-0007', pick_best trial 0: correct=False, but the answer {'best': 'F'} against the labels is True",
                 "task 'vab-9999', pick_best trial 0: not a task of set collection 'rel'",
                 "task 'vab-0005', pick_best: the 3 trials must show 3 different orders"):
        assert part in r.output, (part, r.output)
    assert "4 bad row(s), nothing imported" in r.output
    assert _trials(rel) == []
    # the judge name: metadata.model after its last '/', or --judge under the one rule
    good = _write_json(tmp_path / "good.json", RESULTS["results"])
    r = _invoke("vab", "import-results", good, "--sets", "rel", "--judge", "a/../../evil")
    assert r.exit_code == 1 and "judge name 'a/../../evil' is not allowed" in r.output and "no '/', no '..'" in r.output
    r = _invoke("vab", "import-results", good, "--sets", "rel", "--judge", "x..y")
    assert r.exit_code == 1 and "is not allowed" in r.output
    r = _invoke("vab", "import-results", good, "--sets", "rel")
    assert r.exit_code == 0 and "judge judge-x" in r.output


def test_an_answer_naming_one_image_best_and_worst_imports_as_eval_py_scored_it(rel, tmp_path) -> None:
    """eval.py reads "BEST: A / WORST: A" and scores it (right on best, wrong on worst): its file
    imports as it is (issue 25 item 3), the answer kept whole, the numbers as summarize.py's rule."""
    rows = [dict(r) for r in RESULTS["results"]]
    for r in rows:  # vab-0004: labels ABC, best A, worst B; its pick_best_and_worst trials all right before
        if r["task_id"] == "vab-0004" and r["prompt_type"] == "pick_best_and_worst" and r["trial"] == 1:
            r.update(parsed_answer={"best": "A", "worst": "A"}, correct=False, model_response="Both A.\nBEST: A\nWORST: A")
    r = _invoke("vab", "import-results", _write_json(tmp_path / "judge-x.json", rows), "--sets", "rel")
    assert r.exit_code == 0, r.output
    assert _invoke("vab", "import-results", FIX / "results" / "judge-one.json", "--sets", "rel").exit_code == 0
    row = next(x for x in _trials(rel, "judge-x") if (x["task_id"], x["prompt_type"], x["trial"]) == ("vab-0004", "pick_best_and_worst", 1))
    assert (row["state"], row["best"], row["worst"], row["response"]) == ("ok", 1, 1, "Both A.\nBEST: A\nWORST: A")
    s = json.loads(_invoke("vab", "summarize", "--sets", "rel", "--format", "json").stdout)
    one, x = s["judge-one"]["pick_best_and_worst"], s["judge-x"]["pick_best_and_worst"]
    assert x["accuracy_best"] == one["accuracy_best"]  # still right on best in all three trials
    assert x["accuracy_worst"] == pytest.approx(one["accuracy_worst"] - 1 / 9) and x["accuracy_both"] == pytest.approx(one["accuracy_both"] - 1 / 9)
    # a person's CSV answer naming one image twice stays refused (test_csv_answers_best_equal_worst_...)


def test_a_partial_file_imports_whatever_its_name(rel, tmp_path) -> None:
    """eval.py's partial file is told by its content, not its name (issue 25 item 5): renamed, it
    reads as `<model>.partial.jsonl` does (derived rows included); the judge is named after the file."""
    rows = [r for r in RESULTS["results"] if "derived_from" not in r]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "judge-p.partial.jsonl").write_text(text)
    for name in ("judge-p.partial.jsonl", "run-7.jsonl", "judge-q.partial.jsonl.bak", "copy"):
        (tmp_path / name).write_text(text)
        r = _invoke("vab", "import-results", tmp_path / name, "--sets", "rel")
        assert r.exit_code == 0 and "80 answers" in r.output and "8 derived" in r.output, (name, r.output)
    s = json.loads(_invoke("vab", "summarize", "--sets", "rel", "--format", "json").stdout)
    assert list(s) == ["Random Guess", "copy", "judge-p", "judge-q", "run-7"]
    assert s["judge-p"] == s["run-7"] == s["judge-q"] == s["copy"]
    single = tmp_path / "one-line.json"  # a partial file of one row is JSON too: still a partial file
    single.write_text(json.dumps(rows[0]) + "\n")
    r = _invoke("vab", "import-results", single, "--sets", "rel")
    assert r.exit_code == 0 and "1 answers of judge one-line" in r.output, r.output
    junk = tmp_path / "notes.txt"
    junk.write_text("these are\nnot results\n")
    r = _invoke("vab", "import-results", junk, "--sets", "rel")
    assert r.exit_code == 1 and "neither eval.py's result file" in r.output, r.output


def test_judges_remove_even_a_name_from_before_the_rule(rel, tmp_path) -> None:
    from schemas.vab import VAB_TRIALS
    from tasks.lake.tables import Lake
    from tasks.vab.tables import write_partition

    assert _invoke("vab", "import-results", FIX / "results" / "judge-two.json", "--sets", "rel").exit_code == 0
    # a row written before the name rule existed (write_partition does not check names)
    old = pa.Table.from_pylist(_trials(rel) + [{"sets": "rel", "judge": "a/../../evil", "judge_kind": "import", "task_id": "vab-0001",
                                                "trial": 0, "order": [1, 2], "best": 1, "best_shown": 1, "state": "ok",
                                                "decided_at": datetime.now(timezone.utc)}], schema=VAB_TRIALS)
    write_partition(Lake(rel.lake_dir), "vab_trials", "rel", old)
    r = _invoke("vab", "judges", "remove", "a/../../evil", "--sets", "rel")
    assert r.exit_code == 0 and "removed judge 'a/../../evil' from rel: 1 answer(s)" in r.output, r.output
    assert {x["judge"] for x in _trials(rel)} == {"judge-two"}
    r = _invoke("vab", "judges", "remove", "nobody", "--sets", "rel")
    assert r.exit_code == 1 and "judge 'nobody' has no answers in set collection 'rel'; judges: ['judge-two']" in r.output
    assert _invoke("vab", "judges", "remove", "judge-two", "--sets", "rel").exit_code == 0 and _trials(rel) == []


def test_csv_answers_best_equal_worst_and_repeated_orders_refused(home, tmp_path) -> None:  # noqa: F811
    from tests.vab.test_sets import GOOD, _csv, _manifest, _png

    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert _invoke("vab", "import-sets", _manifest(src, GOOD), "--name", "mine").exit_code == 0
    rows = ["p1,0,1 2 3,2,2", "p1,1,1 2 3,1,3", "p1,2,3 1 2,3,1"]
    r = _invoke("vab", "import-answers", _csv(tmp_path / "a.csv", rows), "--sets", "mine", "--judge", "j")
    assert r.exit_code == 1
    assert "line 2, task 'p1': best and worst name the same image (2): not an answer" in r.output
    assert "task 'p1': the 3 trials must show 3 different orders, got 1 2 3, 1 2 3, 3 1 2" in r.output
    r = _invoke("vab", "import-answers", _csv(tmp_path / "b.csv", ["a1,0,1 2,1,", "a1,1,1 2,1,", "a1,2,2 1,2,"]),
                "--sets", "mine", "--judge", "j")
    assert r.exit_code == 0, r.output  # 2 images have only 2 orders: repeats allowed, as in eval.py


def test_zero_based_manifest_refused_even_with_skip_bad(home, tmp_path) -> None:  # noqa: F811
    from tests.vab.test_sets import _manifest, _png

    src = tmp_path / "src"
    for i in range(1, 8):
        _png(src / f"img{i}.png", (30 * i, 255 - 30 * i, 7 * i))
    zero = [{"task_id": "z1", "domain": "photography", "images": ["img1.png", "img2.png", "img3.png"], "best": 0, "worst": 2},
            {"task_id": "z2", "domain": "photography", "images": ["img4.png", "img5.png", "img6.png"], "best": 1, "worst": 0},
            {"task_id": "z3", "domain": "fine_art", "images": ["img7.png", "img1.png"], "best": 1, "worst": None}]
    r = _invoke("vab", "import-sets", _manifest(src, zero), "--name", "z", "--skip-bad")
    assert r.exit_code == 1 and "look 0-based" in r.output.replace("\n", " ") and "nothing imported" in r.output
    assert not (home / "vab" / "sets" / "z").exists()
    one_based = [dict(t, best=t["best"] + 1, worst=None if t["worst"] is None else t["worst"] + 1) for t in zero]
    one_based[2]["worst"] = None
    assert _invoke("vab", "import-sets", _manifest(src, one_based, "ok.jsonl"), "--name", "z").exit_code == 0


def test_vab_run_without_hpsv3_weights_names_the_fix_before_anything_starts(home, tmp_path) -> None:  # noqa: F811
    from tests.vab.test_sets import GOOD, _manifest, _png

    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert _invoke("vab", "import-sets", _manifest(src, GOOD), "--name", "mine").exit_code == 0
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom flows.cli import app\n"
            "r = CliRunner().invoke(app, ['vab', 'run', '--sets', 'mine', '--judge', 'hpsv3'])\n"
            "print(r.exit_code)\nprint(r.output.strip())\n"
            "print([m for m in ('prefect', 'torch') if m in sys.modules])\n")
    env = {"IMAGEBENCH_HOME": str(home), "PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    code_line, *msg, loaded = out.stdout.strip().splitlines()
    assert code_line == "1", out.stdout + out.stderr
    assert len(msg) == 1, msg  # one line
    assert "HPSv3 checkpoint 'MizzenAI/HPSv3' not in the Hugging Face cache" in msg[0]
    assert "imagebench demo" in msg[0] and "IMAGEBENCH_HPSV3_CHECKPOINT" in msg[0]
    assert loaded == "[]"  # named before Prefect or torch were even imported


def test_pins_record_their_trial_scheme_and_the_cache_keeps_schemes_apart(home, tmp_path) -> None:  # noqa: F811
    from tasks.vab.judges import AnswerCache, TrialItem
    from tasks.vab.run import trial_items
    from tasks.vab.sets import image_paths, load_sets, trial_scheme
    from tests.vab.test_sets import GOOD, _manifest, _png

    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert _invoke("vab", "import-sets", _manifest(src, GOOD), "--name", "mine").exit_code == 0
    settings = load_settings()
    assert trial_scheme(settings, "mine") == "vab-official-v1"
    pin = home / "vab" / "sets" / "mine" / "pin.json"
    meta = json.loads(pin.read_text())
    del meta["trial_scheme"]  # a collection pinned before the scheme was recorded
    pin.write_text(json.dumps(meta))
    assert trial_scheme(settings, "mine") == "imagebench-sha256-v1"
    # re-importing the same content keeps the pin, hence its scheme
    assert "already pinned" in _invoke("vab", "import-sets", _manifest(src, GOOD), "--name", "mine").output
    assert trial_scheme(settings, "mine") == "imagebench-sha256-v1"
    tasks = load_sets(settings, "mine")
    paths = [image_paths(settings, t) for t in tasks]
    legacy = trial_items(tasks, paths, "imagebench-sha256-v1")
    official = trial_items(tasks, paths, "vab-official-v1", official=True)
    assert [it.order for it in legacy if it.task_id == "p1"] == [(1, 2, 3), (3, 2, 1), (3, 1, 2)]
    assert [(it.prompt_type, it.order) for it in official if it.task_id == "p1"][:3] == [
        ("pick_best", (1, 2, 3)), ("pick_best", (2, 1, 3)), ("pick_best", (3, 1, 2))]
    assert {it.prompt_type for it in official if it.task_id == "a1"} == {"pick_best", "pick_worst"}  # 2 images: no pbw asked
    item = legacy[0]
    same_order = [TrialItem(item.task_id, 0, item.order, item.image_paths, item.image_sha256, item.domain, pt, scheme)
                  for scheme in ("imagebench-sha256-v1", "vab-official-v1") for pt in ("best_worst", "pick_best")]
    keys = [AnswerCache.key("judge", it) for it in same_order]
    assert len(set(keys)) == 4
    # two trials shown in the same order (a 2-image task always has two) are two answers (issue 25
    # item 4), and so are two tasks with the same images
    again = [TrialItem(item.task_id, k, item.order, item.image_paths, item.image_sha256, item.domain) for k in range(3)]
    other = TrialItem("another", 0, item.order, item.image_paths, item.image_sha256, item.domain)
    assert len({AnswerCache.key("judge", it) for it in [*again, other]}) == 4


def test_import_results_and_summarize_stay_light(rel) -> None:
    """Read commands: no torch, Prefect, Great Expectations or transformers imported."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom flows.cli import app\n"
            f"r = CliRunner().invoke(app, ['vab', 'import-results', {str(FIX / 'results' / 'judge-two.json')!r}, '--sets', 'rel'])\n"
            "assert r.exit_code == 0, r.output\n"
            "r = CliRunner().invoke(app, ['vab', 'summarize', '--sets', 'rel', '--format', 'json'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print([m for m in ('torch', 'prefect', 'great_expectations', 'transformers') if m in sys.modules])\n")
    env = {"IMAGEBENCH_HOME": str(rel.home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_a_pick_best_only_partial_file_derives_nothing(rel, tmp_path) -> None:
    two = json.loads((FIX / "results" / "judge-two.json").read_text())["results"]  # a --prompt-type pick_best run
    part = tmp_path / "judge-q.partial.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in two))
    r = _invoke("vab", "import-results", part, "--sets", "rel")
    assert r.exit_code == 0 and "27 answers of judge judge-q (ok 27; 0 derived" in r.output, r.output
    assert _invoke("vab", "import-results", FIX / "results" / "judge-two.json", "--sets", "rel").exit_code == 0
    s = json.loads(_invoke("vab", "summarize", "--sets", "rel", "--format", "json").stdout)
    assert s["judge-q"] == s["judge-two"]
