"""A pool of preprocessing worker processes for HPSv3: decode, resize, patchify and tokenise.

One pool per scorer, created on the first ``score`` call and reused by every later call (a
nightly scores many models with one scorer), shut down by ``HPSv3Scorer.close()``, when the
scorer is garbage-collected, or at interpreter exit.

Design (docs/HPSV3.md, "Preprocessing workers"):
- Worker processes are *spawned* (never forked: the parent has torch loaded and threads running)
  and import only numpy, PIL, this module's preprocessing and the ``tokenizers`` library. The
  tokeniser is the parent's own Rust tokeniser (``tokenizer._tokenizer``), pickled to each worker
  once; it is used only if it gives exactly the ids of the parent's tokenizer on a probe text,
  else the parent tokenises (same code as the single-thread path).
- The chat template is rendered in the parent (jinja, a fraction of a millisecond) with one image
  pad; the worker expands the pad to the image's token count, exactly as ``render_text`` does.
- pixel_values (about 4.8 MB of float32 per image) come back through shared memory: one file
  (on ``/dev/shm``, or the temp directory where /dev/shm is smaller than ``MIN_SHM_BYTES``, as
  Docker's default 64 MB is) holds ``SLOTS_PER_WORKER`` slots per worker, mapped once by the
  worker and the parent with every page faulted in at the start. The worker patchifies straight
  into a free slot; the parent copies the slot into its own memory as soon as the job is done
  and frees it (a semaphore per slot). Measured per image on 2 cores: pickling the array
  through the result pipe cost the parent ~4.5 ms of CPU, a fresh tmpfs file per image ~1.5 to
  3 ms on each side (4 KiB page faults: tmpfs gets no huge pages); the slot copy costs ~0.3 ms.
  The parent's time matters because it is not parallel: on 2 cores, 2 workers can only reach
  1.7x one worker if the parent spends under ~15% of a worker's time per image. A result larger
  than a slot (extreme aspect ratios) comes back through the pipe. All give the same bytes.
- Workers ignore SIGINT: on Ctrl-C the parent stops, and the pool is shut down by the parent.
  A parent that ends without shutting the pool down (killed, or leaving by ``os._exit`` as the
  warm server's command processes do) is noticed by each worker within ``PARENT_POLL_S``: the
  worker removes the pool's shared-memory directory and exits (a worker's own copy of the call
  queue keeps it from ever reading EOF, so it must look).
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .cpu import usable_cores
from .preprocess import (
    ImageInput,
    PreprocessedImage,
    VisionPreprocessConfig,
    load_image,
    patch_shape,
    patchify,
    resize_for_hpsv3,
)

IMAGE_PAD_TOKEN = "<|image_pad|>"  # = tasks.hpsv3.model.IMAGE_PAD_TOKEN (model imports torch)
SHM_ROOT = Path("/dev/shm")
SHM_PREFIX = "imagebench-hpsv3-prep-"
# Two slots per worker: it fills one while the parent copies the other out.
SLOTS_PER_WORKER = 2
PARENT_POLL_S = 0.5
# A slot holds an image resized to up to 1.25x HPSv3's pixel budget (smart_resize rounds some
# sizes above it: 300x299 -> 476x448 is 6% over); larger ones come back through the pipe.
SLOT_BUDGET = 1.25


def default_preprocess_workers(device_type: str) -> int:
    """The pool size when the setting is unset. On CUDA: the cores this process may run on,
    minus the one driving the device (at least 1). On CPU: 0 (prepare on one thread beside the
    forward, as before): the CPU forward already uses every core (IMAGEBENCH_HPSV3_THREADS), so
    worker processes would only take cores from it, and torch's OpenMP threads spin while a
    sibling is descheduled."""
    if device_type == "cuda":
        return max(1, usable_cores() - 1)
    return 0


# --- worker side ---------------------------------------------------------------------------------
@dataclass
class _WorkerState:
    tokenizer: Any = None
    slots: list[np.ndarray] | None = None  # this worker's slot views (float32, SLOT_FLOATS each)
    slot_ids: list[int] | None = None  # their global numbers (index into the semaphores)
    free: Any = None  # one semaphore per global slot: released when the slot may be written
    next_slot: int = 0
    parent_pid: int = 0


_worker = _WorkerState()


def _init_worker(tokenizer_backend: Any, slot_file: str, slot_bytes: int, slots_per_worker: int, free: Any, counter: Any,
                 parent_pid: int) -> None:
    # Ctrl-C is the parent's to handle. The worker was started with SIGINT blocked (see
    # PreparePool._start), so a Ctrl-C during its start-up is discarded here, not raised.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _worker.tokenizer = tokenizer_backend
    # The pid the pool was made in, not os.getppid(): a parent that died before this worker got
    # here has already been replaced by a reaper, and this worker would wait for that one forever.
    _worker.parent_pid = parent_pid
    threading.Thread(
        target=_exit_with_parent, args=(_worker.parent_pid, os.path.dirname(slot_file)), daemon=True
    ).start()
    with open(slot_file, "r+b") as f:
        mapped = mmap.mmap(
            f.fileno(),
            slot_bytes * slots_per_worker,
            flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
            offset=index * slot_bytes * slots_per_worker,
        )
    floats = np.frombuffer(mapped, dtype=np.float32)
    per = slot_bytes // 4
    _worker.slots = [floats[k * per : (k + 1) * per] for k in range(slots_per_worker)]
    _worker.slot_ids = [index * slots_per_worker + k for k in range(slots_per_worker)]
    _worker.free = free


def _exit_with_parent(parent_pid: int, shm_dir: str) -> None:
    """Exit (cleaning the shared memory up) once the parent is gone without closing the pool."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    shutil.rmtree(shm_dir, ignore_errors=True)
    os._exit(0)


def _acquire_slot() -> tuple[int, np.ndarray]:
    k = _worker.next_slot
    _worker.next_slot = (k + 1) % len(_worker.slots)
    slot_id = _worker.slot_ids[k]
    # The parent frees a slot as soon as it has copied it; wait for that, but never outlive it.
    while not _worker.free[slot_id].acquire(timeout=1.0):
        if os.getppid() != _worker.parent_pid:
            os._exit(1)
    return slot_id, _worker.slots[k]


@dataclass(frozen=True)
class _Done:
    """One prepared image as it crosses the process boundary."""

    slot: int | None  # the shared-memory slot holding pixel_values, or None: they are in ``pixels``
    pixels: np.ndarray | None
    shape: tuple[int, int]
    grid_thw: tuple[int, int, int]
    n_image_tokens: int
    input_ids: np.ndarray | None  # int64, when the worker tokenised


@dataclass(frozen=True)
class _Failed:
    message: str  # str(exc) of the error, as the single-thread path puts it in its message


def _prepare_in_worker(image: ImageInput, config: VisionPreprocessConfig, text: str | None) -> _Done | _Failed:
    # The steps of preprocess_image(), with patchify writing into a shared-memory slot.
    slot = None
    try:
        resized = resize_for_hpsv3(load_image(image), config)
        shape = patch_shape(*resized.size, config)
        if _worker.slots is not None and shape[0] * shape[1] <= _worker.slots[0].size:
            slot, buf = _acquire_slot()
            try:
                _, grid = patchify(resized, config, out=buf[: shape[0] * shape[1]].reshape(shape))
            except BaseException:
                _worker.free[slot].release()
                raise
            pixels = None
        else:
            pixels, grid = patchify(resized, config)
    except Exception as exc:  # named by the parent with the image's index and path
        return _Failed(str(exc))
    n_tokens = grid[0] * grid[1] * grid[2] // (config.merge_size**2)
    ids = None
    if text is not None and _worker.tokenizer is not None:
        expanded = text.replace(IMAGE_PAD_TOKEN, IMAGE_PAD_TOKEN * n_tokens)
        ids = np.asarray(_worker.tokenizer.encode(expanded, add_special_tokens=True).ids, dtype=np.int64)
    return _Done(slot, pixels, shape, grid, n_tokens, ids)


# --- parent side ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedImage:
    """What one worker job gives the parent: the image's preprocessing and, when the worker
    tokenised, the input ids (int64, unpadded)."""

    image: PreprocessedImage
    input_ids: np.ndarray | None


class _Slots:
    """The parent's side of the shared slots: one file, mapped once, every page faulted in."""

    def __init__(self, directory: str, workers: int, slot_bytes: int, per_worker: int, ctx: Any) -> None:
        self.slot_bytes = slot_bytes
        self.path = os.path.join(directory, "slots.f32")
        size = slot_bytes * per_worker * workers
        with open(self.path, "w+b") as f:
            os.posix_fallocate(f.fileno(), 0, size)  # ENOSPC now rather than SIGBUS later
            self.map = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self.floats = np.frombuffer(self.map, dtype=np.float32)
        self.free = [ctx.Semaphore(1) for _ in range(per_worker * workers)]

    def take(self, done: _Done) -> np.ndarray:
        """A copy of the slot's pixel_values (in this process's memory); frees the slot."""
        try:
            start = done.slot * (self.slot_bytes // 4)
            return self.floats[start : start + done.shape[0] * done.shape[1]].reshape(done.shape).copy()
        finally:
            self.free[done.slot].release()

    def close(self) -> None:
        self.floats = None  # no view may outlive the mapping
        self.map.close()


def _chain(job: Future, out: Future, slots: _Slots) -> None:
    """Runs in the executor's result thread: copy the pixels out of their slot at once (so the
    worker can reuse it) and complete ``out``."""
    if job.cancelled():
        out.cancel()
        return
    try:
        res = job.result()
        if isinstance(res, _Done):
            pixels = slots.take(res) if res.slot is not None else res.pixels
            res = PreparedImage(PreprocessedImage(pixels, res.grid_thw, res.n_image_tokens), res.input_ids)
        out.set_result(res)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on ``out``
        out.set_exception(exc)


def slot_bytes(config: VisionPreprocessConfig) -> int:
    """Bytes of one slot, a multiple of the mapping granularity (mmap offsets must be)."""
    patches = math.ceil(SLOT_BUDGET * config.max_pixels / (config.patch_size**2))
    raw = patches * config.patch_dim * 4
    return -(-raw // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY


def _shm_parent(needed: int) -> str | None:
    """/dev/shm if it has twice ``needed`` free (Docker's default is 64 MB), else the temp dir."""
    try:
        if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK | os.X_OK):
            st = os.statvfs(SHM_ROOT)
            if st.f_bavail * st.f_frsize >= 2 * needed:
                return str(SHM_ROOT)
    except OSError:
        pass
    return None  # tempfile's default directory


def _noop() -> None:
    return None


def _close_executor(executor: ProcessPoolExecutor, slots: _Slots | None, shm_dir: str) -> None:
    try:
        executor.shutdown(wait=True, cancel_futures=True)  # joins the workers and the result thread
    finally:
        if slots is not None:
            slots.close()
        shutil.rmtree(shm_dir, ignore_errors=True)


class PreparePool:
    """``workers`` spawned processes that turn (image, rendered text) into prepared images."""

    def __init__(self, workers: int, config: VisionPreprocessConfig, tokenizer_backend: Any = None) -> None:
        if workers < 1:
            raise ValueError(f"a preprocessing pool needs at least 1 worker, got {workers}")
        if multiprocessing.current_process().daemon:
            raise RuntimeError("daemonic processes cannot start preprocessing workers")
        self.workers = workers
        self.config = config
        self.tokenizes = tokenizer_backend is not None
        ctx = multiprocessing.get_context("spawn")
        per_slot = slot_bytes(config)
        self._shm_dir = tempfile.mkdtemp(prefix=SHM_PREFIX, dir=_shm_parent(per_slot * SLOTS_PER_WORKER * workers))
        try:
            self._slots = _Slots(self._shm_dir, workers, per_slot, SLOTS_PER_WORKER, ctx)
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(tokenizer_backend, self._slots.path, per_slot, SLOTS_PER_WORKER, self._slots.free, ctx.Value("i", 0), os.getpid()),
            )
        except BaseException:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            raise
        self._lock = threading.Lock()
        # Shut down with the owner, at the latest at interpreter exit (finalize runs atexit).
        self._finalizer = weakref.finalize(self, _close_executor, self._executor, self._slots, self._shm_dir)
        self._start()

    def _start(self) -> None:
        """Start every worker now (the executor starts one per submit while none is idle), with
        SIGINT blocked: the children inherit the mask, so a Ctrl-C while they import does not
        print one traceback per worker; each ignores SIGINT once initialised."""
        blocked = threading.current_thread() is threading.main_thread()
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with self._lock:
                jobs = [self._executor.submit(_noop) for _ in range(self.workers)]
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for job in jobs:
            job.result()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def submit(self, image: ImageInput, text: str | None) -> Future:
        """A future of :class:`PreparedImage` or ``_Failed`` (its message) for one image."""
        out: Future = Future()
        with self._lock:
            job = self._executor.submit(_prepare_in_worker, image, self.config, text)
        slots = self._slots
        job.add_done_callback(lambda f: _chain(f, out, slots))
        out._imagebench_job = job  # type: ignore[attr-defined]  # so cancel() reaches the job
        return out

    @staticmethod
    def cancel(futures: Sequence[Future]) -> None:
        for fut in futures:
            job = getattr(fut, "_imagebench_job", None)
            if job is not None:
                job.cancel()

    def worker_pids(self) -> list[int]:
        return sorted(p.pid for p in (self._executor._processes or {}).values() if p.pid)  # noqa: SLF001

    def close(self) -> None:
        self._finalizer()


def tokenizer_backend_if_identical(tokenizer: Any, probe_text: str) -> Any:
    """The parent's Rust tokeniser if it gives exactly the ids of ``tokenizer(...)`` on
    ``probe_text`` (a rendered prompt with image pads), else None (the parent then tokenises)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "encode"):
        return None
    try:
        ours = list(backend.encode(probe_text, add_special_tokens=True).ids)
        theirs = list(tokenizer([probe_text], add_special_tokens=True, padding=False)["input_ids"][0])
    except Exception:  # noqa: BLE001 - any trouble: tokenise in the parent, as before
        return None
    return backend if ours == theirs else None


__all__ = [
    "BrokenProcessPool",
    "PreparePool",
    "PreparedImage",
    "default_preprocess_workers",
    "tokenizer_backend_if_identical",
]
