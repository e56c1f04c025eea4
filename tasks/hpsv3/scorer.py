"""HPSv3Scorer: load once, score (image, prompt) pairs in batches, report the scorer identity.

Batches are prepared (decode, resize, patchify, tokenise) ahead of the device: by a pool of worker
processes (``tasks.hpsv3.pool``; the default on CUDA) or, with 0 workers, on one thread beside
the forward (the default on CPU). Both give the same bits. A CUDA out-of-memory error halves the
batch and retries, down to 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from schemas.reference import ScorerIdentity, ScorerRuntime

from .cpu import usable_cores
from .model import (
    INSTRUCTION_TEMPLATE,
    REWARD_SUFFIX,
    EncodedItem,
    BASE_MODEL_ALLOW_PATTERNS,
    REWARD_TOKEN,
    LoadedHPSv3,
    check_rope_mode,
    checkpoint_is_uncalibrated,
    collate,
    encode_items,
    load_hpsv3,
    resolve_device,
    resolve_dtype,
    read_base_config,
    render_text,
    resolve_base_model,
    resolve_checkpoint,
    validate_prompt,
)
from .pool import BrokenProcessPool, PreparedImage, PreparePool, default_preprocess_workers, tokenizer_backend_if_identical
from .preprocess import ImageInput, PreprocessedImage, VisionPreprocessConfig, preprocess_image

SCORER_NAME = "hpsv3"
# Files whose content decides the token ids the model sees (config and processor are hashed apart).
TOKENIZER_FILES = tuple(n for n in BASE_MODEL_ALLOW_PATTERNS if n not in ("config.json", "preprocessor_config.json"))
HASH_CHUNK_BYTES = 8 * 1024 * 1024
SHA_CACHE_FILENAME = "checkpoint-sha256.json"

BatchRunner = Callable[[Sequence[EncodedItem]], np.ndarray]
# Batches handed to the preprocessing pool ahead of the one on the device: two keep every worker
# busy across a batch boundary (images differ in cost) without holding many batches in memory.
POOL_PREFETCH_BATCHES = 2
CHAT_TEXT_CACHE_SIZE = 4096  # rendered prompts kept per scorer (a suite has 192)


# --- hashing -------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$IMAGEBENCH_HOME/cache`` if set, else ``~/.cache/imagebench``."""
    home = os.environ.get("IMAGEBENCH_HOME")
    return Path(home).expanduser() / "cache" if home else Path.home() / ".cache" / "imagebench"


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: str | Path, cache_dir: Path | None = None) -> str:
    """sha256 of a (possibly 16 GB) file, remembered in a JSON sidecar keyed by (realpath, size,
    mtime_ns) so it is computed once per file version. Cache trouble never fails the hash."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    cache_file = (cache_dir or default_cache_dir()) / SHA_CACHE_FILENAME
    key = json.dumps([real, stat.st_size, stat.st_mtime_ns])
    entries: dict[str, str] = {}
    try:
        loaded = json.loads(cache_file.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            entries = {k: v for k, v in loaded.items() if isinstance(v, str)}
    except (OSError, ValueError):
        pass
    if key in entries:
        return entries[key]
    sha = _sha256_of_file(Path(real))
    entries[key] = sha
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache_file.parent, suffix=".tmp", delete=False, encoding="utf-8") as tmp:
            json.dump(entries, tmp, indent=1, sort_keys=True)
        os.replace(tmp.name, cache_file)  # atomic: concurrent readers never see half a file
    except OSError:
        pass
    return sha


def canonical_json_sha256(obj: Any) -> str:
    """sha256 of JSON with sorted keys and no whitespace (the repo's canonical form)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def instruction_sha256() -> str:
    """sha256 of the text template sent per image: instruction (with ``{text_prompt}``) + suffix."""
    return hashlib.sha256((INSTRUCTION_TEMPLATE + REWARD_SUFFIX).encode("utf-8")).hexdigest()


# --- identity --------------------------------------------------------------------------------
def tokenizer_files_sha256(base_dir: Path) -> str:
    """sha256 over the tokenizer and chat-template files present in the base model directory."""
    digest = hashlib.sha256()
    for name in sorted(TOKENIZER_FILES):
        path = Path(base_dir) / name
        if path.is_file():
            digest.update(f"{name}\0{_sha256_of_file(path)}\n".encode())
    return digest.hexdigest()


def numerics_label(torch_dtype: torch.dtype, rope_mode: str) -> str:
    """The arithmetic that decides mu beyond the weights, in one label: compute dtype + the
    rotary mode actually loaded (``LoadedHPSv3.rope_mode``; a runtime property, recorded in
    :class:`ScorerRuntime`). No default: a label must never claim a mode that was not loaded."""
    return f"{str(torch_dtype).removeprefix('torch.')}+rope-{check_rope_mode(rope_mode)}"


def build_identity(
    base_model: str,
    checkpoint_path: Path,
    base_config: dict[str, Any],
    vision: VisionPreprocessConfig,
    uncalibrated: bool,
    base_dir: Path,
) -> ScorerIdentity:
    """The model part of what decides mu (must equal the reference's); how it is run (library
    versions, device, dtype, rotary mode) is the :class:`ScorerRuntime`, checked by the canary."""
    base = Path(base_model).expanduser()
    # A local directory is named by its basename so the identity does not depend on the machine.
    base_name = base.name if base.is_dir() else base_model
    return ScorerIdentity(
        scorer_name=SCORER_NAME,
        source="hpsv3",
        checkpoint_sha256=file_sha256(checkpoint_path),
        base_model=base_name,
        base_config_sha256=canonical_json_sha256(base_config),
        preprocessing=vision.describe(),
        instruction_sha256=instruction_sha256(),
        tokenizer_sha256=tokenizer_files_sha256(base_dir),
        uncalibrated=uncalibrated or checkpoint_is_uncalibrated(checkpoint_path),
    )


def resolve_identity(base_model: str, checkpoint: str, uncalibrated: bool = False) -> ScorerIdentity:
    """The identity of ``HPSv3Scorer.load(base_model, checkpoint, ...)`` without loading any
    weights (the checkpoint hash is computed once per file version and cached)."""
    base_dir = resolve_base_model(base_model)
    return build_identity(
        str(base_model),
        resolve_checkpoint(checkpoint),
        read_base_config(base_dir),
        VisionPreprocessConfig.from_preprocessor_config(base_dir),
        uncalibrated,
        base_dir,
    )


# --- batching with OOM back-off --------------------------------------------------------------
def run_with_oom_backoff(
    items: Sequence[EncodedItem],
    runner: BatchRunner,
    batch_size: int,
    on_oom: Callable[[], None] | None = None,
    on_done: Callable[[int], None] | None = None,
    sizes_out: list[int] | None = None,
) -> tuple[np.ndarray, int]:
    """Run ``items`` in sub-batches of at most ``batch_size``, in order. On
    ``torch.cuda.OutOfMemoryError`` halve the size and retry the same items; at size 1, re-raise.
    Returns the [len(items), 2] results and the batch size that worked (for the next call);
    ``sizes_out`` gets, per item, the batch size its forward pass ran under (recorded: it decides
    the padding and GEMM shapes, hence the last bits of mu)."""
    results: list[np.ndarray] = []
    size, start = max(1, batch_size), 0
    while start < len(items):
        chunk = items[start : start + size]
        try:
            out = np.asarray(runner(chunk))
        except torch.cuda.OutOfMemoryError:
            if size == 1:
                raise
            size = max(1, min(size, len(chunk)) // 2)
            if on_oom is not None:
                on_oom()
            continue
        if out.shape[0] != len(chunk):
            raise RuntimeError(f"batch runner returned {out.shape[0]} rows for {len(chunk)} items")
        results.append(out)
        if sizes_out is not None:
            sizes_out.extend([size] * len(chunk))
        start += len(chunk)
        if on_done is not None:
            on_done(len(chunk))
    stacked = np.concatenate(results) if results else np.empty((0, 2), dtype=np.float64)
    return stacked, size


def pin_intra_op_threads(threads: int = 0) -> int:
    """Set torch's intra-op thread count to ``threads`` (0: the cores this process may run on,
    whatever OMP_NUM_THREADS its launcher set) and return it. Every scoring process calls this,
    so a CLI run, an in-process flow and a Dask worker use the same count."""
    count = threads or usable_cores()
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def _pool_broken(pool: PreparePool) -> bool:
    return bool(getattr(pool._executor, "_broken", False))  # noqa: SLF001


def _release_cuda_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- scorer ----------------------------------------------------------------------------------
class HPSv3Scorer:
    """The HPSv3 reward model behind ``score(images, prompts) -> [N, 2] (mu, sigma)``."""

    def __init__(
        self,
        loaded: LoadedHPSv3,
        base_model: str,
        uncalibrated: bool = False,
        batch_runner: BatchRunner | None = None,
        preprocess_workers: int | None = None,
    ) -> None:
        self.loaded = loaded
        self.base_model = base_model
        # Demo/random checkpoints carry the flag in their metadata: no caller can forget it.
        self.uncalibrated = uncalibrated or checkpoint_is_uncalibrated(loaded.checkpoint_path)
        # Injectable so the OOM path can be exercised on CPU.
        self.batch_runner: BatchRunner = batch_runner or self.run_batch
        if preprocess_workers is not None and preprocess_workers < 0:
            raise ValueError(f"preprocess_workers must be >= 0 (0: one thread, no processes), got {preprocess_workers}")
        # None: default_preprocess_workers(device) (IMAGEBENCH_HPSV3_PREPROCESS_WORKERS, docs/HPSV3.md).
        self.preprocess_workers = preprocess_workers
        self._pool: PreparePool | None = None
        self._pool_lock = threading.RLock()
        self._chat_texts: dict[str, str] = {}

    @classmethod
    def load(
        cls,
        base_model: str,
        checkpoint: str,
        device: str = "auto",
        dtype: str = "auto",
        uncalibrated: bool = False,
        rotary: str = "official",
        preprocess_workers: int | None = None,
    ) -> "HPSv3Scorer":
        """``base_model``: local HF-layout dir or HF id; ``checkpoint``: local .safetensors or HF
        repo id holding HPSv3.safetensors. ``uncalibrated`` marks demo/random weights (also detected
        from the checkpoint's metadata, as written by ``tiny.write_tiny_checkpoint``). ``rotary``:
        "official" (bf16-rounded frequencies, as trained) or "float32" (docs/HPSV3.md).
        ``preprocess_workers``: processes that prepare images (0: one thread; None: the default
        for the device, :func:`tasks.hpsv3.pool.default_preprocess_workers`)."""
        loaded = load_hpsv3(base_model, checkpoint, device=device, dtype=dtype, rope_mode=check_rope_mode(rotary))
        return cls(loaded, str(base_model), uncalibrated, preprocess_workers=preprocess_workers)

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    # -- the preprocessing pool --
    @property
    def workers(self) -> int:
        """Preprocessing worker processes ``score`` uses (0: one thread in this process)."""
        if self.preprocess_workers is not None:
            return self.preprocess_workers
        return default_preprocess_workers(self.loaded.device.type)

    def _prepare_pool(self, workers: int) -> PreparePool | None:
        """The scorer's pool, started on first use and reused by every later ``score`` call.
        None where this process may not start processes (a daemonic one, e.g. some Dask workers):
        then batches are prepared on one thread, with a warning. Thread-safe: concurrent ``score``
        calls (IMAGEBENCH_GPU_CONCURRENCY > 1) share one pool."""
        with self._pool_lock:
            if self._pool is not None and not self._pool.closed and self._pool.workers == workers:
                return self._pool
            self.close()
            loaded = self.loaded
            probe = render_text(loaded.tokenizer, loaded.chat_template, "a probe prompt", 4)
            backend = tokenizer_backend_if_identical(loaded.tokenizer, probe)
            try:
                self._pool = PreparePool(workers, loaded.vision, backend)
            except RuntimeError as exc:
                warnings.warn(f"HPSv3 preprocessing on one thread: {exc}", RuntimeWarning, stacklevel=3)
                return None
            return self._pool

    def close(self) -> None:
        """Stop the preprocessing workers (a later ``score`` starts new ones). Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "HPSv3Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @cached_property
    def identity(self) -> ScorerIdentity:
        loaded = self.loaded
        return build_identity(
            self.base_model,
            loaded.checkpoint_path,
            loaded.base_config,
            loaded.vision,
            self.uncalibrated,
            loaded.base_dir,
        )

    def runtime(self, batch_size: int) -> ScorerRuntime:
        """The runtime of a forward pass at ``batch_size`` in this process, as recorded per score."""
        import transformers

        loaded = self.loaded
        return ScorerRuntime(
            torch_version=torch.__version__,
            transformers_version=transformers.__version__,
            device=_device_label(loaded.device),
            dtype=str(loaded.dtype).removeprefix("torch."),
            rope_mode=loaded.rope_mode,
            attention=loaded.attention_impl,
            batch_size=batch_size,
            intra_op_threads=torch.get_num_threads(),
        )

    # -- steps (public so tests and tools can look at exactly what the model is fed) --
    def prepare(self, images: Sequence[ImageInput], prompts: Sequence[str], offset: int = 0) -> list[EncodedItem]:
        """Decode, resize, patchify and tokenise (no torch: runs on the prefetch thread)."""
        prepped: list[PreprocessedImage] = []
        for i, image in enumerate(images):
            try:
                prepped.append(preprocess_image(image, self.loaded.vision))
            except Exception as exc:
                label = image if isinstance(image, (str, Path)) else type(image).__name__
                raise ValueError(f"image {offset + i} ({label}): {exc}") from exc
        return encode_items(
            self.loaded.tokenizer, self.loaded.chat_template, prepped, prompts, self.loaded.reward_token_id
        )

    def _collect(
        self, futures: Sequence[Future], images: Sequence[ImageInput], prompts: Sequence[str], offset: int
    ) -> list[EncodedItem]:
        """The pool's results for one batch, in input order, as :meth:`prepare` would give them
        (same errors, same messages)."""
        prepared: list[PreparedImage] = []
        for i, fut in enumerate(futures):
            try:
                res = fut.result()
            except BrokenProcessPool as exc:
                raise RuntimeError(f"an HPSv3 preprocessing worker died while preparing image {offset + i}: {exc}") from exc
            if not isinstance(res, PreparedImage):  # the worker's error, named as prepare() names it
                image = images[i]
                label = image if isinstance(image, (str, Path)) else type(image).__name__
                raise ValueError(f"image {offset + i} ({label}): {res.message}")
            prepared.append(res)
        if any(p.input_ids is None for p in prepared):  # the parent tokenises, as prepare() does
            loaded = self.loaded
            return encode_items(
                loaded.tokenizer, loaded.chat_template, [p.image for p in prepared], prompts, loaded.reward_token_id
            )
        items = []
        for i, p in enumerate(prepared):
            if int((p.input_ids == self.loaded.reward_token_id).sum()) != 1:
                raise ValueError(f"item {i}: expected exactly one {REWARD_TOKEN} token after tokenisation")
            items.append(EncodedItem(p.input_ids, p.image.pixel_values, p.image.grid_thw))
        return items

    def prepare_with_pool(
        self, images: Sequence[ImageInput], prompts: Sequence[str], batch_size: int = 8, workers: int | None = None
    ) -> list[EncodedItem]:
        """:meth:`prepare` through the preprocessing pool (``workers``: default :attr:`workers`,
        at least 1), ``batch_size`` images per batch as ``score`` hands them out. For tests and
        benchmarks: exactly what the model is fed on the pool path."""
        pool = self._prepare_pool(max(1, self.workers if workers is None else workers))
        if pool is None:
            return self.prepare(images, prompts)
        out: list[EncodedItem] = []
        for _, items in self._pool_batches(pool, images, prompts, batch_size):
            out += items
        return out

    def _pool_batches(
        self, pool: PreparePool, images: Sequence[ImageInput], prompts: Sequence[str], batch_size: int
    ) -> Iterator[tuple[int, list[EncodedItem]]]:
        """(start, items) per batch, in input order. While the caller works on one batch, the next
        POOL_PREFETCH_BATCHES are in the workers. Leaving early cancels the jobs not started."""
        n = len(images)
        starts = range(0, n, batch_size)
        pending: deque[tuple[int, list[Future]]] = deque()
        next_k = 0
        try:
            for _ in starts:
                while next_k < len(starts) and len(pending) <= POOL_PREFETCH_BATCHES:
                    start = starts[next_k]
                    pending.append((start, self._submit(pool, images, prompts, start, min(start + batch_size, n))))
                    next_k += 1
                start, futures = pending.popleft()
                stop = start + len(futures)
                yield start, self._collect(futures, images[start:stop], prompts[start:stop], start)
        finally:
            for _, futures in pending:  # jobs not started are dropped; running ones finish and clean up
                PreparePool.cancel(futures)
            if pool.closed or _pool_broken(pool):
                self.close()  # a dead worker breaks the pool: the next call starts a fresh one

    def _submit(
        self, pool: PreparePool, images: Sequence[ImageInput], prompts: Sequence[str], start: int, stop: int
    ) -> list[Future]:
        futures = []
        for i in range(start, stop):
            futures.append(pool.submit(images[i], self._chat_text(prompts[i]) if pool.tokenizes else None))
        return futures

    def _chat_text(self, prompt: str) -> str:
        """The rendered chat text with one image pad, which the worker expands to the image's
        token count (as render_text does). Remembered per prompt: a nightly sends the same
        suite prompts for every model, and the parent's time per image limits the pool."""
        text = self._chat_texts.get(prompt)
        if text is None:
            if len(self._chat_texts) >= CHAT_TEXT_CACHE_SIZE:
                self._chat_texts.clear()
            loaded = self.loaded
            text = self._chat_texts[prompt] = render_text(loaded.tokenizer, loaded.chat_template, prompt, 1)
        return text

    def run_batch(self, items: Sequence[EncodedItem]) -> np.ndarray:
        """One forward pass: [len(items), 2] float64 (mu, sigma)."""
        device = self.loaded.device
        batch = {k: v.to(device) for k, v in collate(items, self.loaded.tokenizer.pad_token_id).items()}
        with torch.inference_mode():
            out = self.loaded.model(**batch)
        return out.float().cpu().numpy().astype(np.float64)

    def score(
        self,
        images: Sequence[ImageInput],
        prompts: Sequence[str],
        batch_size: int = 8,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """[N, 2] float64 (mu, sigma) in input order. ``progress`` gets the number of images
        finished by each sub-batch (an increment, as rich's ``advance``)."""
        return self.score_with_batch_sizes(images, prompts, batch_size, progress)[0]

    def score_with_batch_sizes(
        self,
        images: Sequence[ImageInput],
        prompts: Sequence[str],
        batch_size: int = 8,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """:meth:`score`, and per image the forward batch size it ran under (smaller than
        ``batch_size`` only after a CUDA out-of-memory halving)."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(images)
        out = np.empty((n, 2), dtype=np.float64)
        sizes: list[int] = []
        if n == 0:
            return out, sizes
        for i, prompt in enumerate(prompts):  # fail before any work is done
            try:
                validate_prompt(prompt)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"prompt {i}: {exc}") from exc
        starts = list(range(0, n, batch_size))
        workers = self.workers
        pool = self._prepare_pool(workers) if workers > 0 else None
        if pool is not None:
            return self._score_with_pool(pool, images, prompts, batch_size, progress, out, sizes)

        def prepare_chunk(start: int) -> list[EncodedItem]:
            stop = min(start + batch_size, n)
            return self.prepare([images[i] for i in range(start, stop)], [prompts[i] for i in range(start, stop)], start)

        current = batch_size
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpsv3-prepare")
        try:
            future = pool.submit(prepare_chunk, starts[0])
            for k, start in enumerate(starts):
                items = future.result()
                if k + 1 < len(starts):
                    future = pool.submit(prepare_chunk, starts[k + 1])  # overlaps the forward below
                scores, current = run_with_oom_backoff(
                    items, self.batch_runner, current, on_oom=_release_cuda_memory, on_done=progress, sizes_out=sizes
                )
                out[start : start + len(items)] = scores
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return out, sizes

    def _score_with_pool(
        self,
        pool: PreparePool,
        images: Sequence[ImageInput],
        prompts: Sequence[str],
        batch_size: int,
        progress: Callable[[int], None] | None,
        out: np.ndarray,
        sizes: list[int],
    ) -> tuple[np.ndarray, list[int]]:
        """The forward loop fed by the pool (:meth:`_pool_batches`)."""
        current = batch_size
        batches = self._pool_batches(pool, images, prompts, batch_size)
        try:
            for start, items in batches:
                scores, current = run_with_oom_backoff(
                    items, self.batch_runner, current, on_oom=_release_cuda_memory, on_done=progress, sizes_out=sizes
                )
                out[start : start + len(items)] = scores
        finally:
            batches.close()  # on an error in the forward: cancel the prefetched jobs now
        return out, sizes
