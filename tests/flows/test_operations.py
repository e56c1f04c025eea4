"""What production does to a run: SIGKILL and resume, a second backfill of the same model, a
corrupt lake file, a full disk. Real flow runs (and real `imagebench` processes for the kills)."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.conftest import IMAGEBENCH, eligible_ids, image_bytes, put_model, runs_of, score_cli
from tests.lakecompare import assert_same_lake

pytestmark = pytest.mark.slow


# ---- SIGKILL at any point, then resume --------------------------------------------------------


# The batching of the killed and resumed runs, and of the clean runs they are compared with: the
# forward batch decides padding and GEMM shapes, hence the last bits of mu (docs/RELIABILITY.md,
# "Numerics"). Many small batches: the kill lands between and inside them.
BATCHING = {"IMAGEBENCH_TASK_BATCH_SIZE": "8", "IMAGEBENCH_BATCH_SIZE": "4"}


def _same_batching(monkeypatch) -> None:
    for key, value in BATCHING.items():
        monkeypatch.setenv(key, value)


def _score_cli(home: Path, model: str, cli: list[str] = IMAGEBENCH, **extra_env: str) -> subprocess.Popen:
    """:func:`score_cli` with this file's batching."""
    return score_cli(home, model, cli, **{**BATCHING, **extra_env})


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> bool:
    """SIGKILL the process group as soon as ``ready()``; False if the run ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the kill point was never reached: " + proc.log_path.read_text()[-3000:])


@pytest.mark.numeric
def test_sigkill_mid_batch_then_resume_ends_with_the_same_lake(built_reference, tiny_model, tmp_path, monkeypatch):
    """A real SIGKILL of the whole process group at a moment chosen by the clock, not by the code
    (the chain test below kills resumed runs at each exact step)."""
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake

    from tests.flows.conftest import use_workspace

    home, objects, _ = built_reference
    put_model(objects, "victim", eligible_ids()[:40], seed=21)
    shards = home / "staging" / "hps" / "victim"
    n_shards = lambda: len(list(shards.glob("*.parquet"))) if shards.is_dir() else 0  # noqa: E731

    # As soon as the first HPSv3 batch is written, with the others in flight.
    assert _kill_when(_score_cli(home, "victim"), lambda: n_shards() >= 1)
    assert not (home / "lake" / "model_scores" / "model_id=victim").exists()
    # Second start: runs to the end.
    done = _score_cli(home, "victim")
    assert done.wait(timeout=600) == 0, done.log_path.read_text()

    killed, record = [r for r in runs_of(load_settings()) if r["flow"] == "score-model"][-2:]
    # The killed run left its record from the start: the next run says it crashed, and where.
    assert killed["status"] == "crashed" and killed["stage"] not in (None, "start"), killed
    assert f"run {killed['run_id']} (score-model" in done.log_path.read_text()
    assert record["status"] == "completed"
    # Nothing finished was redone: the surviving batches were reused, not scored again.
    assert record["hps_images_resumed"] >= 8
    assert record["hps_images_resumed"] + record["hps_images_scored"] == 40
    assert not shards.exists(), "a model's staging is removed once committed"

    # The same lake as an uninterrupted run of the same model in a fresh workspace.
    # Same settings, same bits: the runtime (threads, batch size, dtype, ...) is a column compared too.
    clean = use_workspace(tmp_path / "clean", monkeypatch, tiny_model, reference_from=home.parent / "reference")
    _same_batching(monkeypatch)
    shutil.copytree(objects / "models" / "victim", clean / "objects" / "models" / "victim")  # keeps mtimes
    score_model_flow("victim")
    assert_same_lake(home / "lake", clean / "lake", [home], [clean], models=["victim"])
    runtimes = set(Lake(clean / "lake").read("hps_scores", ["victim"])["runtime"].to_pylist())
    assert [json.loads(r)["batch_size"] for r in runtimes] == [4]


# ---- two backfills of one model ----------------------------------------------------------------


def _hold_lock(home: str, model_id: str, held, release) -> None:
    from tasks.runs.locks import model_lock

    with model_lock(Path(home), model_id, "other-backfill-run"):
        held.set()
        release.wait(120)


def test_second_backfill_of_the_same_model_refuses_then_waits(built_reference, monkeypatch):
    from flows.pipeline import nightly_flow, score_model_flow
    from schemas.settings import load_settings
    from tasks.runs.locks import ModelBusy

    home, objects, _ = built_reference
    put_model(objects, "contested", eligible_ids()[:6], seed=31)
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(home), "contested", held, release))
    holder.start()
    try:
        assert held.wait(60)
        # Another process is scoring the model: a backfill refuses, naming who holds it.
        with pytest.raises(ModelBusy, match="other-backfill-run"):
            score_model_flow("contested")
        assert not (home / "lake" / "images" / "model_id=contested").exists()
        refused = runs_of(load_settings())[-1]
        assert refused["status"] == "failed" and "other-backfill-run" in refused["error"]
        # The nightly skips it (and says so) but scores the rest; a folder whose name is not a
        # model id is skipped and reported too.
        (objects / "models" / "bad name").mkdir()
        (objects / "models" / "bad name" / "x.png").write_bytes(b"anything")
        summary = nightly_flow()
        assert summary["busy"] == ["contested"] and "contested" not in summary["scored"]
        # (base-a got its result when the reference was built: up to date.)
        assert list(summary["invalid"]) == ["bad name"] and "base-a" in summary["up_to_date"]
        record = runs_of(load_settings())[-1]
        assert record["models_busy"] == ["contested"] and record["models_invalid"] == ["bad name"]
        assert record["status"] == "completed"
        # With a wait, the second backfill starts as soon as the first is done.
        monkeypatch.setenv("IMAGEBENCH_MODEL_LOCK_WAIT_S", "120")
        threading_release = __import__("threading").Timer(3.0, release.set)
        threading_release.start()
        row = score_model_flow("contested")
        assert row["model_id"] == "contested" and row["eps_prompts_scored"] == 6
    finally:
        release.set()
        holder.join(30)


# ---- a corrupt Parquet file in the lake ----------------------------------------------------------


def test_corrupt_lake_file_is_detected_set_aside_reported_and_recomputed(built_reference):
    from flows.pipeline import RunFailed, nightly_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake, query

    home, objects, _ = built_reference
    settings = load_settings()
    nightly_flow()
    lake = Lake(settings.lake_dir)
    before = {r["prompt_id"]: r["mu"] for r in lake.read("hps_scores", ["base-a"]).to_pylist()}
    victim = lake.partition_path("hps_scores", "base-a")
    garbage = b"PAR1 this is not a parquet file" + os.urandom(64)
    victim.write_bytes(garbage)

    with pytest.raises(RunFailed, match="corrupt"):
        nightly_flow()
    # Detected and reported: in the run record, naming the file; kept aside, never deleted.
    record = runs_of(settings)[-1]
    assert record["status"] == "failed"
    assert len(record["corrupt_files"]) == 1 and str(victim) in record["corrupt_files"][0]
    kept = list((settings.lake_dir / "_corrupt" / "hps_scores" / "model_id=base-a").glob("*.parquet"))
    assert len(kept) == 1 and kept[0].read_bytes() == garbage
    # Recomputed from the model's images in the same run: the same scores as before.
    after = {r["prompt_id"]: r["mu"] for r in lake.read("hps_scores", ["base-a"]).to_pylist()}
    assert after == pytest.approx(before, abs=1e-12) and set(after) == set(before)
    assert "base-a" in record["models_unchanged"] and record["hps_images_scored"] == 165
    _, rows = query(settings.catalog_path, "SELECT count(*) FROM leaderboard WHERE model_id = 'base-a'")
    assert rows == [(1,)]
    # The next night is clean again; `imagebench runs` shows both.
    assert nightly_flow()["corrupt_files"] == []
    import json

    from typer.testing import CliRunner

    from flows.cli import app

    shown = CliRunner().invoke(app, ["runs", "--limit", "2", "--format", "json"])
    assert shown.exit_code == 0, shown.output
    latest, previous = json.loads(shown.output)
    assert (latest["status"], previous["status"]) == ("completed", "failed")
    assert str(victim) in previous["corrupt_files"][0]
    # The table a person reads (issue 15 item 9): counts per disposition and the stage times, so
    # a nightly with nothing new does not look empty.
    table = CliRunner().invoke(app, ["runs", "--limit", "2"], env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if line.startswith("┃"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    rows = [dict(zip(names, (c.strip() for c in line.strip("│").split("│"))))
            for line in table.output.splitlines() if line.startswith("│")]
    assert [r["run"] for r in rows] == [latest["run_id"][:8], previous["run_id"][:8]]
    assert rows[0]["status"] == "completed" and rows[1]["status"].startswith("failed at ")
    for row, record in zip(rows, (latest, previous)):
        assert int(row["discovered"]) == record["models_discovered"] == 2
        assert int(row["scored"]) + int(row["up_to_date"]) + int(row["skipped"]) + int(row["errored"]) == 2, row
        assert int(row["images_scored"]) == record["hps_images_scored"]
    assert int(rows[0]["up_to_date"]) == 2 and int(rows[1]["up_to_date"]) == 2  # unchanged base-a counts here
    assert "hpsv3 " in rows[1]["stage_s"]  # the run that re-scored base-a's 165 images


def test_a_file_damaged_in_place_after_the_last_check_is_still_caught_by_the_nightly(built_reference):
    """The start check opens only files changed since the catalog refresh that read them whole
    (tasks/lake/check.py). A file damaged afterwards in place, its size and mtime kept, is not
    opened there; the first read of it (discovery reads every listed model's `images`) fails,
    the nightly then checks every footer as before, sets the file aside, records it and
    recomputes the model in the same run."""
    from flows.pipeline import RunFailed, nightly_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.lake.check import check_changed

    settings = load_settings()
    nightly_flow()  # ends with a catalog refresh: every file verified
    lake = Lake(settings.lake_dir)
    before = lake.read("images", ["base-a"]).select(["prompt_id", "image_sha256", "state"]).to_pylist()
    victim = lake.partition_path("images", "base-a")
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[-40:-8] = b"\xff" * 32  # the footer's end, before its length and magic: same size
    with open(victim, "r+b") as fh:
        fh.write(data)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert check_changed(lake).opened == 0  # the stat is the verified one: not opened at the start

    with pytest.raises(RunFailed, match="corrupt"):
        nightly_flow()
    record = runs_of(settings)[-1]
    assert record["status"] == "failed"
    assert len(record["corrupt_files"]) == 1 and str(victim) in record["corrupt_files"][0]
    kept = list((settings.lake_dir / "_corrupt" / "images" / "model_id=base-a").glob("*.parquet"))
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(data)
    # Ingested again in the same run: the same images as before, and a result for them.
    after = lake.read("images", ["base-a"]).select(["prompt_id", "image_sha256", "state"]).to_pylist()
    assert sorted(after, key=str) == sorted(before, key=str)
    assert "base-a" in record["models_unchanged"] + record["models_replaced"] + record["models_new"]
    assert nightly_flow()["corrupt_files"] == []


# ---- disk full on the workspace ---------------------------------------------------------------


def _fill(path: Path) -> Path:
    filler = path / "filler.bin"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_disk_full_fails_cleanly_and_the_previous_lake_stays_readable(built_reference, tmp_path, monkeypatch):
    """A real full filesystem: the workspace lives on a small tmpfs we fill up."""
    from flows.pipeline import RunFailed, score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake, query

    _, objects, _ = built_reference
    small = tmp_path / "small-disk"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(small)], capture_output=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs here (need root): {mounted.stderr!r}"
    try:
        monkeypatch.setenv("IMAGEBENCH_HOME", str(small / "home"))
        monkeypatch.setenv("IMAGEBENCH_STORE", str(objects))
        put_model(objects, "first", eligible_ids()[:8], seed=41)
        put_model(objects, "second", eligible_ids()[:8], seed=42)
        settings = load_settings()
        score_model_flow("first")
        lake_files = {p: p.read_bytes() for p in settings.lake_dir.rglob("*.parquet") if "runs" not in p.parts}

        filler = _fill(small)
        with pytest.raises((OSError, RunFailed)) as failure:
            score_model_flow("second")
        assert "No space left on device" in str(failure.value)
        # The previous lake is intact and readable; no half-written file is visible.
        assert {p: p.read_bytes() for p in lake_files} == lake_files
        assert not [p for p in settings.lake_dir.rglob("*") if p.name.endswith(".tmp")]
        assert not (settings.lake_dir / "model_scores" / "model_id=second").exists()
        assert Lake(settings.lake_dir).read("model_scores").column("model_id").to_pylist() == ["first"]
        _, rows = query(settings.catalog_path, "SELECT model_id FROM leaderboard")
        assert rows == [("first",)]

        # Space back: the same command completes.
        filler.unlink()
        row = score_model_flow("second")
        assert row["eps_prompts_scored"] == 8
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


# ---- judge endpoint outages --------------------------------------------------------------------


def _judges_yaml(path: Path, qwen_url: str, gemma_url: str) -> Path:
    import json

    path.write_text(json.dumps({"judges": {
        "qwen3-vl": {"backend": "openai", "base_url": qwen_url, "model": "fake-qwen", "concurrency": 4, "max_retries": 1},
        "gemma": {"backend": "openai", "base_url": gemma_url, "model": "fake-gemma", "concurrency": 4, "max_retries": 1},
    }}))
    return path


def test_judge_outage_falls_back_then_shows_explicit_states_then_recovers(built_reference, monkeypatch, tmp_path):
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite
    from tests.fake_openai import FakeOpenAI, Reply, free_port

    home, objects, _ = built_reference
    settings = load_settings()
    suite = load_suite(settings.suite_path)
    ids = [p.prompt_id for p in suite.prompts if p.category != "Text Rendering"][:8]
    put_model(objects, "outage", ids, seed=51)
    put_model(objects, "dark", ids, seed=52)
    dead = lambda: f"http://127.0.0.1:{free_port()}/v1"  # noqa: E731 - nothing listens there
    cfg = tmp_path / "judges.yaml"
    monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
    lake = Lake(settings.lake_dir)
    passing = lambda req: Reply(text="Checked.\nVERDICT: PASS")  # noqa: E731

    # The preferred judge is down: its fallback decides every item; the failed calls are kept.
    with FakeOpenAI(model="fake-gemma", responder=passing) as gemma:
        _judges_yaml(cfg, dead(), gemma.base_url)
        row = score_model_flow("outage")
    verdicts = lake.read("verdicts", ["outage"]).to_pylist()
    assert {v["judge"] for v in verdicts} == {"gemma"} and {v["verdict"] for v in verdicts} == {"PASS"}
    calls = lake.read("judge_calls", ["outage"]).to_pylist()
    assert any(c["judge"] == "qwen3-vl" and c["error"] for c in calls)
    assert row["provisional"] is False and row["verdicts_pass"] == len(ids)

    # Both down: nothing is scored silently. Every item is an explicit ERROR, the model provisional.
    _judges_yaml(cfg, dead(), dead())
    row = score_model_flow("dark")
    verdicts = lake.read("verdicts", ["dark"]).to_pylist()
    assert len(verdicts) == len(ids) and {v["verdict"] for v in verdicts} == {"ERROR"}
    assert all(v["reason"] for v in verdicts)
    assert row["provisional"] is True and row["verdicts_undecided"] == len(ids) and row["verdicts_pass"] == 0

    # Back up: the next run asks again for the ERROR items only, and the model is decided.
    with FakeOpenAI(model="fake-qwen", responder=passing) as qwen:
        _judges_yaml(cfg, qwen.base_url, dead())
        row = score_model_flow("dark")
        assert len(qwen.completions) == len(ids)
        score_model_flow("outage")
        assert len(qwen.completions) == len(ids), "settled verdicts are never asked again"
    assert row["provisional"] is False and row["verdicts_pass"] == len(ids)


# ---- a kill at each kind of durable write, then resume ------------------------------------------

# Every durable write ends with an atomic rename; tests/crash_after.py dies (os._exit, as SIGKILL:
# no cleanup runs) just before or just after one of them. One point per kind of state a kill can
# leave on disk, in the order a run reaches them: each run of the chain resumes from what the
# previous one left and dies at the next point. (destination texts, before/after); {m} = model id.
CRASH_CHAIN = [
    ("scoring and judging in flight", "staging/hps/{m}/|staging/judge/{m}/", "after"),  # first shard of either
    ("commit: images not yet renamed", "lake/images/model_id={m}/", "before"),  # quarantine committed, temp file left
    ("commit: images + hps_scores", "lake/hps_scores/model_id={m}/", "after"),
    ("commit: judge_calls without verdicts", "lake/judge_calls/model_id={m}/", "after"),
    ("commit: staging dropped, result not renamed", "lake/model_scores/model_id={m}/", "before"),
    ("commit: result written, catalog not refreshed", "imagebench.duckdb", "before"),
]
# (A half-staged ingest is not a point of its own: every run re-stages the ingest from scratch.)


def _crash_prompts() -> list[str]:
    from tasks.scores.suite import load_suite

    from tests.flows.conftest import SUITE_FILE

    text = [p.prompt_id for p in load_suite(SUITE_FILE).prompts if p.category == "Text Rendering"]
    return eligible_ids()[:10] + text[:3]  # HPSv3 in two task batches; the OCR judge decides offline


def _crash_run(home: Path, model: str, needle: str | None = None, when: str = "after") -> subprocess.CompletedProcess:
    extra = {"CRASH_REPLACE": needle.format(m=model), "CRASH_WHEN": when} if needle else {}
    extra["PREFECT_LOGGING_LEVEL"] = "INFO"  # the flow's log names each model's disposition
    proc = _score_cli(home, model, [sys.executable, "-m", "tests.crash_after"], **extra)
    try:
        proc.wait(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the dead run left behind (its embedded server)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.log_path.read_text(errors="replace"))


def test_killed_at_every_kind_of_write_then_resumed_ends_with_the_same_lake(
    built_reference, tiny_model, tmp_path, monkeypatch
):
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake, query

    from tests.flows.conftest import use_workspace

    home, objects, _ = built_reference
    # The model has a result already, and then its images change: the run to kill replaces it.
    prompts = _crash_prompts()
    model_dir = objects / "models" / "chain"
    put_model(objects, "chain", prompts, seed=51)
    score_model_flow("chain")
    first = tmp_path / "chain-v1"
    shutil.copytree(model_dir, first)  # keeps mtimes: the clean run below sees the same listing
    (model_dir / f"{prompts[0]}.png").write_bytes(image_bytes(990_001))  # replaced (HPSv3)
    (model_dir / f"{prompts[-1]}.png").write_bytes(image_bytes(990_002))  # replaced (OCR judge)
    (model_dir / f"{prompts[1]}.png").unlink()  # removed
    put_model(objects, "chain", [eligible_ids()[10]], seed=52)  # added
    result = lambda: Lake(home / "lake").read("model_scores", ["chain"]).to_pylist()  # noqa: E731
    old = result()
    for what, needle, when in CRASH_CHAIN:
        run = _crash_run(home, "chain", needle, when)
        assert run.returncode == 137, f"the run was to die at '{what}' but ended {run.returncode}: {run.stdout[-3000:]}"
        # Readers see the old result until everything the new one is computed from is in the lake.
        assert (result() == old) != what.startswith("commit: result written"), what
        # Every resumed run knows it replaces the result, even once the new images are committed.
        assert "chain (replaced)" in run.stdout and "chain (incremental)" not in run.stdout, (what, run.stdout[-3000:])
    done = _crash_run(home, "chain")
    assert done.returncode == 0, done.stdout[-3000:]
    settings = load_settings()
    _, rows = query(settings.catalog_path, "SELECT eps_prompts_scored FROM leaderboard WHERE model_id = 'chain'")
    assert rows == [(10,)]  # one image removed, one added
    assert not [p for p in settings.staging_dir.rglob("*") if p.is_file() and "chain" in p.parts]
    leftovers = [p for p in settings.lake_dir.rglob("*.tmp")]
    assert not leftovers, f"temp files of the killed runs are still in the lake: {leftovers}"

    # The same lake as uninterrupted runs of the same images in a fresh workspace.
    clean = use_workspace(tmp_path / "clean", monkeypatch, tiny_model, reference_from=home.parent / "reference")
    _same_batching(monkeypatch)
    shutil.copytree(first, clean / "objects" / "models" / "chain")
    score_model_flow("chain")
    shutil.rmtree(clean / "objects" / "models" / "chain")
    shutil.copytree(model_dir, clean / "objects" / "models" / "chain")
    score_model_flow("chain")
    assert_same_lake(home / "lake", clean / "lake", [home], [clean], models=["chain"])
