"""Issue 27 items 2 and 3: the bundle measures its own re-identification risk, refuses a judge who
is unique on what it publishes, and lets another lab redo the analysis, quality control included.

Item 2 runs on a SIMULATED study of the published panel's shape (20 judges in groups of 6, 4, 4,
3 and 3; tasks/beauty/simulate.py) whose judges took part as a lab's do: in shared sessions, a
few alone, three who stopped early. The figures of the datasheet and anonymity.json are checked
against an attack written here, independently of tasks/beauty/reident.py: every k-subset of every
judge's published answers enumerated, the candidates counted by bitmasks over all judges.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from itertools import combinations

import pyarrow.parquet as pq
import pytest
import yaml

from tests.beauty.panel_helpers import analyse, cli, open_and_answer, panel_clock, workspace

TOOLS = ("tool-alpha", "tool-beta", "tool-gamma")
DAY = datetime(2026, 1, 5, tzinfo=UTC)
# (group, session start hour on DAY, answers given (None: the whole queue of 30)); judges sharing
# a session answer side by side, so their first and last minutes are the same.
PANEL = [
    ("photographers", 9, None), ("photographers", 9, None), ("photographers", 11, None), ("photographers", 11, None),
    ("photographers", 11, 20),  # stopped early: alone with 20 answers
    ("photographers", 15, None),  # alone in the afternoon
    ("art-therapists", 10, None), ("art-therapists", 10, None), ("art-therapists", 14, None), ("art-therapists", 14, None),
    ("aphantasia", 9, None), ("aphantasia", 9, None),
    ("aphantasia", 13, 12),  # stopped early
    ("aphantasia", 16, None),  # alone
    ("tbi-survivors", 10, None), ("tbi-survivors", 10, None), ("tbi-survivors", 10, None),
    ("non-ai-artists", 12, None), ("non-ai-artists", 12, None), ("non-ai-artists", 12, 25),  # stopped early
]
UNIQUE_AS_PUBLISHED = 5  # the three who stopped early and the two alone in their session


def _simulated_study(settings, study_id: str) -> None:
    """The study, its SIMULATED answers re-timed to the sessions of PANEL, analysed."""
    from tasks.beauty.simulate import simulate_answers
    from tasks.beauty.sources import load_study_context, study_salt
    from tasks.beauty.study import study_dir
    from tasks.beauty.tables import write_study_partition
    from tasks.lake.tables import Lake

    d = study_dir(settings, study_id)
    d.mkdir(parents=True)
    labels = [f"{g}-{i:02d}" for i, (g, _, _) in enumerate(PANEL)]
    (d / "study.yaml").write_text(yaml.safe_dump({
        "study_id": study_id, "tools": list(TOOLS), "host_tool": TOOLS[-1], "memo": False, "simulated": True,
        "judges": [{"label": label, "group": g} for label, (g, _, _) in zip(labels, PANEL)],
        "analysis": {"bootstrap_resamples": 100, "permutations": 100}}))
    ctx = load_study_context(settings, study_id)
    salt = study_salt(d)
    table = simulate_answers(ctx.definition, ctx.prompt_ids, salt, seed=27)
    session = {salted(salt, label): (hour, stop) for label, (_, hour, stop) in zip(labels, PANEL)}
    rows = []
    for r in table.to_pylist():
        hour, stop = session[r["judge_id"]]
        if stop is not None and r["position"] >= stop:
            continue
        shown = DAY + timedelta(hours=hour, seconds=20 * r["position"])
        rows.append(dict(r, shown_at=shown, answered_at=shown + timedelta(seconds=9)))
    import pyarrow as pa

    write_study_partition(Lake(settings.lake_dir), "study_answers", study_id, pa.Table.from_pylist(rows, schema=table.schema))
    analyse(settings, study_id, mixed_resamples=2)


def salted(salt: str, label: str) -> str:
    from schemas.study import salted_judge_id

    return salted_judge_id(salt, label)


# ---- the attack, written here -------------------------------------------------------------------
def attack_figures(rows: list[dict], k: int) -> tuple[int, float, float]:
    """(judges with k answers, mean candidates, mean chance of naming the judge) for an attacker
    who knows a judge's group and k of their answers, over every k-subset of every judge's answers."""
    judges = sorted({r["judge_id"] for r in rows})
    bit = {j: 1 << i for i, j in enumerate(judges)}
    group_mask: dict[str, int] = defaultdict(int)
    holders: dict[tuple, int] = defaultdict(int)  # (group, tool, prompt, answer) -> judges who gave it
    answers_of: dict[str, list[tuple]] = defaultdict(list)
    for r in rows:
        key = (r["panel_group"], r["tool"], r["prompt_id"], r["answer"])
        holders[key] |= bit[r["judge_id"]]
        group_mask[r["panel_group"]] |= bit[r["judge_id"]]
        answers_of[r["judge_id"]].append(key)
    means_c, means_p = [], []
    for j in judges:
        if len(answers_of[j]) < k:
            continue
        total_c = total_p = 0.0
        n = 0
        for subset in combinations(answers_of[j], k):
            fit = group_mask[subset[0][0]]
            for key in subset:
                fit &= holders[key]
            c = fit.bit_count()
            assert fit & bit[j]
            total_c += c
            total_p += 1.0 / c
            n += 1
        means_c.append(total_c / n)
        means_p.append(total_p / n)
    return len(means_c), sum(means_c) / len(means_c), sum(means_p) / len(means_p)


def class_figures(rows: list[dict], columns: tuple[str, ...]) -> tuple[int, int]:
    """(smallest class, judges alone in theirs) on the published values of ``columns``."""
    per: dict[str, dict] = {}
    for r in rows:
        p = per.setdefault(r["judge_id"], {"panel_group": r["panel_group"], "answer_count": 0,
                                           "first_time": r["shown_at"], "last_time": r["answered_at"]})
        p["answer_count"] += 1
        p["first_time"] = min(p["first_time"], r["shown_at"])
        p["last_time"] = max(p["last_time"], r["answered_at"])
    sizes = Counter(tuple(p[c] for c in columns) for p in per.values())
    return min(sizes.values()), sum(1 for p in per.values() if sizes[tuple(p[c] for c in columns)] == 1)


def test_attack_of_the_test_on_a_tiny_table():
    """The test's own attack, on a table worked out by hand: two judges of one group agree on one
    of two answers. Knowing one answer: candidates (2 + 1)/2 per judge, naming (1/2 + 1)/2."""
    rows = [{"judge_id": j, "panel_group": "g", "tool": "t", "prompt_id": p, "answer": a}
            for j, answers in (("a", (True, True)), ("b", (True, False))) for p, a in zip(("p1", "p2"), answers)]
    assert attack_figures(rows, 1) == (2, 1.5, 0.75)
    assert attack_figures(rows, 2) == (2, 1.0, 1.0)


# ---- item 2 ------------------------------------------------------------------------------------
def test_export_refuses_unique_judges_then_publishes_the_figures_it_measured(tmp_path, monkeypatch):
    settings = workspace(tmp_path / "home", monkeypatch, tools=())
    _simulated_study(settings, "panel20")
    out = tmp_path / "bundle"

    # As collected (minute times, every judge): 5 of 20 judges are unique, and the export says so.
    r = cli("study", "export", "--study", "panel20", "--out", str(out))
    assert r.exit_code == 1 and not out.exists(), r.output
    text = " ".join(r.output.split())
    assert f"export refused: {UNIQUE_AS_PUBLISHED} of 20 judges would be unique" in text, text
    assert "(panel_group, answer_count, first_time, last_time): 5 unique, smallest class 1" in text
    assert "(panel_group, answer_count): 3 unique" in text and "(panel_group): 0 unique, smallest class 3" in text
    # Each option, and what it alone would leave: coarser times keep the three who stopped early
    # unique by their answer count, withholding them keeps the two alone in their session.
    assert "--times hour (5 would stay unique)" in text and "--times day (3 would stay unique)" in text
    assert "--times none (3 would stay unique)" in text and "--drop-partial-judges (2 would stay unique)" in text
    assert "--merge-groups non-ai-artists+tbi-survivors (5 would stay unique)" in text

    # Both: nobody unique; the bundle records the choice and the figures.
    r = cli("study", "export", "--study", "panel20", "--out", str(out), "--times", "day", "--drop-partial-judges")
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "answers.parquet").to_pylist()
    assert len({r["judge_id"] for r in rows}) == 17 and len(rows) == 17 * 30
    assert all(t.hour == t.minute == t.second == 0 for r in rows for t in (r["shown_at"], r["answered_at"]))
    anonymity = json.loads((out / "anonymity.json").read_text())
    assert anonymity["choices"] == {"times": "day", "drop_partial_judges": True, "merge_groups": {},
                                    "export_options": "--times day --drop-partial-judges"}
    assert anonymity["withheld"] == {"judges": 3, "answers": 20 + 12 + 25}
    sheet = (out / "datasheet.md").read_text()
    assert "Export options: `--times day --drop-partial-judges`" in sheet
    assert "the answers of 3 judge(s) who did not answer their whole queue (57 answers)" in sheet

    # Every figure against the attack written here.
    measures = anonymity["measures"]
    assert measures["judges"] == 17 and measures["judges_unique_on_any_set"] == 0
    for q in measures["quasi_identifiers"]:
        smallest, unique = class_figures(rows, tuple(q["columns"]))
        assert (q["min_class_size"], q["unique_judges"]) == (smallest, unique), q
        assert f"| {', '.join(q['columns'])} | 17 | {q['classes']} | {smallest} | {unique} |" in sheet
    attacks = {a["known_answers"]: a for a in measures["attacks"]}
    for k in (1, 2, 3, 5):
        judges, candidates, naming = attack_figures(rows, k)
        got = attacks[k]
        assert got["method"] == "exact" and got["judges"] == judges == 17
        assert got["mean_candidates"] == pytest.approx(candidates, rel=1e-12, abs=1e-12)
        assert got["naming_probability"] == pytest.approx(naming, rel=1e-12, abs=1e-12)
        assert f"| {k} | {judges} | {candidates:.2f} | {100 * naming:.1f}% | exact |" in sheet
    # More known answers, fewer candidates: the figure means something on this panel.
    assert attacks[1]["mean_candidates"] > attacks[5]["mean_candidates"] >= 1
    assert 0 < attacks[1]["naming_probability"] < attacks[5]["naming_probability"] <= 1


def test_figures_are_measured_on_what_is_published_as_it_was_collected(tmp_path, monkeypatch):
    """Merging the two smallest groups and withholding times publishes every judge of them in one
    class of 6; the figures move with the choice (measured on the rows written, not the study)."""
    settings = workspace(tmp_path / "home", monkeypatch, tools=())
    _simulated_study(settings, "merged")
    out = tmp_path / "bundle"
    r = cli("study", "export", "--study", "merged", "--out", str(out), "--times", "none", "--drop-partial-judges",
            "--merge-groups", "tbi-survivors+non-ai-artists")
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "answers.parquet").to_pylist()
    groups = Counter({r["judge_id"]: r["panel_group"] for r in rows}.values())
    assert groups == {"photographers": 5, "art-therapists": 4, "aphantasia": 3, "tbi-survivors-or-non-ai-artists": 5}
    study = json.loads((out / "study.json").read_text())
    assert study["panel"]["tbi-survivors-or-non-ai-artists"] == 5 and "tbi-survivors" not in study["panel"]
    index_groups = {line.split(",")[2] for line in (out / "beauty_index.csv").read_text().splitlines()[1:]}
    assert "tbi-survivors" not in index_groups and "non-ai-artists" not in index_groups and "all" in index_groups
    measures = json.loads((out / "anonymity.json").read_text())["measures"]
    for q in measures["quasi_identifiers"]:
        assert (q["min_class_size"], q["unique_judges"]) == class_figures(rows, tuple(q["columns"]))
    assert measures["quasi_identifiers"][-1]["min_class_size"] == 3  # aphantasia: 3 left, times withheld
    for k in (1, 3):
        _, candidates, naming = attack_figures(rows, k)
        got = next(a for a in measures["attacks"] if a["known_answers"] == k)
        assert (got["mean_candidates"], got["naming_probability"]) == pytest.approx((candidates, naming), rel=1e-12)


def test_a_bad_merge_is_refused_in_one_line(tmp_path, monkeypatch):
    settings = workspace(tmp_path / "home", monkeypatch, tools=())
    _simulated_study(settings, "badmerge")
    for value, says in (("tbi-survivors+astronauts", "['astronauts'] not among the study's panel groups"),
                        ("tbi-survivors", "name two or more different groups")):
        r = cli("study", "export", "--study", "badmerge", "--out", str(tmp_path / "b"), "--merge-groups", value)
        assert r.exit_code == 1 and says in r.output and not (tmp_path / "b").exists(), r.output
    r = cli("study", "export", "--study", "badmerge", "--out", str(tmp_path / "b"), "--times", "week")
    assert r.exit_code == 1 and "choose one of minute, hour, day, none" in r.output


# ---- item 3 ------------------------------------------------------------------------------------
def _loads(label: str, tool: str, prompt: str) -> bool:
    """Most images are loaded; a few, chosen by hash, are answered without (flagged)."""
    import hashlib

    return int(hashlib.sha256(f"{label}/{tool}/{prompt}".encode()).hexdigest(), 16) % 7 != 0


def test_an_imported_study_flags_what_the_home_study_flagged(prefect_harness, tmp_path, monkeypatch):
    """A panel study whose judges sometimes answered an image their browser never loaded: the
    bundle carries each answer's flag and what it means, and another lab's analysis of the bundle
    gives the same index, with and without the flagged answers, as the study at home, bit for bit
    (before: the bundle had no flags, and the import flagged nothing)."""
    import hashlib

    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    settings = workspace(tmp_path / "home", monkeypatch)
    opened_at = DAY.replace(hour=9)
    # Judges answer side by side, one image each per turn; the clock moves 0.8 s per reading
    # (shown, image sent, answered): a loaded image is 0.8 s on screen, over the 0.5 s threshold.
    panel_clock(monkeypatch, opened_at + timedelta(minutes=1), timedelta(seconds=0.8))

    def answer(label: str, tool: str, prompt: str) -> bool:
        return int(hashlib.sha256(f"{label}:{tool}:{prompt}".encode()).hexdigest(), 16) % 5 < 2

    open_and_answer(settings, "qc", answer, opened_at=opened_at, interleave=True, loads_image=_loads,
                    quality={"min_seconds_on_screen": 0.5})
    analyse(settings, "qc")
    home = read_study_partition(Lake(settings.lake_dir), "study_index", "qc").to_pylist()
    flagged = sum(r["flagged_answers"] for r in home if r["panel_group"] == "all")
    assert 0 < flagged < 60 and all(r["beauty_index_unflagged"] is not None for r in home)
    assert any(r["beauty_index_unflagged"] != r["beauty_index"] for r in home)
    r = cli("study", "export", "--study", "qc", "--out", str(tmp_path / "bundle"), "--times", "day")
    assert r.exit_code == 0, r.output
    rows = pq.read_table(tmp_path / "bundle" / "answers.parquet").to_pylist()
    assert sum(r["qc_flag"] is not None for r in rows) == flagged
    assert {r["qc_flag"] for r in rows} == {None, "image not loaded"}
    assert (tmp_path / "bundle" / "answers.csv").read_text().splitlines()[0].split(",")[-2:] == ["qc_flag", "source"]
    sheet = (tmp_path / "bundle" / "datasheet.md").read_text()
    from tasks.beauty.export import md
    from tasks.beauty.quality import NOT_LOADED, flag_meanings, too_fast

    meanings = flag_meanings(0.5)  # the legend: each flag, what it means, how many answers carry it
    assert f"| {NOT_LOADED} | {md(meanings[NOT_LOADED])} | {flagged} |" in sheet
    assert f"| {too_fast(0.5)} | {md(meanings[too_fast(0.5)])} | 0 |" in sheet
    assert "(study.json quality.min\\_seconds\\_on\\_screen)" in sheet  # escaped once: shown as written

    other = workspace(tmp_path / "other", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(tmp_path / "bundle"))
    assert r.exit_code == 0, r.output
    r = cli("study", "analyze", "--study", "qc", "--mixed-resamples", "3")
    assert r.exit_code == 0, r.output
    here = read_study_partition(Lake(other.lake_dir), "study_index", "qc").to_pylist()
    assert here == home
    # Exported again by the importing lab: the same flags, and no memo of its own to speak of.
    r = cli("study", "export", "--study", "qc", "--out", str(tmp_path / "again"), "--times", "day")
    assert r.exit_code == 0, r.output
    again = pq.read_table(tmp_path / "again" / "answers.parquet").to_pylist()
    assert [(a["judge_id"], a["tool"], a["prompt_id"], a["qc_flag"]) for a in again] == \
        [(a["judge_id"], a["tool"], a["prompt_id"], a["qc_flag"]) for a in rows]
    assert "imported from another lab's bundle" in (tmp_path / "again" / "datasheet.md").read_text()
    # A bundle with merged groups imports too: the merged group is a group of the study there.
    r = cli("study", "export", "--study", "qc", "--out", str(tmp_path / "merged"), "--times", "day",
            "--merge-groups", "photographers+aphantasia")
    assert r.exit_code == 0, r.output
    r = cli("study", "import-bundle", str(tmp_path / "merged"), "--as", "qc-merged")
    assert r.exit_code == 0 and "4 judges" in r.output, r.output
    merged = read_study_partition(Lake(other.lake_dir), "study_answers", "qc-merged")
    assert set(merged.column("panel_group").to_pylist()) == {"photographers-or-aphantasia"}


def test_a_figure_too_costly_to_compute_exactly_is_sampled_and_says_so(monkeypatch):
    """Where neither every subset nor the inclusion-exclusion fits the budget (a large group of
    judges who agree a lot), the chance of naming is a seeded sample, close to the exact figure of
    the attack written here, and the figure is marked as sampled with its size and seed."""
    import random

    from tasks.beauty import reident

    rng = random.Random(5)
    rows = [{"judge_id": f"j{j:02d}", "panel_group": "everyone", "tool": "t", "prompt_id": f"p{p:02d}",
             "answer": rng.random() < 0.8, "shown_at": DAY, "answered_at": DAY} for j in range(10) for p in range(14)]
    exact = reident.attack_risk(reident.judge_profiles(rows), 3)
    assert exact.method == "exact"
    monkeypatch.setattr(reident, "EXACT_TERMS", 50)
    sampled = reident.attack_risk(reident.judge_profiles(rows), 3)
    assert sampled.method == f"sampled: {reident.SAMPLES_PER_JUDGE} subsets per judge, seed {reident.SAMPLE_SEED}"
    judges, candidates, naming = attack_figures(rows, 3)
    assert (exact.judges, exact.mean_candidates, exact.naming_probability) == pytest.approx((judges, candidates, naming))
    assert sampled.mean_candidates == pytest.approx(candidates)  # always exact: a sum over group mates
    assert sampled.naming_probability == pytest.approx(naming, abs=0.01)
    assert sampled == reident.attack_risk(reident.judge_profiles(rows), 3)  # seeded: the same figure again
