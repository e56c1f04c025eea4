"""Analyst queries and the catalog refresh on a lake of many models (issue 11, goal 3).

Builds a synthetic lake of N models (default 10,000) with the lake's own writer
(``Lake.write_partition``: 192 ``images``, 192 ``hps_scores``, 192 ``verdicts`` and 1
``model_scores`` row per model, the v1 suite's prompts), refreshes the catalog in full, then times,
each in a FRESH Python process that only does ``import duckdb; duckdb.connect(catalog,
read_only=True)`` (no imagebench code):

* the ``leaderboard`` view, and
* a per-category Capability x EPS query over all models (verdicts and hps_scores joined with
  ``prompts``, as an analyst writes it),

against the compacted catalog (new) and against plain per-model glob views over
``<lake>/<table>/*/data.parquet`` (the old layout's views) in the same run, so old/new is one
run's ratio. Then it rewrites 1, 10 and 50 models (as a nightly does) and times
``tasks.lake.tables.refresh_catalog`` after each.

    .venv/bin/python bench/bench_lake.py --models 10000 --lake /tmp/lake10k   # builds once, reuses
    .venv/bin/python bench/bench_lake.py --models 1000                        # temp dir

Nothing here asserts on time; it prints JSON and a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, SUITE_FILE, CpuMeter, machine_info  # noqa: E402
from harness import Context, Report, summary_row  # noqa: E402

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
REFERENCE = "bench"

LEADERBOARD_SQL = "SELECT * FROM leaderboard"
# Per category: Capability (PASS share of decided verdicts) and mean HPSv3 mu, next to the model's
# EPS, for every model: what an analyst writes against the catalog.
CATEGORY_SQL = """
WITH cap AS (
    SELECT v.model_id, p.category,
           100.0 * count(*) FILTER (WHERE v.verdict = 'PASS')
                 / nullif(count(*) FILTER (WHERE v.verdict IN ('PASS', 'FAIL')), 0) AS capability
    FROM verdicts v JOIN prompts p USING (prompt_id)
    GROUP BY ALL
), mu AS (
    SELECT h.model_id, p.category, avg(h.mu) AS mean_mu
    FROM hps_scores h JOIN prompts p USING (prompt_id)
    WHERE p.eps_eligible
    GROUP BY ALL
)
SELECT c.model_id, c.category, c.capability, m.mean_mu, s.eps
FROM cap c
LEFT JOIN mu m USING (model_id, category)
JOIN model_scores s ON s.model_id = c.model_id AND s.reference_version = 'bench'
ORDER BY c.category, c.capability DESC, s.eps DESC
"""



# --------------------------------------------------------------------------------------------
# Synthetic lake
# --------------------------------------------------------------------------------------------


def _templates():
    import pyarrow as pa

    from schemas.lake import HPS_SCORES, IMAGES, MODEL_SCORES, VERDICTS
    from tasks.scores.suite import load_suite

    suite = load_suite(SUITE_FILE)
    ids = [p.prompt_id for p in suite.prompts]
    n = len(ids)
    sha = "ab" * 32
    images = pa.Table.from_pylist([{
        "model_id": "x", "prompt_id": p, "suite_version": suite.version, "state": "ok", "reason": None,
        "object_uri": f"s3://bench/x/{p}.png", "image_sha256": sha, "image_path": f"images/ab/{sha}.png",
        "format": "PNG", "width": 512, "height": 512, "source_mode": "RGB", "byte_size": 1000,
        "source_fingerprint": sha, "ingested_at": T0,
    } for p in ids], schema=IMAGES)
    hps = pa.Table.from_pylist([{
        "model_id": "x", "prompt_id": p, "suite_version": suite.version, "image_sha256": sha,
        "scorer_name": "hpsv3", "scorer_id": "0123456789abcdef", "checkpoint_sha256": None, "mu": 0.0,
        "sigma": None, "source": "import", "uncalibrated": False, "scored_at": T0, "runtime": None,
    } for p in ids], schema=HPS_SCORES)
    verdicts = pa.Table.from_pylist([{
        "model_id": "x", "prompt_id": p, "suite_version": suite.version, "image_sha256": sha,
        "question_sha256": "cd" * 32, "verdict": "PASS", "reason": None, "judge": "bench-judge",
        "judge_model": "bench", "template_sha256": "ef" * 32, "sampling": "{}", "identity": "01" * 8,
        "rationale": None, "source": "import", "decided_at": T0,
    } for p in ids], schema=VERDICTS)
    score = {
        "model_id": "x", "suite_version": suite.version, "reference_version": REFERENCE,
        "reference_sha256": sha, "scorer_name": "hpsv3", "scorer_id": "0123456789abcdef", "eps": 0.0,
        "eps_prompts_scored": len(suite.eligible_ids), "eps_prompts_eligible": len(suite.eligible_ids),
        "eps_prompts_lost": 0, "images_ok": n, "images_quarantined": 0, "images_missing": 0,
        "complete": True, "uncalibrated": False, "eps_lo": 0.0, "eps_hi": 0.0, "capability": 0.0,
        "capability_lo": 0.0, "capability_hi": 0.0, "verdicts_pass": 0, "verdicts_fail": 0,
        "verdicts_undecided": 0, "judge_coverage": 1.0, "overall": 0.0, "overall_lo": 0.0,
        "overall_hi": 0.0, "provisional": False, "source_fingerprint": sha, "run_id": "bench",
        "scored_at": T0,
    }
    return suite, images, hps, verdicts, pa.Table.from_pylist([score], schema=MODEL_SCORES)


def model_id(i: int) -> str:
    return f"lab-model-{i:05d}"


def write_models(lake_dir: str, indices: list[int], version: int = 0) -> None:
    """Write the four partitions of each model with Lake.write_partition (seeded by index and
    version, so a rewrite changes the rows)."""
    import pyarrow as pa

    from tasks.lake.tables import Lake

    lake = Lake(lake_dir)
    _, images, hps, verdicts, score = _templates()
    n = hps.num_rows
    for i in indices:
        rng = random.Random(i * 1000 + version)
        m = model_id(i)
        mid = pa.array([m] * n)
        mus = [rng.gauss(5.0, 2.0) for _ in range(n)]
        vs = [rng.choice(("PASS", "PASS", "FAIL", "ERROR")) for _ in range(n)]
        lake.write_partition("images", m, images.set_column(0, "model_id", mid))
        lake.write_partition("hps_scores", m, hps.set_column(0, "model_id", mid).set_column(
            hps.schema.get_field_index("mu"), "mu", pa.array(mus)))
        lake.write_partition("verdicts", m, verdicts.set_column(0, "model_id", mid).set_column(
            verdicts.schema.get_field_index("verdict"), "verdict", pa.array(vs)))
        eps = 100.0 * sum(1 for x in mus if x > 5.0) / n
        npass = vs.count("PASS")
        nfail = vs.count("FAIL")
        cap = 100.0 * npass / (npass + nfail)
        row = score.to_pylist()[0]
        row.update(model_id=m, eps=eps, eps_lo=eps - 3, eps_hi=eps + 3, capability=cap, capability_lo=cap - 4,
                   capability_hi=cap + 4, verdicts_pass=npass, verdicts_fail=nfail, verdicts_undecided=n - npass - nfail,
                   overall=(eps + cap) / 2, overall_lo=(eps + cap) / 2 - 3, overall_hi=(eps + cap) / 2 + 3,
                   run_id=f"bench-{version}", scored_at=T0 + timedelta(days=version))
        lake.write_partition("model_scores", m, pa.Table.from_pylist([row], schema=score.schema))


def build_lake(lake_dir: Path, n_models: int, workers: int) -> float:
    t = time.perf_counter()
    chunks = [list(range(k, n_models, workers * 8)) for k in range(workers * 8)]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(write_models, [str(lake_dir)] * len(chunks), chunks))
    return time.perf_counter() - t


# --------------------------------------------------------------------------------------------
# Timing in a fresh, plain duckdb process
# --------------------------------------------------------------------------------------------

_PLAIN = r"""
import json, sys, time
t0 = time.perf_counter()
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
t1 = time.perf_counter()
rows = con.execute(sys.argv[2]).fetchall()
t2 = time.perf_counter()
import hashlib
digest = hashlib.sha256(repr(sorted(rows, key=repr)).encode()).hexdigest()
print("RESULT " + json.dumps({"connect_s": t1 - t0, "query_s": t2 - t1, "rows": len(rows), "sha256": digest}))
"""


def time_plain(catalog: Path, sql: str, repeats: int) -> dict:
    """Median over ``repeats`` fresh processes of the query's own time (connect reported apart)."""
    runs = []
    for _ in range(repeats):
        meter = CpuMeter()
        out = subprocess.run([PY, "-c", _PLAIN, str(catalog), sql], capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.rsplit("RESULT ", 1)[1])  # DuckDB may draw a progress bar first
        got["others_cpu"] = meter.others(0.0)
        runs.append(got)
    runs.sort(key=lambda r: r["query_s"])
    mid = runs[len(runs) // 2]
    return {"query_s": mid["query_s"], "connect_s": mid["connect_s"], "rows": mid["rows"], "sha256": mid["sha256"],
            "all_query_s": [round(r["query_s"], 4) for r in runs],
            "others_cpu_max": round(max(r["others_cpu"] for r in runs), 3)}


def old_catalog(lake_dir: Path, new_catalog: Path, path: Path) -> Path:
    """A catalog with the old layout's views (one glob per table over the per-model files, as
    catalog/4 held), the same prompts and the same leaderboard SQL: the ratio is the layout's."""
    import duckdb

    from tasks.lake import tables as lake_mod

    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        for t in ("images", "quarantine", "hps_scores", "model_scores", "judge_calls", "verdicts", "model_events"):
            con.execute(lake_mod._table_view_sql(lake_dir.resolve(), t))  # noqa: SLF001
        con.execute(f"ATTACH '{new_catalog}' AS n (READ_ONLY)")
        con.execute("CREATE TABLE prompts AS SELECT * FROM n.prompts")
        con.execute("CREATE TABLE catalog_info AS SELECT * FROM n.catalog_info")
        con.execute("DETACH n")
        con.execute(lake_mod.RETIRED_MODELS_SQL)
        suite_version = con.execute("SELECT suite_version FROM catalog_info").fetchall()[0][0]
        con.execute(lake_mod._leaderboard_sql(suite_version, REFERENCE))  # noqa: SLF001
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=10_000)
    ap.add_argument("--lake", type=Path, help="workspace directory to build in (reused when it holds the lake)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per query (median)")
    ap.add_argument("--json", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    out = run(args.models, args.lake, args.workers, args.repeats)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(markdown(out)))


def run(models: int, lake: Path | None, workers: int, repeats: int) -> dict:
    from types import SimpleNamespace

    args = SimpleNamespace(models=models, lake=lake, workers=workers, repeats=repeats)
    from tasks.lake.tables import refresh_catalog
    from tasks.scores.suite import load_suite

    suite = load_suite(SUITE_FILE)
    tmp = None
    if args.lake is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench-lake-"))
        home = tmp
    else:
        home = args.lake
    lake_dir = home / "lake"
    catalog = home / "imagebench.duckdb"
    marker = home / f"built-{args.models}"
    out: dict = {"machine": machine_info(), "models": args.models}
    try:
        if not marker.is_file():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            out["build_s"] = round(build_lake(lake_dir, args.models, args.workers), 1)
            marker.write_text("ok\n")
        t = time.perf_counter()
        refresh_catalog(lake_dir, catalog, suite, REFERENCE, full=True)
        out["refresh_full_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        refresh_catalog(lake_dir, catalog, suite, REFERENCE)
        out["refresh_nothing_changed_s"] = round(time.perf_counter() - t, 3)
        old = old_catalog(lake_dir, catalog, home / "old-layout.duckdb")

        queries = {"leaderboard": LEADERBOARD_SQL, "category": CATEGORY_SQL}
        out["queries"] = {}
        for name, sql in queries.items():
            new_t = time_plain(catalog, sql, args.repeats)
            old_t = time_plain(old, sql, args.repeats)
            if new_t["sha256"] != old_t["sha256"]:
                raise SystemExit(f"{name}: the compacted catalog and the old layout's views disagree "
                                 f"({new_t['rows']} rows vs {old_t['rows']})")
            out["queries"][name] = {"new": new_t, "old": old_t, "old_over_new": round(old_t["query_s"] / new_t["query_s"], 1)}

        out["refresh_after_change"] = {}
        version = 1
        for k in (1, 10, 50):
            picks = random.Random(k).sample(range(args.models), k)
            write_models(str(lake_dir), picks, version)
            version += 1
            meter = CpuMeter()
            t = time.perf_counter()
            refresh_catalog(lake_dir, catalog, suite, REFERENCE)
            out["refresh_after_change"][str(k)] = {"s": round(time.perf_counter() - t, 3),
                                                   "others_cpu": round(meter.others(), 3)}
        # the queries right after the nightly's refresh still answer fast (and match the old views)
        after = time_plain(catalog, LEADERBOARD_SQL, 1)
        out["leaderboard_after_refreshes_s"] = round(after["query_s"], 4)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    out["repeats"] = args.repeats
    return out


def markdown(out: dict) -> list[str]:
    names = {"leaderboard": "`SELECT * FROM leaderboard`", "category": "Capability x EPS per category, every model"}
    lines = [f"A synthetic lake of {out['models']:,} models (192 images, hps_scores and verdicts rows and "
             "one model_scores row each), written with the lake's own writer. Each query runs in a **fresh process "
             f"that imports only `duckdb`** and opens the catalog read-only (median of {out['repeats']}); "
             "\"old layout\" is the same SQL over views that glob one file per model, as before.", "",
             "| query | old layout s | compacted s | old / new | CPU used by others (new) |", "|---|---|---|---|---|"]
    for name, q in out["queries"].items():
        lines.append(f"| {names.get(name, name)} | {q['old']['query_s']:.2f} | **{q['new']['query_s']:.2f}** | "
                     f"{q['old_over_new']:.0f}x | {q['new'].get('others_cpu_max', 0):.0%} |")
    lines += ["", "`refresh_catalog` (the nightly's last step) on that lake:", "",
              "| models changed since the last refresh | s |", "|---|---|",
              f"| none | {out['refresh_nothing_changed_s']:.2f} |"]
    lines += [f"| {k} | **{v['s']:.2f}** |" for k, v in out["refresh_after_change"].items()]
    lines += [f"| all (`imagebench catalog --full`, once after the upgrade) | {out['refresh_full_s']:.1f} |", "",
              f"The leaderboard right after those refreshes: {out['leaderboard_after_refreshes_s']:.2f} s."]
    return lines


def report(ctx: Context) -> Report:
    """(i): the queries and refreshes on the big lake, then the nightly on it (bench_nightly_lake.py)."""
    import bench_nightly_lake

    res = run(2000 if ctx.quick else 10_000, ctx.work / "lake", os.cpu_count() or 2, 3)
    q = res["queries"]
    worst_refresh = max(v["s"] for v in res["refresh_after_change"].values())
    nl = bench_nightly_lake.run(ctx.work / "nightly-lake", ctx.tiny, ctx.ref_ws, ctx.work / "lake", res["models"], ctx.log,
                                ctx.baseline_src)
    summary = summary_row(
        f"(i) {res['models']:,}-model lake, plain duckdb: leaderboard / per-category query; refresh after 50 changed",
        f"**{q['leaderboard']['new']['query_s']:.2f} s / {q['category']['new']['query_s']:.2f} s** "
        f"({q['leaderboard']['old_over_new']:.0f}x / {q['category']['old_over_new']:.0f}x faster than the old layout); "
        f"**{worst_refresh:.1f} s**; nightly finding 1 new model, {res['models']:,} vs {nl['small_n']}-model lake: "
        f"CPU {nl['cpu_extra_big_s']:+.1f} s, overhead {nl['overhead_big_s']:.1f} s (**{nl['ratio']:.2f}x**)",
        "< 1 s each; < 5 s; <= 10 s, ~1x", ctx.measured)
    return Report({"i": res, "i_nightly": nl}, markdown(res) + [""] + bench_nightly_lake.markdown(nl), summary)


if __name__ == "__main__":
    main()
