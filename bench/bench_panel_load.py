"""(j) The judging panel under load: N judges at once (default 100, the next round's panel), each
answering a whole Beauty Index study (2 tools x 10 prompts = 20 images), on SQLite and on
PostgreSQL. Reports the answer latency (POST /answer until its 303) per store, p50/p95/p99, and
checks that no answer is lost or doubled.

    .venv/bin/python bench/run_bench.py --only j       # writes section (j) of bench/RESULTS.md
    .venv/bin/python bench/bench_panel_load.py [--judges 100] [--json]   # print only

The server is the real `imagebench panel serve` in its own process (uvicorn, one worker), the
judges are threads of this process with one HTTP client each, no think time (the worst case: every
judge clicks the moment the page arrives). PostgreSQL is a throwaway cluster of Debian's server
(tests/pgserver.py) with fsync on, on loopback; SQLite is the study's own panel.sqlite (WAL,
synchronous=FULL). Both stores run one after the other on the same machine, so their ratio is the
comparable number; absolute milliseconds move with whatever else the machine does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import Context, Report

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STUDY = "load"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, int(round(q / 100 * len(ys) + 0.5)) - 1))] if ys else float("nan")


def _workspace(home: Path, judges: int):
    from schemas.settings import load_settings
    from tests.panel.conftest import TOOLS, beauty_prompt_ids, write_study, write_tool_images

    for tool in TOOLS:
        write_tool_images(home / "objects", tool, beauty_prompt_ids())
    settings = load_settings(home=home, reference_dir=REPO / "reference", store=str(home / "objects"))
    write_study(settings, STUDY, [(f"j{i:03d}", "photographers") for i in range(judges)], memo=False)
    return settings


def run_store(name: str, judges: int, work: Path, database: str | None) -> dict:
    """Open a study of ``judges`` judges in the store, serve it, let every judge answer everything."""
    import httpx

    from tasks.beauty.study import open_study
    from tasks.beauty.store import PanelStore

    home = work / name
    settings = _workspace(home, judges)
    if database:
        settings = settings.model_copy(update={"panel_database": database})
    opened = open_study(settings, STUDY)
    port = _free_port()
    env = dict(os.environ, IMAGEBENCH_HOME=str(home), IMAGEBENCH_REFERENCE_DIR=str(REPO / "reference"),
               IMAGEBENCH_STORE=str(home / "objects"), IMAGEBENCH_WARM="off", PYTHONPATH=str(REPO))
    env.pop("IMAGEBENCH_PANEL_DATABASE", None)
    if database:
        env["IMAGEBENCH_PANEL_DATABASE"] = database
    server = subprocess.Popen([sys.executable, "-c", "from flows.launch import main; main()", "panel", "serve", STUDY,
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(url + "/", timeout=2)
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"panel server for {name} did not start") from None
                time.sleep(0.2)
        latencies: list[float] = []
        codes: dict[str, int] = {}  # "GET 200", "POST 303", "POST 503", "POST reset", ...
        confirmed: set[tuple[str, int]] = set()  # answers the server said it recorded (303)
        errors: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(judges)

        def judge(label: str, token: str) -> None:
            """Like a person: on an error page or a dropped connection, wait a moment and reload
            (and a browser resends a POST whose connection was reset: the store makes that safe)."""
            mine, got, ok = [], {}, set()
            retries = 0

            def send(method: str, path: str, **kw):
                nonlocal retries
                while True:
                    try:
                        t0 = time.perf_counter()
                        r = c.request(method, path, **kw)
                        took = time.perf_counter() - t0
                        key = f"{method} {r.status_code}"
                    except httpx.TransportError as exc:
                        r, took, key = None, None, f"{method} {type(exc).__name__}"
                    got[key] = got.get(key, 0) + 1
                    if r is not None and r.status_code < 400:
                        return r, took
                    retries += 1
                    if retries > 200:
                        raise RuntimeError(f"gave up after 200 retries (last: {key})")
                    time.sleep(0.5)

            try:
                with httpx.Client(base_url=url, follow_redirects=False, timeout=300) as c:
                    send("GET", f"/j/{token}")
                    start.wait()
                    while True:
                        page, _ = send("GET", "/judge")
                        m = re.search(r'name="position" value="(\d+)"', page.text)
                        if m is None:
                            break  # "Thank you": every image answered
                        img = re.search(r'name="image_id" value="([^"]+)"', page.text).group(1)
                        r, took = send("POST", "/answer", data={"position": m.group(1), "image_id": img, "answer": "yes"})
                        mine.append(took)
                        if r.status_code == 303:
                            ok.add((label, int(m.group(1))))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{label}: {exc!r}")
            with lock:
                latencies.extend(mine)
                confirmed.update(ok)
                for k, v in got.items():
                    codes[k] = codes.get(k, 0) + v

        threads = [threading.Thread(target=judge, args=item) for item in opened.judge_tokens.items()]
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()[0]
    finally:
        server.terminate()
        server.wait(timeout=30)
    store = PanelStore.open(opened.study_dir, database=database)
    try:
        rows = store.answers_table("bench").to_pylist()
        expected = sum(p["total"] for p in store.judge_progress())
    finally:
        store.dispose()
    from schemas.study import salted_judge_id

    recorded = {(r["judge_id"], r["position"]) for r in rows}
    lost = sum((salted_judge_id("bench", label), pos) not in recorded for label, pos in confirmed)
    ms = [x * 1000 for x in latencies]
    return {"store": name, "judges": judges, "answers_expected": expected, "answers_recorded": len(rows),
            "confirmed": len(confirmed), "lost": lost, "doubled": len(rows) - len(recorded), "posts": len(ms), "codes": codes,
            "errors": errors[:5], "n_errors": len(errors), "load_1min": (load_before, load_after), "wall_s": wall, "answers_per_s": len(rows) / wall,
            "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95), "p99_ms": _pct(ms, 99), "max_ms": max(ms) if ms else None}


def run(judges: int, work: Path) -> dict:
    from tests.pgserver import start_pg

    work.mkdir(parents=True, exist_ok=True)
    out = {"judges": judges, "stores": {}}
    out["stores"]["sqlite"] = run_store("sqlite", judges, work, None)
    pg = start_pg(max_connections=200, fsync=True)
    try:
        db = pg.new_database("bench")
        out["stores"]["postgres"] = run_store("postgres", judges, work, pg.url(db))
        out["postgres_version"] = pg.bindir.parts[-2]
    finally:
        pg.stop()
    s, p = out["stores"]["sqlite"], out["stores"]["postgres"]
    out["p99_ratio_pg_over_sqlite"] = p["p99_ms"] / s["p99_ms"]
    out["ok"] = all(r["lost"] == 0 and r["doubled"] == 0 and r["n_errors"] == 0 and r["answers_recorded"] == r["answers_expected"]
                    for r in (s, p))
    return out


def markdown(res: dict) -> list[str]:
    rows = ["| store | answers recorded / expected | lost | doubled | responses (retried: >= 400, resets) | answers/s | p50 | p95 | **p99** | max | load avg before / after |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["stores"].items():
        label = "SQLite (WAL, synchronous=FULL)" if name == "sqlite" else f"PostgreSQL {res.get('postgres_version', '')} (fsync on)"
        codes = ", ".join(f"{k}: {v:,}" for k, v in sorted(r["codes"].items())) + (f"; {r['n_errors']} judges gave up" if r["n_errors"] else "")
        rows.append(f"| {label} | {r['answers_recorded']:,} / {r['answers_expected']:,} | {r['lost']} | {r['doubled']} | {codes} | "
                    f"{r['answers_per_s']:.0f} | {r['p50_ms']:.0f} ms | {r['p95_ms']:.0f} ms | **{r['p99_ms']:.0f} ms** | {r['max_ms']:.0f} ms | "
                    f"{r['load_1min'][0]:.1f} / {r['load_1min'][1]:.1f} |")
    return [
        f"{res['judges']} judges at once, each answering a whole study (20 images: 2 tools x 10 prompts), no think time, "
        "against the real `imagebench panel serve` (one uvicorn process) on loopback; latency = one POST /answer until its "
        "303, measured by the judge's HTTP client (`bench/bench_panel_load.py`). A judge who gets an error page or a "
        "dropped connection waits 0.5 s and reloads (a POST is resent: the store records it once); those responses are "
        "counted below. Lost = a 303 whose answer is not in the store; doubled = an answer stored twice.",
        "",
        *rows,
        "",
        f"PostgreSQL p99 / SQLite p99: **{res['p99_ratio_pg_over_sqlite']:.2f}x**. "
        f"No answer lost or doubled on either store: **{res['ok']}**. With no think time every judge has a request in "
        "flight at every moment, so the latency is mostly queueing behind the other judges in the one server "
        "process (a real judge looks at each image for seconds); the same run on the same machine gives the ratio. "
        "The last column is the machine's 1-minute load average around each store's run: above the core count, other "
        "work shared the CPU and both latencies (and their ratio) move with it.",
    ]


def summary(res: dict, date: str, mode: str) -> str:
    s, p = res["stores"]["sqlite"], res["stores"]["postgres"]
    return (f"| (j) panel: p99 answer latency, {res['judges']} judges at once, PostgreSQL / SQLite | "
            f"**{res['p99_ratio_pg_over_sqlite']:.2f}x** ({p['p99_ms']:.0f} / {s['p99_ms']:.0f} ms); lost/doubled "
            f"{p['lost'] + s['lost']}/{p['doubled'] + s['doubled']} | none lost or doubled; latency reported | {date}, {mode} |")


def report(ctx: Context) -> Report:
    res = run(20 if ctx.quick else 100, ctx.work / "panel")
    return Report({"j": res}, markdown(res), summary(res, ctx.date, ctx.mode))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judges", type=int, default=100)
    ap.add_argument("--json", action="store_true", help="print every number as JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-panel-") as tmp:
        res = run(args.judges, Path(tmp))
    print(json.dumps(res, indent=1) if args.json else "\n".join(markdown(res)))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
