"""(f) Start-up: the fixed cost of ``imagebench score`` on the tiny model, cold and warm.

The fixed cost is everything a command pays whatever the number of images (Python imports, the
embedded Prefect API, building the Great Expectations suites, the golden-set canary, flow
set-up, publishing, the catalog). It is measured as the intercept of the command's wall time
against its number of images: each mode scores one model of ``SMALL`` images and one of all 192
suite prompts (165 through HPSv3), and

    per image = (T_192 - T_small) / (192 - SMALL),   fixed = T_small - SMALL x per image.

Modes, interleaved in every repetition so a busy machine slows all of them alike:

- **before**: the baseline source tree (``--baseline-src``, e.g. ``git archive 48e4bca``), cold;
- **cold**: this tree with ``IMAGEBENCH_WARM=off``: what a command paid before the warm server;
- **warm**: this tree through the warm server (flows/warm.py), already started, with the
  workspace's Prefect API it keeps already up: the following commands of a session.

And, on the small model only, each as a ratio against the cold command of the same repetition:

- **first**: no server running (a new day, after a reboot): the command runs cold and starts the
  server as it ends. The server is then waited for, untimed. Compared with a cold command of its
  own pair (one workspace for both, the two in alternating order, each after a stop and quiet),
  in ``FIRST_REPS`` repetitions; and what it does beyond that cold command (the server's key,
  starting its process) is timed alone.
- **warm, own API**: ``IMAGEBENCH_WARM_KEEP_API=off``: forked from the warm server, but starting
  its own Prefect API as a cold command does. (own API - warm) / cold is the share of the saving
  due to the long-lived Prefect API.

Each mode has a workspace of its own (the same frozen reference copied in) and each command a
model of its own (a scored model would be "up to date"). The OCR judge is pointed at a missing
Tesseract, as in (e), so judging costs nothing but its planning. Fixed costs use the best
(shortest) of the repetitions (interference only ever adds time); ratios are per repetition,
reported as median and range.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import PY, SRC, TinyModel, Workspace, run_measured, suite_prompts
from harness import Context, Report, Spread, round_order, summary_row

SETTLE_S = 10.0  # after stopping a server: its Prefect API shuts down gracefully
FIRST_REPS = 9  # a bound of a few percent needs more pairs than the other ratios
SMALL = 24  # images of the small model: EPS-eligible prompts, so each goes through HPSv3
IMAGE_SIDE = 64


def _env(ws: Workspace, src: Path, warm: bool) -> dict[str, str]:
    env = ws.env()
    # Temporary files, and with them the warm servers' directory ($TMPDIR/imagebench-<uid>), of this
    # bench alone: another user of the machine starting or stopping warm servers never touches ours.
    tmp = ws.root.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env.update(PYTHONPATH=str(src), BENCH_SRC=str(src), IMAGEBENCH_TESSERACT="/nonexistent/tesseract",
               IMAGEBENCH_WARM="auto" if warm else "off", IMAGEBENCH_WARM_IDLE_S="1800",
               # a machine shared with other jobs can take minutes to start an API: time it, do not fail
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="900")
    return env


def _cmd(src: Path, args: list[str]) -> list[str]:
    has_launcher = (src / "flows" / "launch.py").is_file()
    return [PY, "-m", "flows.launch" if has_launcher else "flows.cli", *args]


def _warm(src: Path, env: dict[str, str], what: str) -> dict | None:
    """``stop`` or ``ping`` the server of this environment, as `imagebench warm` does (its cookie)."""
    out = subprocess.run([PY, "-c", "import json,os,sys;from flows import warm;k=warm.server_key(dict(os.environ));"
                          f"p=warm.socket_path(k);print(json.dumps(warm.stop(p) if {what!r}=='stop' else warm._ask(p,'ping')))"],
                         env=env, cwd=src, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _wait_ready(src: Path, env: dict[str, str], timeout_s: float = 600.0) -> float:
    t0 = time.perf_counter()
    while not (_warm(src, env, "ping") or {}).get("pid"):
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"warm server not ready in {timeout_s:.0f} s")
        time.sleep(0.2)
    return time.perf_counter() - t0


# What the first command does beyond a cold one, timed in a process that has imported what a cold
# `score` has when it ends: the server's key (the code's digest) and starting the server's process
# (which waits for this one to end, flows/warm_server.py --after: killed here before it would).
_LAUNCH_PROBE = r"""
import json, os, signal, sys, time
import flows.cli, flows.pipeline, tasks.hpsv3.scorer
from flows import launch, warm
env = dict(os.environ)
out = {"key_s": [], "start_s": []}
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    key = warm.server_key(env)
    t1 = time.perf_counter()
    pid = launch._start_server(key, env)
    t2 = time.perf_counter()
    out["key_s"].append(t1 - t0)
    out["start_s"].append(t2 - t1)
    os.killpg(pid, signal.SIGKILL)  # its own session: the process and anything it forked
    os.waitpid(pid, 0)
print(json.dumps(out))
"""


def _launcher_extra(env: dict[str, str], work: Path, n: int = 20) -> dict:
    probe_tmp = work / "probe-tmp"  # a warm-server directory of its own: no real server is touched
    probe_tmp.mkdir(exist_ok=True)
    out = subprocess.run([PY, "-c", _LAUNCH_PROBE, str(n)], env={**env, "TMPDIR": str(probe_tmp)}, cwd=SRC,
                         capture_output=True, text=True, check=True, timeout=600)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: _spread(v) for k, v in res.items()}


def _score_untimed(ws: Workspace, env: dict[str, str], model: str, prompt_ids: list[str], seed: int, why: str) -> None:
    """Put a model into ``ws`` and score it, for its side effect (a workspace set up, a server
    started, an API up), not its time."""
    ws.put_model(model, prompt_ids, seed=seed, side=IMAGE_SIDE)
    res = run_measured(_cmd(SRC, ["score", "--model", model]), env, cwd=SRC)
    if res.rc != 0:
        raise RuntimeError(f"{why}: score {model} failed:\n{res.stderr[-3000:]}")


def _spread(values: list[float]) -> dict:
    return Spread.of(values).as_dict()


def run(work: Path, quick: bool, log, tiny: TinyModel, ref_ws: Workspace, baseline_src: Path | None) -> dict:
    reps = 2 if quick else 3
    first_reps = 2 if quick else FIRST_REPS  # rounds of the first command against a cold one
    big_reps = 1 if quick else reps  # the 192-image commands only serve the intercept
    all_ids, eligible, _ = suite_prompts()
    small_ids = eligible[:SMALL]
    modes: dict[str, tuple[Path, bool]] = {"cold": (SRC, False), "warm": (SRC, True)}
    if baseline_src is not None:
        modes = {"before": (baseline_src.resolve(), False), **modes}
    spaces = {m: Workspace.create(work / f"ws-{m}", tiny, reference_from=ref_ws) for m in modes}
    # The first command and the cold one it is compared with score in one workspace of their own, in
    # turn: each sees the same lake (one model apart), not the warm one's, which grows faster.
    pair = Workspace.create(work / "ws-pair", tiny, reference_from=ref_ws)
    for r in range(first_reps):
        pair.put_model(f"first{r}", small_ids, seed=300 + r, side=IMAGE_SIDE)
        pair.put_model(f"pc{r}", small_ids, seed=500 + r, side=IMAGE_SIDE)
    # The first command in a workspace also creates its Prefect database and lake: untimed, so that
    # neither timed command of the first pair pays it (it made round 0 read 0.67x).
    _score_untimed(pair, _env(pair, SRC, False), "pair-setup", small_ids[:1], 600, "setting up the pair's workspace")
    for m, ws in spaces.items():
        for r in range(reps):
            ws.put_model(f"s{r}", small_ids, seed=100 + r, side=IMAGE_SIDE)
            if r < big_reps:
                ws.put_model(f"b{r}", all_ids, seed=200 + r, side=IMAGE_SIDE)
            if m == "warm":
                ws.put_model(f"own{r}", small_ids, seed=400 + r, side=IMAGE_SIDE)
    warm_env = _env(spaces["warm"], SRC, True)
    _warm(SRC, warm_env, "stop")
    times: dict[str, dict[str, list[float]]] = {m: {"small": [], "big": []} for m in [*modes, "first", "pair-cold", "own-api"]}
    ready_s: list[float] = []
    others: list[float] = []

    def measure(m: str, size: str, model: str, env: dict[str, str], src: Path) -> None:
        res = run_measured(_cmd(src, ["score", "--model", model]), env, cwd=src)
        if res.rc != 0:
            raise RuntimeError(f"{m} score {model} failed:\n{res.stderr[-3000:]}")
        times[m][size].append(res.wall_s)
        if env.get("IMAGEBENCH_WARM") == "off" or m == "first":  # others' CPU while a timed cold or first ran
            others.append(res.others)
        log(f"{m:8s} {size:5s} {model}: {res.wall_s:.1f}s")

    def quiet() -> None:
        """A new day: no server (the stopped one's Prefect API ends within seconds: let it)."""
        _warm(SRC, warm_env, "stop")
        time.sleep(SETTLE_S)

    def first_and_cold(r: int, with_server: bool) -> None:
        """The first command of a session and a cold one, each on a quiet machine with no server of
        ours, in alternating order (the cold one's run never follows the other's teardown in every
        round). Leaves the server of the first command running when ``with_server``."""
        for m in round_order(["pair-cold", "first"], r, "alternate"):
            quiet()
            if m == "pair-cold":
                measure("pair-cold", "small", f"pc{r}", _env(pair, SRC, False), SRC)
            else:
                measure("first", "small", f"first{r}", _env(pair, SRC, True), SRC)
                ready_s.append(_wait_ready(SRC, warm_env))  # the same server (the key has no workspace)
        if with_server and not (_warm(SRC, warm_env, "ping") or {}).get("pid"):
            # the cold one ran last, after the server was stopped: start it again, untimed
            _score_untimed(spaces["warm"], warm_env, f"restart{r}", small_ids[:1], 80 + r, "restarting the server")
            _wait_ready(SRC, warm_env)

    try:
        for r in range(reps):
            first_and_cold(r, with_server=True)
            # The workspace's Prefect API, started by the first warm command of this server: untimed.
            _score_untimed(spaces["warm"], warm_env, f"api-up{r}", small_ids[:1], 90 + r, "starting the API")
            order = round_order(list(modes), r, "alternate")
            for m in order:
                src, warm = modes[m]
                measure(m, "small", f"s{r}", _env(spaces[m], src, warm), src)
            if r < big_reps:
                for m in order:
                    src, warm = modes[m]
                    measure(m, "big", f"b{r}", _env(spaces[m], src, warm), src)
            measure("own-api", "small", f"own{r}", {**warm_env, "IMAGEBENCH_WARM_KEEP_API": "off"}, SRC)
        for r in range(reps, first_reps):  # more pairs: the first command's bound is a few percent
            first_and_cold(r, with_server=False)
        launcher = _launcher_extra(warm_env, work)
    finally:
        _warm(SRC, warm_env, "stop")
    out: dict = {"quick": quick, "reps": reps, "first_reps": first_reps, "big_reps": big_reps, "small_images": SMALL, "big_images": len(all_ids),
                 "server_ready_after_first_s": _spread(ready_s), "launcher_extra": launcher,
                 "others_cpu_max": max(others) if others else None, "modes": {}, "ratios": {}}
    for m in modes:
        t_s, t_b = min(times[m]["small"]), min(times[m]["big"])
        per_image = (t_b - t_s) / (len(all_ids) - SMALL)
        out["modes"][m] = {"t_small": t_s, "t_big": t_b, "per_image_s": per_image, "fixed_s": t_s - SMALL * per_image,
                           "all": times[m]}
    base = out["modes"].get("before") or out["modes"]["cold"]
    for m, v in out["modes"].items():
        v["fixed_ratio"] = v["fixed_s"] / base["fixed_s"] if base["fixed_s"] > 0 else None
    cold = times["cold"]["small"]
    pair_cold = times["pair-cold"]["small"]
    out["ratios"]["first"] = {**_spread([t / c for t, c in zip(times["first"]["small"], pair_cold)]),
                              "seconds": times["first"]["small"], "cold_seconds": pair_cold}
    for m in ("warm", "own-api"):
        out["ratios"][m] = {**_spread([t / c for t, c in zip(times[m]["small"], cold)]), "seconds": times[m]["small"]}
    out["ratios"]["api_share"] = _spread([(o - w) / c for o, w, c in zip(times["own-api"]["small"], times["warm"]["small"], cold)])
    out["cold_small_s"] = cold
    return out


def _ratio(r: dict) -> str:
    return Spread(r["median"], r["min"], r["max"], r["n"]).fmt()


def markdown(res: dict) -> list[str]:
    base_name = "before" if "before" in res["modes"] else "cold"
    other = f"{res['others_cpu_max']:.0%}" if res["others_cpu_max"] is not None else "an unknown share"
    lines = [
        f"Fixed cost = intercept of wall time vs images: one model of {res['small_images']} images and one of "
        f"{res['big_images']} per mode ({res['reps']} repetitions of the small one, {res['big_reps']} of the big one; "
        f"best of), tiny HPSv3 on CPU, OCR judge off. Other processes used at most {other} of the CPU while this ran."
        + (" Quick mode: a full run (3 repetitions of each) did not fit on this machine, shared with other jobs."
           if res.get("quick") else ""),
        "",
        "| mode | command s, " + str(res["small_images"]) + " images | command s, " + str(res["big_images"])
        + " images | per image ms | **fixed s** | fixed / " + base_name + " |",
        "|---|---|---|---|---|---|",
    ]
    names = {"before": "before (baseline tree, cold)", "cold": "now, cold (`IMAGEBENCH_WARM=off`)",
             "warm": "now, warm server (its Prefect API up)"}
    for m, v in res["modes"].items():
        lines.append(f"| {names[m]} | {v['t_small']:.1f} | {v['t_big']:.1f} | {1000 * v['per_image_s']:.1f} | "
                     f"**{v['fixed_s']:.1f}** | **{v['fixed_ratio']:.2f}x** |")
    r = res["ratios"]
    cold = res["cold_small_s"]
    lines += [
        "",
        f"Each command of {res['small_images']} images against a cold one of the same repetition; median (range) "
        f"over the repetitions. The first command: {res['first_reps']} repetitions, against a cold command in the "
        f"same workspace (cold: {', '.join(f'{t:.1f}' for t in r['first']['cold_seconds'])} s), the two in "
        f"alternating order, each after the server was stopped and {SETTLE_S:.0f} s of quiet. The others: "
        f"{res['reps']} repetitions, against the cold mode above (cold: {', '.join(f'{t:.1f}' for t in cold)} s):",
        "",
        "| command | seconds | / cold |",
        "|---|---|---|",
        f"| first of a session: no server yet (runs cold, starts the server as it ends) | "
        f"{', '.join(f'{t:.1f}' for t in r['first']['seconds'])} | {_ratio(r['first'])} |",
        f"| following: warm server, its Prefect API up | {', '.join(f'{t:.1f}' for t in r['warm']['seconds'])} | "
        f"{_ratio(r['warm'])} |",
        f"| warm server, own Prefect API (`IMAGEBENCH_WARM_KEEP_API=off`) | "
        f"{', '.join(f'{t:.1f}' for t in r['own-api']['seconds'])} | {_ratio(r['own-api'])} |",
        f"| share due to the long-lived Prefect API: (own API - following) / cold | | {_ratio(r['api_share'])} |",
        "",
    ]
    if res.get("launcher_extra"):
        ex = res["launcher_extra"]
        extra_s = ex["key_s"]["median"] + ex["start_s"]["median"]
        lines += [
            f"What the first command does beyond a cold one, timed alone ({ex['key_s']['n']} times, in a process "
            f"holding what a cold `score` has imported when it ends): the server's key {1000 * ex['key_s']['median']:.1f} ms "
            f"and starting the server's process {1000 * ex['start_s']['median']:.1f} ms (medians), "
            f"**{extra_s / statistics.median(r['first']['cold_seconds']):.2%}** of a cold command. The server then waits for the first "
            "command's process to end before it does anything else.",
            "",
        ]
    lines += [
        f"After the first command, the server was ready {res['server_ready_after_first_s']['median']:.1f} s later "
        f"(median; {res['server_ready_after_first_s']['min']:.1f}-{res['server_ready_after_first_s']['max']:.1f}): it "
        "starts once the first command's process has ended (a command meanwhile runs cold) and imports at nice 10. "
        "Started beside the first command instead, its imports made that command 1.25x-1.9x a cold one here (two "
        "runs under load); started as the command ended but before its process had, 0.92x-1.07x (three rounds). "
        "The first warm command of a workspace also starts that workspace's Prefect API (untimed here); the "
        "following ones fork from the server and reuse the API.",
    ]
    return lines


def report(ctx: Context) -> Report:
    res = run(ctx.work, ctx.quick, ctx.log, ctx.tiny, ctx.ref_ws, ctx.baseline_src)
    base = "before" if "before" in res["modes"] else "cold"
    w, c, r = res["modes"]["warm"], res["modes"]["cold"], res["ratios"]
    summary = summary_row(
        f"(f) `imagebench score` (tiny model), warm / cold: first command of a session "
        f"**{r['first']['median']:.2f}x**, following **{r['warm']['median']:.2f}x** (long-lived Prefect API: "
        f"{r['api_share']['median']:.2f} of cold); fixed cost now / {base}: warm {w['fixed_ratio']:.2f}x "
        f"({res['modes'][base]['fixed_s']:.1f} -> {w['fixed_s']:.1f} s), cold {c['fixed_ratio']:.2f}x",
        "first <= 1, following <= 0.25", ctx.measured)
    return Report({"f": res}, markdown(res), summary)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-src", type=Path, help="source tree of the baseline commit (git archive)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--work", type=Path, default=Path(__file__).resolve().parent / "_work" / "startup")
    a = p.parse_args()
    from bench_e2e import build_reference_workspace

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if a.work.exists():
        shutil.rmtree(a.work)
    a.work.mkdir(parents=True)
    tiny = TinyModel.write(a.work / "tiny")
    ref_ws = build_reference_workspace(a.work / "ref", tiny, log, baseline=("base-a",))
    res = run(a.work, a.quick, log, tiny, ref_ws, a.baseline_src)
    print(json.dumps(res, indent=1))
    print("\n".join(markdown(res)))


if __name__ == "__main__":
    main()
