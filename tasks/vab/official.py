"""VAB metrics as the authors' summarize.py computes them (docs/VAB.md, "The official numbers").
Pure functions, no I/O; written from what the toolkit does, tested against its output
(tests/vab/test_official.py, fixture made by the toolkit's own code).

Per judge and prompt type (pick_best, pick_worst, pick_best_and_worst), trials are grouped by task:

- a task whose trials of that type are *all* errors is left out of that type's totals; a task
  with some errors stays in and cannot be right (fewer than 3 non-error trials);
- p^3 ("accuracy"): share of counted tasks right in 3 non-error trials; an unparsable answer is a
  wrong trial. pick_best_and_worst: best right in all its *parsed* trials and 3 of them
  (``accuracy_best``), likewise worst, both;
- ap@1 ("avg_pass_at_1"): per trial index 0..2, the share right among that trial's non-error
  answers (pick_best_and_worst: among its *parsed* answers: an unparsable one is left out), then
  the mean over the trial indexes that have any answer;
- breakdowns by domain (the release's names, all three always present) and by image count;
  ``pick_worst`` keys only when the judge has pick_worst answers;
- the random guess, per task: best and worst (1/k)^3, both (1/(k(k-1)))^3, 0.5^3 for k = 2;
  ap@1 without the cube; averaged over the collection's tasks.

A share with no task behind it is None (absent: JSON null, "-" in the table), where summarize.py
writes 0 (a prompt type the run did not ask, a domain with no task, a trial index with no answer):
issue 25 item 6, "absent is never 0". Everything else is summarize.py's number, unrounded (the table
prints one decimal).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.vab import OFFICIAL_DOMAIN_OF, OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PICK_WORST, TRIALS, VabTask

OFFICIAL_DOMAINS = ("fine-art", "illustration", "photograph")  # summarize.py's order
RANDOM_GUESS = "Random Guess"


@dataclass(frozen=True)
class OfficialTrial:
    """One answer as summarize.py sees it. ``best_right``/``worst_right``: None when the trial has
    no parsed answer for it (unparsable, error)."""

    task_id: str
    prompt_type: str  # pick_best | pick_worst | pick_best_and_worst
    trial: int
    error: bool
    parsed: bool
    correct: bool  # eval.py's "correct": the asked label(s) right
    best_right: bool | None
    worst_right: bool | None
    domain: str  # the release's name
    n_images: int


def _bucket() -> dict:
    return {PICK_BEST: [0, 0], PICK_WORST: [0, 0], PICK_BEST_AND_WORST: [0, 0, 0, 0]}  # [total, right...]


def _share(num: int, den: int) -> float | None:
    return num / den if den else None  # summarize.py: 0


def _mean(values: Sequence[float | None]) -> float | None:
    return sum(values) / len(values) if values else None  # summarize.py: 0


def _add(bucket: dict, pt: str, *rights: bool) -> None:
    b = bucket[pt]
    b[0] += 1
    for i, r in enumerate(rights, 1):
        b[i] += int(r)


@dataclass
class _Tally:
    """One judge's counts: [total, right...] buckets per prompt type, overall, by release domain and
    by image count, for p^3 (per task) and, per trial index 0..2, for ap@1 (per trial)."""

    total: dict
    by_domain: dict[str, dict]
    by_n: dict[int, dict]
    per_trial: list[dict]
    per_trial_domain: list[dict[str, dict]]
    per_trial_n: list[dict[int, dict]]


def _tally(trials: Iterable[OfficialTrial]) -> _Tally:
    groups: dict[tuple[str, str], list[OfficialTrial]] = defaultdict(list)
    for t in trials:
        if t.prompt_type not in OFFICIAL_PROMPT_TYPES:
            raise ValueError(f"task {t.task_id!r}: prompt type {t.prompt_type!r} is not one of {OFFICIAL_PROMPT_TYPES}")
        groups[(t.task_id, t.prompt_type)].append(t)
    total = _bucket()
    by_domain = {d: _bucket() for d in OFFICIAL_DOMAINS}
    by_n: dict[int, dict] = defaultdict(_bucket)
    per_trial = [_bucket() for _ in range(TRIALS)]
    per_trial_domain = [{d: _bucket() for d in OFFICIAL_DOMAINS} for _ in range(TRIALS)]
    per_trial_n: list[dict[int, dict]] = [defaultdict(_bucket) for _ in range(TRIALS)]
    for (_task, pt), group in groups.items():
        answered = [t for t in group if not t.error]
        if not answered:
            continue  # every trial errored: the task leaves this prompt type's totals
        domain, n = group[0].domain, group[0].n_images
        if domain not in by_domain:
            raise ValueError(f"task {group[0].task_id!r}: domain {domain!r} is not one of {OFFICIAL_DOMAINS}")
        if pt != PICK_BEST_AND_WORST:
            right = len(answered) >= TRIALS and all(t.correct for t in answered)
            for b in (total, by_domain[domain], by_n[n]):
                _add(b, pt, right)
            for t in answered:
                if t.trial < TRIALS:
                    for b in (per_trial[t.trial], per_trial_domain[t.trial][domain], per_trial_n[t.trial][n]):
                        _add(b, pt, t.correct)
        else:
            parsed = [t for t in answered if t.parsed]
            full = len(parsed) >= TRIALS
            rb = full and all(t.best_right for t in parsed)
            rw = full and all(t.worst_right for t in parsed)
            for b in (total, by_domain[domain], by_n[n]):
                _add(b, pt, rb, rw, rb and rw)
            for t in parsed:
                if t.trial < TRIALS:
                    tb, tw = bool(t.best_right), bool(t.worst_right)
                    for b in (per_trial[t.trial], per_trial_domain[t.trial][domain], per_trial_n[t.trial][n]):
                        _add(b, pt, tb, tw, tb and tw)
    return _Tally(total, by_domain, by_n, per_trial, per_trial_domain, per_trial_n)


def _acc(b: dict, pt: str) -> float | None:
    return _share(b[pt][1], b[pt][0])


def _acc_bw(b: dict) -> tuple:
    t, rb, rw, both = b[PICK_BEST_AND_WORST]
    return (None, None, None) if t == 0 else (rb / t, rw / t, both / t)  # summarize.py: (0, 0, 0)


def judge_scores(trials: Iterable[OfficialTrial]) -> dict:
    """summarize.py's scores of one judge (its ``compute_model_scores`` value)."""
    tally = _tally(trials)
    total, by_domain, by_n = tally.total, tally.by_domain, tally.by_n
    per_trial, per_trial_domain, per_trial_n = tally.per_trial, tally.per_trial_domain, tally.per_trial_n
    has_worst = total[PICK_WORST][0] > 0
    ab, aw, aboth = _acc_bw(total)
    out: dict = {PICK_BEST: {"accuracy": _acc(total, PICK_BEST)},
                 PICK_BEST_AND_WORST: {"accuracy_best": ab, "accuracy_worst": aw, "accuracy_both": aboth},
                 "by_domain": {}, "by_n_images": {}}
    if has_worst:
        out[PICK_WORST] = {"accuracy": _acc(total, PICK_WORST)}

    def breakdown(b: dict) -> dict:
        d = {PICK_BEST: _acc(b, PICK_BEST), "pick_best_and_worst_both": _acc_bw(b)[2]}
        if has_worst:
            d[PICK_WORST] = _acc(b, PICK_WORST)
        return d

    for d in OFFICIAL_DOMAINS:
        out["by_domain"][d] = breakdown(by_domain[d])
    for n in sorted(by_n):
        out["by_n_images"][str(n)] = breakdown(by_n[n])

    def ap1(buckets: Sequence[dict]) -> dict:
        d = {PICK_BEST: _mean([_acc(b, PICK_BEST) for b in buckets if b[PICK_BEST][0]]),
             "pick_best_and_worst_both": _mean([_acc_bw(b)[2] for b in buckets if b[PICK_BEST_AND_WORST][0]])}
        if has_worst:
            d[PICK_WORST] = _mean([_acc(b, PICK_WORST) for b in buckets if b[PICK_WORST][0]])
        return d

    out["avg_pass_at_1"] = ap1(per_trial)
    out["avg_pass_at_1_by_domain"] = {d: ap1([p[d] for p in per_trial_domain]) for d in OFFICIAL_DOMAINS}
    out["avg_pass_at_1_by_n_images"] = {str(n): ap1([p[n] for p in per_trial_n]) for n in sorted(by_n)}
    return out


def prompt_type_scores(trials: Iterable[OfficialTrial]) -> dict[str, dict]:
    """One judge's figures per official prompt type with at least one counted task, from the same
    counts as ``judge_scores`` (the report page's table): ``{prompt_type: {"tasks", "p3_best",
    "p3_worst", "p3_both", "ap1_best", "ap1_worst", "ap1_both"}}``, fractions 0-1, None where the
    prompt type does not ask it (pick_best has no worst, pick_worst no best). What summarize.py
    reports is exactly ``judge_scores``'s number (p^3 = ``accuracy``/``accuracy_*``, ap@1 =
    ``avg_pass_at_1``); pick_best_and_worst's ap@1 of best and of worst alone, which summarize.py
    does not print, follow its rule for both (the mean over trial indexes of the parsed answers'
    share right). ``tasks``: the tasks counted (those with a non-error trial of that type)."""
    tally = _tally(trials)
    out: dict[str, dict] = {}
    for pt in OFFICIAL_PROMPT_TYPES:
        n = tally.total[pt][0]
        if not n:
            continue
        res = dict.fromkeys(("p3_best", "p3_worst", "p3_both", "ap1_best", "ap1_worst", "ap1_both"))
        asked = [b for b in tally.per_trial if b[pt][0]]
        if pt == PICK_BEST_AND_WORST:
            res["p3_best"], res["p3_worst"], res["p3_both"] = _acc_bw(tally.total)
            for i, key in enumerate(("ap1_best", "ap1_worst", "ap1_both")):
                res[key] = _mean([_acc_bw(b)[i] for b in asked])
        else:
            side = "best" if pt == PICK_BEST else "worst"
            res["p3_" + side] = _acc(tally.total, pt)
            res["ap1_" + side] = _mean([_acc(b, pt) for b in asked])
        out[pt] = {"tasks": n, **res}
    return out


def random_guess(tasks: Sequence[tuple[str, int]]) -> dict:
    """summarize.py's "Random Guess" over ``tasks`` given as (release domain, n_images)."""
    keys = ("pb", "pw", "both", "pb1", "pw1", "both1")
    sums = dict.fromkeys(keys, 0.0)
    groups: dict[str, dict[object, dict]] = {"domain": defaultdict(lambda: {**dict.fromkeys(keys, 0.0), "count": 0}),
                                             "n": defaultdict(lambda: {**dict.fromkeys(keys, 0.0), "count": 0})}
    for domain, k in tasks:
        single_both = 0.5 if k == 2 else 1.0 / (k * (k - 1))
        chance = {"pb": (1.0 / k) ** TRIALS, "pw": (1.0 / k) ** TRIALS, "both": single_both ** TRIALS,
                  "pb1": 1.0 / k, "pw1": 1.0 / k, "both1": single_both}
        for key in keys:
            sums[key] += chance[key]
        for g in (groups["domain"][domain], groups["n"][k]):
            for key in keys:
                g[key] += chance[key]
            g["count"] += 1
    n_total = len(tasks)
    if n_total == 0:
        raise ValueError("the random guess needs at least one task")

    def three(g: dict, suffix: str, count: int) -> dict:
        return {PICK_BEST: g["pb" + suffix] / count, PICK_WORST: g["pw" + suffix] / count,
                "pick_best_and_worst_both": g["both" + suffix] / count}

    out: dict = {PICK_BEST: {"accuracy": sums["pb"] / n_total}, PICK_WORST: {"accuracy": sums["pw"] / n_total},
                 PICK_BEST_AND_WORST: {"accuracy_both": sums["both"] / n_total},
                 "avg_pass_at_1": three(sums, "1", n_total),
                 "by_domain": {}, "by_n_images": {}, "avg_pass_at_1_by_domain": {}, "avg_pass_at_1_by_n_images": {}}
    for d in OFFICIAL_DOMAINS:
        g = groups["domain"].get(d)
        if g and g["count"]:
            out["by_domain"][d] = three(g, "", g["count"])
            out["avg_pass_at_1_by_domain"][d] = three(g, "1", g["count"])
    for k in sorted(groups["n"]):
        g = groups["n"][k]
        out["by_n_images"][str(k)] = three(g, "", g["count"])
        out["avg_pass_at_1_by_n_images"][str(k)] = three(g, "1", g["count"])
    return out


def official_worst(task: VabTask) -> int:
    """The worst image as the official toolkit asks it: the label, or for 2 images the other one."""
    if task.worst is not None:
        return task.worst
    return 2 if task.best == 1 else 1


def official_trials(tasks: Sequence[VabTask], rows: Iterable[dict]) -> list[OfficialTrial]:
    """One judge's ``vab_trials`` rows of the official prompt types, as summarize.py sees them:
    state ``error`` = an error row; ``ok`` = a parsed answer; ``unparsable``/``tie`` = no parsed
    answer (a wrong trial). Rows of our combined prompt are not official answers and are skipped."""
    by_id = {t.task_id: t for t in tasks}
    out = []
    for r in rows:
        pt = r.get("prompt_type")
        if pt not in OFFICIAL_PROMPT_TYPES:
            continue
        task = by_id.get(r["task_id"])
        if task is None:
            raise ValueError(f"task {r['task_id']!r} is not in the set collection")
        ok = r["state"] == "ok"
        best_right = (r["best"] == task.best) if ok and pt != PICK_WORST else None
        worst_right = (r["worst"] == official_worst(task)) if ok and pt != PICK_BEST else None
        correct = ok and (best_right is not False) and (worst_right is not False)
        out.append(OfficialTrial(task.task_id, pt, int(r["trial"]), r["state"] == "error", ok, bool(correct),
                                 best_right, worst_right, OFFICIAL_DOMAIN_OF[task.domain], len(task.images)))
    return out


def official_summary(tasks: Sequence[VabTask], trials_by_judge: dict[str, list[dict]]) -> dict:
    """``{"Random Guess": ..., judge: ...}`` as summarize.py's ``--output`` JSON (judges in the
    given order; a judge without official answers is left out)."""
    out = {RANDOM_GUESS: random_guess([(OFFICIAL_DOMAIN_OF[t.domain], len(t.images)) for t in tasks])}
    for judge, rows in trials_by_judge.items():
        trials = official_trials(tasks, rows)
        if trials:
            out[judge] = judge_scores(trials)
    return out


# ---- the table summarize.py prints ---------------------------------------------------------------
def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str]) -> list[str]:
    widths = [len(str(h)) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(str(cell)))
    sep = "  " + "+".join("-" * (w + 2) for w in widths)

    def line(cells: Sequence[str]) -> str:
        return "  " + "|".join(f" {str(c):>{widths[i]}} " if align[i] == "r" else f" {str(c):<{widths[i]}} "
                               for i, c in enumerate(cells))

    return [sep, line(headers), sep, *(line(r) for r in rows), sep]


def _pct_t0(value, t0_value) -> str:
    return _pct(value) + ("" if t0_value is None else f" ({_pct(t0_value)})")


def summary_table(scores: dict, t0_scores: dict | None = None) -> str:
    """The text summarize.py prints for ``scores`` and, in parentheses in the overall table, the same
    judges' runs at temperature 0 (``t0_scores``, its --t0-dir), ending with a newline."""
    t0_scores = t0_scores or {}
    out = ["", "=" * 80, "  Benchmark Results Summary", "=" * 80]
    has_ap1 = any("avg_pass_at_1" in s for s in scores.values())
    names = ["top1", "bot1", "tb1"]
    headers = ["Model", *(f"{n}(p^3)" for n in names), *(f"{n}(ap@1)" for n in names)] if has_ap1 else ["Model", *names]
    rows = []
    for name, s in scores.items():
        t0 = t0_scores.get(name) or {}
        row = [name, _pct_t0(s[PICK_BEST]["accuracy"], t0.get(PICK_BEST, {}).get("accuracy")),
               _pct_t0(s.get(PICK_WORST, {}).get("accuracy"), t0.get(PICK_WORST, {}).get("accuracy")),
               _pct_t0(s[PICK_BEST_AND_WORST]["accuracy_both"], t0.get(PICK_BEST_AND_WORST, {}).get("accuracy_both"))]
        if has_ap1:
            ap, t0_ap = s.get("avg_pass_at_1", {}), t0.get("avg_pass_at_1", {})
            row += [_pct_t0(ap.get(k), t0_ap.get(k)) for k in (PICK_BEST, PICK_WORST, "pick_best_and_worst_both")]
        rows.append(row)
    out += ["", "  Overall Accuracy  (p^3 = pass^3, ap@1 = avg pass@1, parentheses = t=0)", "-" * 80]
    out += _table(headers, rows, ["l"] + ["r"] * (len(headers) - 1))
    metrics = ((PICK_BEST, "top1"), (PICK_WORST, "bot1"), ("pick_best_and_worst_both", "tb1"))
    for key, label in metrics:
        cols = [f"{d[:5]}(p^3)" for d in OFFICIAL_DOMAINS] + [f"{d[:5]}(ap@1)" for d in OFFICIAL_DOMAINS] if has_ap1 else list(OFFICIAL_DOMAINS)
        rows = []
        for name, s in scores.items():
            row = [name] + [_pct(s.get("by_domain", {}).get(d, {}).get(key)) for d in OFFICIAL_DOMAINS]
            if has_ap1:
                row += [_pct(s.get("avg_pass_at_1_by_domain", {}).get(d, {}).get(key)) for d in OFFICIAL_DOMAINS]
            rows.append(row)
        out += ["", f"  By Domain ({label})", "-" * 80]
        out += _table(["Model", *cols], rows, ["l"] + ["r"] * len(cols))
    sizes = sorted({int(n) for s in scores.values() for n in s.get("by_n_images", {})})
    if sizes:
        for key, label in metrics:
            cols = [f"{n}img(p^3)" for n in sizes] + [f"{n}img(ap@1)" for n in sizes] if has_ap1 else [f"{n}img" for n in sizes]
            rows = []
            for name, s in scores.items():
                row = [name] + [_pct(s.get("by_n_images", {}).get(str(n), {}).get(key)) for n in sizes]
                if has_ap1:
                    row += [_pct(s.get("avg_pass_at_1_by_n_images", {}).get(str(n), {}).get(key)) for n in sizes]
                rows.append(row)
            out += ["", f"  By Image Count ({label})", "-" * 80]
            out += _table(["Model", *cols], rows, ["l"] + ["r"] * len(cols))
    return "\n".join(out) + "\n"
