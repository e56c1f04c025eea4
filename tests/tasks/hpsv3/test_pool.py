"""The preprocessing pool (tasks/hpsv3/pool.py): bit-identical to the single-thread path, errors
named as before, reused across calls, and no process or /dev/shm file left behind.

Spawned workers cost about a second each to start: the module shares two pooled scorers (on the
session's tiny model), one whose workers tokenise and one whose parent does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.hpsv3 import pool as pool_mod
from tasks.hpsv3.pool import default_preprocess_workers, tokenizer_backend_if_identical

from .conftest import make_image

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mixed_images(tmp_path_factory: pytest.TempPathFactory) -> list:
    """Paths of PNG (RGB, RGBA, L, P with transparency) and JPEG files of mixed sizes, and
    in-memory PIL images (which travel to the workers pickled)."""
    root = tmp_path_factory.mktemp("pool-images")
    specs = [
        ("rgb.png", (640, 360), "RGB", "PNG"),
        ("photo.jpg", (1024, 768), "RGB", "JPEG"),
        ("alpha.png", (300, 500), "RGBA", "PNG"),
        ("gray.png", (333, 257), "L", "PNG"),
        ("tall.jpg", (200, 900), "RGB", "JPEG"),
        ("palette.png", (512, 512), "P", "PNG"),
        ("gray.jpg", (700, 466), "L", "JPEG"),
    ]
    out: list = []
    for i, (name, size, mode, fmt) in enumerate(specs):
        img = make_image(100 + i, size, "RGB")
        if mode == "P":
            img = img.quantize(64)
            img.info["transparency"] = 3  # dropped by convert("RGB"), as the official path does
        elif mode != "RGB":
            img = img.convert(mode)
        img.save(root / name, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        out.append(root / name)
    out.insert(3, make_image(200, (448, 448), "RGBA"))
    out.append(make_image(201, (90, 120), "L"))
    # Resized to 56x6160 (1.7x the pixel budget): too big for a slot, it comes back by the pipe.
    out.insert(6, make_image(202, (8, 1500), "RGB"))
    return out


@pytest.fixture(scope="module")
def prompts_for(sample_prompts):
    return lambda n: [sample_prompts[i % len(sample_prompts)] + f" #{i}" for i in range(n)]


@pytest.fixture(scope="module")
def pooled(scorer):
    """Two workers that tokenise (the default path) on the session scorer's model."""
    from tasks.hpsv3.scorer import HPSv3Scorer

    with HPSv3Scorer(scorer.loaded, scorer.base_model, True, preprocess_workers=2) as s:
        yield s


@pytest.fixture(scope="module")
def pooled_parent_tokenises(scorer):
    """One worker, with the parent tokenising (what happens when the worker-side tokeniser does
    not give the parent tokenizer's ids)."""
    from tasks.hpsv3 import scorer as scorer_mod

    mp = pytest.MonkeyPatch()
    mp.setattr(scorer_mod, "tokenizer_backend_if_identical", lambda tokenizer, probe: None)
    s = scorer_mod.HPSv3Scorer(scorer.loaded, scorer.base_model, True, preprocess_workers=1)
    s.prepare_with_pool([], [])  # start the pool while patched
    mp.undo()
    yield s
    s.close()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes, as PID 1 of some containers, is not)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _assert_all_slots_free(pool) -> None:
    """Every shared-memory slot was copied out and handed back to its worker."""
    for sem in pool._slots.free:
        assert sem.acquire(block=False)
        sem.release()


def _assert_same_items(expected, got) -> None:
    assert len(expected) == len(got)
    for i, (a, b) in enumerate(zip(expected, got)):
        assert a.grid_thw == b.grid_thw, i
        assert a.input_ids.dtype == b.input_ids.dtype and np.array_equal(a.input_ids, b.input_ids), i
        assert a.pixel_values.dtype == b.pixel_values.dtype and a.pixel_values.shape == b.pixel_values.shape, i
        assert np.array_equal(a.pixel_values, b.pixel_values), i


def test_pool_feeds_the_model_exactly_what_the_single_thread_path_does(
    scorer, pooled, pooled_parent_tokenises, mixed_images, prompts_for
):
    from tasks.hpsv3.model import collate

    prompts = prompts_for(len(mixed_images))
    expected = scorer.prepare(mixed_images, prompts)
    workers_tokenise = pooled.prepare_with_pool(mixed_images, prompts, batch_size=3)
    parent_tokenises = pooled_parent_tokenises.prepare_with_pool(mixed_images, prompts, batch_size=4)
    assert pooled._pool.tokenizes and not pooled_parent_tokenises._pool.tokenizes
    _assert_same_items(expected, workers_tokenise)
    _assert_same_items(expected, parent_tokenises)
    pad = scorer.loaded.tokenizer.pad_token_id
    for k, v in collate(expected, pad).items():  # what the forward gets, padded and stacked
        assert v.dtype == collate(workers_tokenise, pad)[k].dtype
        assert v.equal(collate(workers_tokenise, pad)[k]), k
    _assert_all_slots_free(pooled._pool)


@pytest.mark.numeric
def test_mu_is_bit_identical_for_0_1_and_2_workers(scorer, pooled, pooled_parent_tokenises, mixed_images, prompts_for):
    prompts = prompts_for(len(mixed_images))
    in_thread = scorer.score(mixed_images, prompts, batch_size=4)  # CPU default: 0 workers
    assert scorer.workers == 0 and scorer._pool is None
    one = pooled_parent_tokenises.score(mixed_images, prompts, batch_size=4)
    two = pooled.score(mixed_images, prompts, batch_size=4)  # starts the pool if no earlier test did
    pids = pooled._pool.worker_pids()
    assert np.array_equal(one, in_thread) and np.array_equal(two, in_thread)
    # Reused, not re-spawned, by a later call (a nightly scores many models with one scorer).
    again = pooled.score(mixed_images[:5], prompts[:5], batch_size=2)
    assert pooled._pool.worker_pids() == pids and len(pids) == 2
    assert np.array_equal(again, pooled.score(mixed_images[:5], prompts[:5], batch_size=2))


def test_unreadable_image_is_named_as_before_and_the_pool_survives(scorer, pooled, mixed_images, prompts_for, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    images = [*mixed_images[:5], bad, *mixed_images[5:]]
    prompts = prompts_for(len(images))
    with pytest.raises(ValueError) as single:
        scorer.prepare(images, prompts)
    with pytest.raises(ValueError) as pooled_err:
        pooled.score(images, prompts, batch_size=2)
    assert str(pooled_err.value) == str(single.value)
    assert str(single.value).startswith(f"image 5 ({bad}): ")
    # The prefetched jobs were dropped or finished; the next call runs on the same workers.
    pids = pooled._pool.worker_pids()
    ok = pooled.score(mixed_images[:3], prompts[:3], batch_size=2)
    assert pooled._pool.worker_pids() == pids and ok.shape == (3, 2)
    _assert_all_slots_free(pooled._pool)


def test_an_error_in_the_forward_keeps_the_pool_and_close_stops_it(scorer, mixed_images, prompts_for):
    from tasks.hpsv3.scorer import HPSv3Scorer

    def failing_runner(items):
        raise RuntimeError("forward failed")

    s = HPSv3Scorer(scorer.loaded, scorer.base_model, True, batch_runner=failing_runner, preprocess_workers=1)
    prompts = prompts_for(len(mixed_images))
    with pytest.raises(RuntimeError, match="forward failed"):
        s.score(mixed_images, prompts, batch_size=2)
    pool, pids = s._pool, s._pool.worker_pids()
    s.close()
    assert pool.closed and not Path(pool._shm_dir).exists()
    assert not [pid for pid in pids if _alive(pid)]  # the workers were joined by close()


# Heavy imports inside main(): spawned workers re-import the main module (as with any
# multiprocessing code), and must not import torch for nothing.
CTRL_C_CHILD = """
import json, sys, time

def main():
    import numpy as np
    from PIL import Image
    from tasks.hpsv3.scorer import HPSv3Scorer

    base, ckpt, report = sys.argv[1:4]
    def slow_runner(items):
        time.sleep(0.05)
        return np.zeros((len(items), 2))
    s = HPSv3Scorer.load(base, ckpt, device="cpu", dtype="float32", uncalibrated=True, preprocess_workers=2)
    s.batch_runner = slow_runner
    img = Image.new("RGB", (640, 480), (10, 20, 30))
    s.score([img] * 4, ["a prompt"] * 4, batch_size=2)
    with open(report, "w") as f:
        json.dump({"pids": s._pool.worker_pids(), "shm": s._pool._shm_dir}, f)
    s.score([img] * 100000, ["a prompt"] * 100000, batch_size=2)  # interrupted

if __name__ == "__main__":
    main()
"""


def test_ctrl_c_leaves_no_worker_and_no_shm_dir(tiny_base, tiny_checkpoint, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CTRL_C_CHILD)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Its own session, so the SIGINT goes to its whole process group, as a terminal's Ctrl-C does.
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_base), str(tiny_checkpoint), str(report)],
        cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not report.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert report.exists(), proc.communicate(timeout=60)
        time.sleep(0.5)  # json.dump may still be writing
        info = json.loads(report.read_text())
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr
    assert len(info["pids"]) == 2
    assert not [pid for pid in info["pids"] if _alive(pid)], "a worker outlived its parent"
    assert not Path(info["shm"]).exists()
    # The workers ignored the SIGINT: no traceback of theirs, only the parent's.
    assert stderr.count("KeyboardInterrupt") == 1, stderr


def test_default_workers_and_setting(monkeypatch, recorded_machine):
    from schemas.settings import load_settings
    from tasks.runs.pinned import ScorerSpec

    cores = recorded_machine.usable_cores
    assert default_preprocess_workers("cuda") == max(1, cores - 1)
    assert default_preprocess_workers("cpu") == 0
    monkeypatch.setenv("IMAGEBENCH_HPSV3_PREPROCESS_WORKERS", "3")
    assert ScorerSpec.from_settings(load_settings()).preprocess_workers == 3
    monkeypatch.delenv("IMAGEBENCH_HPSV3_PREPROCESS_WORKERS")
    assert ScorerSpec.from_settings(load_settings()).preprocess_workers is None
    with pytest.raises(ValueError, match="preprocess_workers must be >= 0"):
        from tasks.hpsv3.scorer import HPSv3Scorer

        HPSv3Scorer(None, "x", uncalibrated=True, preprocess_workers=-1)  # type: ignore[arg-type]


def test_worker_tokeniser_is_used_only_when_it_gives_the_same_ids(scorer):
    tok = scorer.loaded.tokenizer
    probe = "<|im_start|>user\nhello<|image_pad|><|image_pad|><|Reward|><|im_end|>"
    assert tokenizer_backend_if_identical(tok, probe) is tok._tokenizer

    class Shifted:
        _tokenizer = tok._tokenizer

        def __call__(self, texts, **kw):
            return {"input_ids": [[i + 1 for i in ids] for ids in tok(texts, **kw)["input_ids"]]}

    assert tokenizer_backend_if_identical(Shifted(), probe) is None
    assert tokenizer_backend_if_identical(object(), probe) is None


def test_pool_module_imports_neither_torch_nor_transformers():
    code = "import sys, tasks.hpsv3.pool; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert pool_mod.IMAGE_PAD_TOKEN == __import__("tasks.hpsv3.model", fromlist=["x"]).IMAGE_PAD_TOKEN


OS_EXIT_CHILD = """
import json, os, sys

def main():
    from tasks.hpsv3.pool import PreparePool
    from tasks.hpsv3.preprocess import DEFAULT_VISION_CONFIG

    pool = PreparePool(2, DEFAULT_VISION_CONFIG)
    with open(sys.argv[1], "w") as f:
        json.dump({"pids": pool.worker_pids(), "shm": pool._shm_dir}, f)
    os._exit(0)  # no atexit, no finalizer: as the warm server's command processes leave

if __name__ == "__main__":
    main()
"""


def test_workers_exit_and_clean_up_when_the_parent_leaves_without_closing(tmp_path):
    script, report = tmp_path / "child.py", tmp_path / "report.json"
    script.write_text(OS_EXIT_CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, str(script), str(report)], cwd=REPO, env=env, check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    info = json.loads(report.read_text())
    assert len(info["pids"]) == 2
    deadline = time.monotonic() + 30  # they poll every PARENT_POLL_S; generous for a loaded machine
    while time.monotonic() < deadline and (
        any(_alive(pid) for pid in info["pids"]) or Path(info["shm"]).exists()
    ):
        time.sleep(0.1)
    assert not [pid for pid in info["pids"] if _alive(pid)]
    assert not Path(info["shm"]).exists()
