"""HPSv3Scorer: load once, score (image, prompt) pairs in batches, report the scorer identity.

Batches are prepared (decode, resize, patchify, tokenise) on a worker thread while the previous
batch runs on the device. A CUDA out-of-memory error halves the batch and retries, down to 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from schemas.reference import ScorerIdentity, ScorerRuntime

from .model import (
    INSTRUCTION_TEMPLATE,
    REWARD_SUFFIX,
    EncodedItem,
    BASE_MODEL_ALLOW_PATTERNS,
    LoadedHPSv3,
    check_rope_mode,
    checkpoint_is_uncalibrated,
    collate,
    encode_items,
    load_hpsv3,
    resolve_device,
    resolve_dtype,
    read_base_config,
    resolve_base_model,
    resolve_checkpoint,
    validate_prompt,
)
from .preprocess import ImageInput, PreprocessedImage, VisionPreprocessConfig, preprocess_image

SCORER_NAME = "hpsv3"
# Files whose content decides the token ids the model sees (config and processor are hashed apart).
TOKENIZER_FILES = tuple(n for n in BASE_MODEL_ALLOW_PATTERNS if n not in ("config.json", "preprocessor_config.json"))
HASH_CHUNK_BYTES = 8 * 1024 * 1024
SHA_CACHE_FILENAME = "checkpoint-sha256.json"

BatchRunner = Callable[[Sequence[EncodedItem]], np.ndarray]


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
    count = threads or len(os.sched_getaffinity(0))
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


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
    ) -> None:
        self.loaded = loaded
        self.base_model = base_model
        # Demo/random checkpoints carry the flag in their metadata: no caller can forget it.
        self.uncalibrated = uncalibrated or checkpoint_is_uncalibrated(loaded.checkpoint_path)
        # Injectable so the OOM path can be exercised on CPU.
        self.batch_runner: BatchRunner = batch_runner or self.run_batch

    @classmethod
    def load(
        cls,
        base_model: str,
        checkpoint: str,
        device: str = "auto",
        dtype: str = "auto",
        uncalibrated: bool = False,
        rotary: str = "official",
    ) -> "HPSv3Scorer":
        """``base_model``: local HF-layout dir or HF id; ``checkpoint``: local .safetensors or HF
        repo id holding HPSv3.safetensors. ``uncalibrated`` marks demo/random weights (also detected
        from the checkpoint's metadata, as written by ``tiny.write_tiny_checkpoint``). ``rotary``:
        "official" (bf16-rounded frequencies, as trained) or "float32" (docs/HPSV3.md)."""
        loaded = load_hpsv3(base_model, checkpoint, device=device, dtype=dtype, rope_mode=check_rope_mode(rotary))
        return cls(loaded, str(base_model), uncalibrated)

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

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
