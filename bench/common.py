"""Shared helpers for the benchmarks: machine description, deterministic images, temporary
imagebench workspaces (tiny HPSv3 model, pinned suite, frozen reference), and running a command
in a subprocess while measuring its wall time and peak memory.

Nothing here asserts on time: every number the benchmarks report is a ratio of two measurements
taken in the same run, on the same machine, so a busy machine moves both sides together.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import platform
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
# The imagebench code under test: this checkout, or another tree given by BENCH_SRC (run_bench.py
# --src), e.g. a `git archive` of a commit while the working tree is mid-edit.
SRC = Path(os.environ.get("BENCH_SRC") or REPO).resolve()
SUITE_FILE = SRC / "reference" / "suite-imagebench-v1.jsonl"
PY = sys.executable
REFERENCE_VERSION = "bench"

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


# --------------------------------------------------------------------------------------------
# Machine description
# --------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001 - a missing package is reported, not fatal
        return f"not importable ({type(exc).__name__})"


def source_info() -> str:
    """Commit of the code under test, and whether its tree has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=SRC, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!bench"], cwd=SRC, capture_output=True,
                               text=True, check=True).stdout.strip()
        return f"{head}" + (" + uncommitted changes outside bench/" if dirty else " (clean outside bench/)")
    except (OSError, subprocess.CalledProcessError):
        return f"{SRC} (not a git checkout)"


def machine_info() -> dict[str, str]:
    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    mem = _mem_total_gib()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    import torch

    return {
        "date (UTC)": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "cpu": _cpu_model(),
        "cores": f"{cores} logical ({usable} usable by this process); torch intra-op threads {torch.get_num_threads()}",
        "memory": f"{mem:.1f} GiB" if mem else "unknown",
        "gpu": ("CUDA: " + torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "none (CPU only)",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "pillow": _version("PIL"),
        "numpy": np.__version__,
        "prefect": _version("prefect"),
        "load average at start": " ".join(f"{x:.2f}" for x in load) if load else "unknown",
    }


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------


def make_image(seed: int, width: int, height: int) -> Image.Image:
    """Deterministic RGB image: a smooth colour gradient plus seeded noise (photo-like enough to
    exercise decode and resampling; not a flat image that compresses to nothing)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, size=3).astype(np.float32)
    gx, gy = rng.uniform(-0.3, 0.3, size=2) * 3 * 255.0 / max(width, height)
    ramp = (gx * np.arange(width, dtype=np.float32))[None, :] + (gy * np.arange(height, dtype=np.float32))[:, None]
    arr = rng.standard_normal((height, width, 3), dtype=np.float32)
    arr *= 18.0
    arr += ramp[..., None]
    arr += base
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def image_bytes(seed: int, width: int, height: int, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img = make_image(seed, width, height)
    if fmt == "JPEG":
        img.save(buf, format="JPEG", quality=90)
    elif fmt == "PNG":
        img.save(buf, format="PNG", compress_level=1)  # fast to write; decoding costs about the same
    else:
        img.save(buf, format=fmt)
    return buf.getvalue()


def suite_prompts() -> tuple[list[str], list[str], dict[str, str]]:
    """(all prompt ids, EPS-eligible prompt ids, prompt id -> prompt text) of the v1 suite."""
    from tasks.scores.suite import load_suite

    suite = load_suite(SUITE_FILE)
    ids = [p.prompt_id for p in suite.prompts]
    return ids, list(suite.eligible_ids), {p.prompt_id: p.prompt for p in suite.prompts}


# --------------------------------------------------------------------------------------------
# Workspaces
# --------------------------------------------------------------------------------------------


@dataclass
class TinyModel:
    base: Path
    checkpoint: Path

    @classmethod
    def write(cls, root: Path) -> "TinyModel":
        from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

        base, ckpt = root / "tiny-base", root / "HPSv3-tiny.safetensors"
        if not (base / "config.json").is_file() or not ckpt.is_file():
            write_tiny_base_model(base)
            write_tiny_checkpoint(base, ckpt, seed=0)
        return cls(base, ckpt)


@dataclass
class Workspace:
    """A fresh IMAGEBENCH_HOME + reference dir (suite copied and pinned) using the tiny model."""

    root: Path
    tiny: TinyModel
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def refdir(self) -> Path:
        return self.root / "reference"

    @property
    def objects(self) -> Path:
        return self.home / "objects"

    @classmethod
    def create(cls, root: Path, tiny: TinyModel, reference_from: "Workspace | None" = None) -> "Workspace":
        """New workspace. ``reference_from``: copy that workspace's reference dir (suite, frozen
        reference, SHA256SUMS) instead of pinning a fresh suite, so no reference build is needed."""
        from tasks.scores.reference import pin_suite

        if root.exists():
            shutil.rmtree(root)
        ws = cls(root, tiny)
        ws.home.mkdir(parents=True)
        if reference_from is not None:
            shutil.copytree(reference_from.refdir, ws.refdir)
        else:
            # As tests/flows/conftest.py: the suite and (where this code has judges) the judge
            # routing, copied and pinned in the workspace's own SHA256SUMS.
            ws.refdir.mkdir(parents=True)
            for src in [SUITE_FILE, *sorted(SUITE_FILE.parent.glob("judges-routing-v*.yaml"))]:
                shutil.copyfile(src, ws.refdir / src.name)
                pin_suite(ws.refdir, ws.refdir / src.name)
            try:
                from tasks.scores.golden import copy_golden_set  # since issue 8: a new reference stores the golden mu
            except ImportError:  # an older source tree (--src) without the canary
                copy_golden_set = None
            if copy_golden_set is not None:
                copy_golden_set(SUITE_FILE.parent, ws.refdir)
        return ws

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("IMAGEBENCH_", "PREFECT_", "AWS_")) and k not in ("HF_HUB_OFFLINE",)
        }
        env.update(
            {
                "IMAGEBENCH_HOME": str(self.home),
                "IMAGEBENCH_REFERENCE_DIR": str(self.refdir),
                "IMAGEBENCH_REFERENCE_VERSION": REFERENCE_VERSION,
                "IMAGEBENCH_HPSV3_BASE_MODEL": str(self.tiny.base),
                "IMAGEBENCH_HPSV3_CHECKPOINT": str(self.tiny.checkpoint),
                "IMAGEBENCH_DEVICE": "cpu",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING",
                "GX_ANALYTICS_ENABLED": "false",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": str(SRC),  # ahead of the editable install's finder
                "BENCH_SRC": str(SRC),
                "COLUMNS": "160",
                # Cold, as (a)-(e) always measured; (f) measures the warm server against this.
                "IMAGEBENCH_WARM": "off",
            }
        )
        env.update(self.env_extra)
        return env

    def put_model(self, model_id: str, prompt_ids: list[str], seed: int, side: int = 128) -> int:
        """Write ``models/<model_id>/<prompt_id>.png`` for each prompt; returns bytes written."""
        d = self.objects / "models" / model_id
        d.mkdir(parents=True, exist_ok=True)
        total = 0
        for i, pid in enumerate(prompt_ids):
            data = image_bytes(seed * 10_000 + i, side, side)
            (d / f"{pid}.png").write_bytes(data)
            total += len(data)
        return total

    def prefect_db(self) -> Path:
        return self.home / "prefect" / "prefect.db"


# --------------------------------------------------------------------------------------------
# Running a command: wall time and peak memory
# --------------------------------------------------------------------------------------------


@dataclass
class ProcPeak:
    pid: int
    cmd: str
    hwm_kib: int  # VmHWM: the process's own peak resident set


@dataclass
class RunResult:
    cmd: list[str]
    rc: int
    wall_s: float
    # wait4() ru_maxrss. NOT used as the child's peak: Linux carries the high-water mark of the mm the
    # child was forked/vforked from (this benchmark process) across exec, so it includes our memory.
    maxrss_kib: int
    tree_peak_kib: int  # peak of the summed VmRSS of the process tree, sampled
    cpu_s: float  # user + sys of the child and its reaped descendants (wait4)
    processes: list[ProcPeak]
    stdout: str
    stderr: str
    others: float = 0.0  # share of the machine's CPU used by other processes meanwhile (CpuMeter)
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s since start, main VmRSS KiB)
    self_hwm_kib: int | None = None  # VmHWM the process wrote itself at exit (peak_exec.py)

    def check(self) -> "RunResult":
        if self.rc != 0:
            raise RuntimeError(
                f"command failed (rc={self.rc}): {' '.join(self.cmd)}\n--- stdout ---\n{self.stdout[-4000:]}"
                f"\n--- stderr ---\n{self.stderr[-6000:]}"
            )
        return self

    def main_hwm_kib(self) -> int:
        """Peak RSS of the main process alone: the VmHWM it reported at exit (peak_exec.py) when
        available, else its VmHWM sampled from /proc while it ran."""
        sampled = self.processes[0].hwm_kib if self.processes else 0
        return max(sampled, self.self_hwm_kib or 0)

    def rss_profile(self, buckets: int = 5) -> list[int]:
        """Max main-process RSS (KiB) in each of ``buckets`` equal slices of the run's duration."""
        if not self.timeline:
            return []
        end = self.timeline[-1][0] or 1.0
        out = [0] * buckets
        for t, rss in self.timeline:
            k = min(buckets - 1, int(buckets * t / end))
            out[k] = max(out[k], rss)
        return out


def _proc_status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def _children_of(root: int) -> list[int]:
    """Descendants of ``root`` (scanning /proc/*/stat for the parent pid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents[int(entry)] = ppid
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [root]
    while frontier:
        nxt = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += nxt
        frontier = nxt
    return found


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return raw[:160]


def _kib(text: str | None) -> int:
    return int(text.split()[0]) if text else 0


def run_measured(cmd: list[str], env: dict[str, str], cwd: Path = SRC, timeout: float = 900,
                 sample_s: float = 0.1) -> RunResult:
    """Run ``cmd``; wall time, wait4() max RSS of that child, and the per-process VmHWM and summed
    RSS of its process tree sampled every ``sample_s`` (Prefect may start helper processes)."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"{out_path}.out", "w+") as fo, open(f"{out_path}.err", "w+") as fe:
        meter = CpuMeter()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        peaks: dict[int, ProcPeak] = {}
        tree_peak = [0]
        timeline: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            n = 0
            while not stop.is_set():
                pids = [proc.pid] + (_children_of(proc.pid) if n % 5 == 0 or len(peaks) > 1 else [p for p in peaks if p != proc.pid])
                total = 0
                for pid in pids:
                    st = _proc_status(pid)
                    if not st:
                        continue
                    total += _kib(st.get("VmRSS"))
                    if pid == proc.pid:
                        timeline.append((time.perf_counter() - t0, _kib(st.get("VmRSS"))))
                    hwm = _kib(st.get("VmHWM"))
                    if pid not in peaks:
                        peaks[pid] = ProcPeak(pid, _cmdline(pid), hwm)
                    elif hwm > peaks[pid].hwm_kib:
                        peaks[pid].hwm_kib = hwm
                tree_peak[0] = max(tree_peak[0], total)
                n += 1
                stop.wait(sample_s)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        deadline = t0 + timeout
        rusage = None
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        stdout, stderr = fo.read(), fe.read()
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink(missing_ok=True)
    ordered = sorted(peaks.values(), key=lambda p: (p.pid != proc.pid, -p.hwm_kib))
    cpu = (rusage.ru_utime + rusage.ru_stime) if rusage else float("nan")
    others = meter.others(own_cpu_s=cpu + (_own_cpu_s() - meter.own0))  # the child + our sampler thread
    return RunResult(
        cmd, proc.returncode, wall, rusage.ru_maxrss if rusage else 0, tree_peak[0], cpu, ordered, stdout, stderr,
        others, timeline,
    )


def run_imagebench(args: list[str], env: dict[str, str], timeout: float = 1800) -> RunResult:
    """``imagebench ARGS`` (the console script's entry point, via bench/peak_exec.py so the process
    reports its own peak RSS at exit), measured with :func:`run_measured`."""
    fd, tmp = tempfile.mkstemp(prefix="bench-peak-", suffix=".json")
    os.close(fd)
    try:
        res = run_measured([PY, str(BENCH / "peak_exec.py"), tmp, "imagebench", *args], env, timeout=timeout)
        try:
            res.self_hwm_kib = json.loads(Path(tmp).read_text()).get("VmHWM")
        except (OSError, ValueError):
            res.self_hwm_kib = None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return res


# --------------------------------------------------------------------------------------------
# Prefect task timings (the HPSv3 stage of a flow run, read from the ephemeral API's database)
# --------------------------------------------------------------------------------------------


def task_run_spans(db: Path, flow_name: str | None = None) -> dict[str, list[tuple[float, float]]]:
    """task name prefix -> [(start, end)] epoch seconds of COMPLETED task runs of the latest flow run
    (of ``flow_name`` when given), from the Prefect SQLite database. Empty if it cannot be read."""
    if not db.is_file():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        q_flow = (
            "SELECT fr.id FROM flow_run fr JOIN flow f ON f.id = fr.flow_id "
            + ("WHERE f.name = ? " if flow_name else "")
            + "ORDER BY fr.start_time DESC LIMIT 1"
        )
        row = con.execute(q_flow, (flow_name,) if flow_name else ()).fetchone()
        if row is None:
            return {}
        rows = con.execute(
            "SELECT name, start_time, end_time, state_type FROM task_run WHERE flow_run_id = ?", (row[0],)
        ).fetchall()
    except sqlite3.Error:
        return {}
    finally:
        con.close()
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, start, end, state in rows:
        if not start or not end or state != "COMPLETED":
            continue
        prefix = re.sub(r"-[0-9a-f]{3}$", "", name)  # Prefect names task runs "<task>-<3 hex>"
        spans.setdefault(prefix, []).append((_epoch(start), _epoch(end)))
    return spans


def hps_task_stats(spans: dict[str, list[tuple[float, float]]]) -> dict:
    """The HPSv3 stage of a flow run from its hpsv3-batch task spans: span (first start to last
    end), time inside tasks, the first task's time (it also loads the scorer), the time inside the
    others, and the idle gaps between one task's end and the next one's start."""
    hps = sorted(s for name, v in spans.items() if name.startswith("hpsv3-batch") for s in v)
    if not hps:
        return {}
    span = max(b for _, b in hps) - hps[0][0]
    busy = sum(b - a for a, b in hps)
    gaps = [max(0.0, hps[i + 1][0] - max(b for _, b in hps[: i + 1])) for i in range(len(hps) - 1)]
    return {
        "span_s": span,
        "tasks": len(hps),
        "busy_s": busy,
        "busy_fraction": busy / span if span > 0 else float("nan"),
        "first_task_s": hps[0][1] - hps[0][0],
        "rest_busy_s": sum(b - a for a, b in hps[1:]),
        "gaps_s": gaps,
        "median_gap_s": sorted(gaps)[len(gaps) // 2] if gaps else 0.0,
    }


def _epoch(value: str) -> float:
    text = str(value).replace("Z", "+00:00")
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


# --------------------------------------------------------------------------------------------
# How busy the rest of the machine was during a measurement
# --------------------------------------------------------------------------------------------


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat (steal counts as busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


class CpuMeter:
    """Share of the machine's CPU used by OTHER processes while a measurement ran:
    (all busy CPU time - our own CPU time) / (wall time x cores). 0 = we had the machine alone."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1
        self.busy0, _ = _busy_ticks()
        self.t0 = time.perf_counter()
        self.own0 = _own_cpu_s()

    def others(self, own_cpu_s: float | None = None) -> float:
        """``own_cpu_s``: our CPU time in the window when it is not this process's (a subprocess)."""
        busy1, _ = _busy_ticks()
        wall = time.perf_counter() - self.t0
        own = own_cpu_s if own_cpu_s is not None else _own_cpu_s() - self.own0
        busy = (busy1 - self.busy0) / self.tick
        return max(0.0, min(1.0, (busy - own) / (wall * self.ncpu))) if wall > 0 else 0.0


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fmt_mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"
