"""(f) Start-up: the fixed cost of ``imagebench score`` on the tiny model, before and after.

The fixed cost is everything a command pays whatever the number of images (Python imports, the
embedded Prefect API, building the Great Expectations suites, the golden-set canary, flow
set-up, publishing, the catalog). It is measured as the intercept of the command's wall time
against its number of images: each mode scores one model of ``SMALL`` images and one of all 192
suite prompts (165 through HPSv3), and

    per image = (T_192 - T_small) / (192 - SMALL),   fixed = T_small - SMALL x per image.

Modes, interleaved in every repetition so a busy machine slows all of them alike:

- **before**: the baseline source tree (``--baseline-src``, e.g. ``git archive 48e4bca``), cold;
- **cold**: this tree with ``IMAGEBENCH_WARM=off``: what a command paid before the warm server;
- **warm**: this tree through the warm server (flows/warm.py), already started; the server's own
  start (the first command of a session waits for it) is reported apart.

Each mode has a workspace of its own (the same frozen reference copied in) and each command a
model of its own (a scored model would be "up to date"). The OCR judge is pointed at a missing
Tesseract, as in (e), so judging costs nothing but its planning. The best (shortest) of the
repetitions is used: interference only ever adds time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import PY, REPO, TinyModel, Workspace, run_measured, suite_prompts

SMALL = 24  # images of the small model: EPS-eligible prompts, so each goes through HPSv3
IMAGE_SIDE = 64


def _env(ws: Workspace, src: Path, warm: bool) -> dict[str, str]:
    env = ws.env()
    env.update(PYTHONPATH=str(src), BENCH_SRC=str(src), IMAGEBENCH_TESSERACT="/nonexistent/tesseract",
               IMAGEBENCH_WARM="auto" if warm else "off", IMAGEBENCH_WARM_IDLE_S="1800")
    return env


def _cmd(src: Path, args: list[str]) -> list[str]:
    has_launcher = (src / "flows" / "launch.py").is_file()
    return [PY, "-m", "flows.launch" if has_launcher else "flows.cli", *args]


def _warm_key(src: Path, env: dict[str, str]) -> tuple[str, Path]:
    out = subprocess.run([PY, "-c", "import json,os;from flows import warm;k=warm.server_key(dict(os.environ));"
                          "print(json.dumps([k,str(warm.socket_path(k))]))"],
                         env=env, cwd=src, capture_output=True, text=True, check=True)
    key, path = json.loads(out.stdout)
    return key, Path(path)


def _stop_warm(src: Path, env: dict[str, str]) -> None:
    _key, path = _warm_key(src, env)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        sock.sendall(b'{"op": "stop"}\n')
        sock.recv(100)
    except OSError:
        pass
    finally:
        sock.close()


def _start_warm(src: Path, env: dict[str, str]) -> float:
    """Start the server as the first command would; seconds until it accepts commands."""
    key, path = _warm_key(src, env)
    _stop_warm(src, env)
    t0 = time.perf_counter()
    subprocess.Popen([PY, "-m", "flows.warm_server", key], env=env, cwd=src, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not path.exists():
        if time.perf_counter() - t0 > 300:
            raise RuntimeError("warm server did not start in 300 s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def run(work: Path, quick: bool, log, tiny: TinyModel, ref_ws: Workspace, baseline_src: Path | None) -> dict:
    reps = 1 if quick else 2
    all_ids, eligible, _ = suite_prompts()
    small_ids = eligible[:SMALL]
    modes: dict[str, tuple[Path, bool]] = {"cold": (REPO, False), "warm": (REPO, True)}
    if baseline_src is not None:
        modes = {"before": (baseline_src.resolve(), False), **modes}
    spaces = {m: Workspace.create(work / f"ws-{m}", tiny, reference_from=ref_ws) for m in modes}
    for m, ws in spaces.items():
        for r in range(reps):
            ws.put_model(f"s{r}", small_ids, seed=100 + r, side=IMAGE_SIDE)
            ws.put_model(f"b{r}", all_ids, seed=200 + r, side=IMAGE_SIDE)
    spaces["warm"].put_model("warm-up", small_ids[:1], seed=99, side=IMAGE_SIDE)
    warm_start_s = _start_warm(REPO, _env(spaces["warm"], REPO, True))
    # A session's first warm command also starts the workspace's Prefect API: not timed with the others.
    first = run_measured(_cmd(REPO, ["score", "--model", "warm-up"]), _env(spaces["warm"], REPO, True), cwd=REPO)
    if first.rc != 0:
        raise RuntimeError(f"warm-up score failed:\n{first.stderr[-3000:]}")
    log(f"warm server up in {warm_start_s:.1f}s; first warm command (1 image, starts the Prefect API) {first.wall_s:.1f}s")
    times: dict[str, dict[str, list[float]]] = {m: {"small": [], "big": []} for m in modes}
    others: list[float] = []
    try:
        for r in range(reps):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for size, model in (("small", f"s{r}"), ("big", f"b{r}")):
                for m in order:
                    src, warm = modes[m]
                    res = run_measured(_cmd(src, ["score", "--model", model]), _env(spaces[m], src, warm), cwd=src)
                    if res.rc != 0:
                        raise RuntimeError(f"{m} score {model} failed:\n{res.stderr[-3000:]}")
                    times[m][size].append(res.wall_s)
                    if not warm:  # a warm command's CPU is spent in the server's child: not ours to count
                        others.append(res.others)
                    log(f"rep {r + 1} {m:6s} {size:5s}: {res.wall_s:.1f}s")
    finally:
        _stop_warm(REPO, _env(spaces["warm"], REPO, True))
    out: dict = {"reps": reps, "small_images": SMALL, "big_images": len(all_ids), "warm_start_s": warm_start_s,
                 "warm_first_command_s": first.wall_s,
                 "others_cpu_max": max(others) if others else None, "modes": {}}
    for m in modes:
        t_s, t_b = min(times[m]["small"]), min(times[m]["big"])
        per_image = (t_b - t_s) / (len(all_ids) - SMALL)
        out["modes"][m] = {"t_small": t_s, "t_big": t_b, "per_image_s": per_image, "fixed_s": t_s - SMALL * per_image,
                           "all": times[m]}
    base = out["modes"].get("before") or out["modes"]["cold"]
    for m, v in out["modes"].items():
        v["fixed_ratio"] = v["fixed_s"] / base["fixed_s"] if base["fixed_s"] > 0 else None
    return out


def markdown(res: dict) -> list[str]:
    base_name = "before" if "before" in res["modes"] else "cold"
    lines = [
        f"Fixed cost = intercept of wall time vs images: one model of {res['small_images']} images and one of "
        f"{res['big_images']} per mode and repetition ({res['reps']}; best of), tiny HPSv3 on CPU, OCR judge off. "
        f"Other processes used at most {res['others_cpu_max']:.0%} of the CPU while this ran.",
        "",
        "| mode | command s, " + str(res["small_images"]) + " images | command s, " + str(res["big_images"])
        + " images | per image ms | **fixed s** | fixed / " + base_name + " |",
        "|---|---|---|---|---|---|",
    ]
    names = {"before": "before (baseline tree, cold)", "cold": "now, cold (`IMAGEBENCH_WARM=off`)",
             "warm": "now, warm server"}
    for m, v in res["modes"].items():
        lines.append(f"| {names[m]} | {v['t_small']:.1f} | {v['t_big']:.1f} | {1000 * v['per_image_s']:.1f} | "
                     f"**{v['fixed_s']:.1f}** | **{v['fixed_ratio']:.2f}x** |")
    lines += ["", f"The warm server took {res['warm_start_s']:.1f} s to start (imports, GX suites), and the first "
              f"warm command of the workspace (1 image) {res['warm_first_command_s']:.1f} s, as it also starts the "
              "workspace's Prefect API: a session pays both once; later commands fork from the server and reuse the API."]
    return lines


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-src", type=Path, help="source tree of the baseline commit (git archive)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--work", type=Path, default=REPO / "bench" / "_work" / "startup")
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
