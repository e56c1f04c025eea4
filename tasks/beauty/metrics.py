"""The pixel metrics the Beauty Index protocol argues against (issue 9 item 6), for the same images
the panel judged, so H1 and H4 are tested and not asserted: FID and KID against a reference image
folder, CLIP score, Inception Score, and imagebench's own HPSv3 mu. docs/BEAUTY.md ("Analysis").

- The metric arithmetic is torchmetrics' (``KernelInceptionDistance``, ``InceptionScore``,
  ``CLIPScore``); FID is the same formula as torchmetrics' ``FrechetInceptionDistance`` computed
  through an exact low-rank identity (``fid_from_features``, checked against torchmetrics in the
  tests) because the bootstrap needs it hundreds of times. The Inception network runs once per image
  (tasks/beauty/inception.py, the FID InceptionV3 with torch-fidelity's module names) and its
  features reach the torchmetrics classes through a pass-through module, so the bootstrap of FID
  resamples features, not images.
- Weights are local files the user gives (``load_networks``): the official FID Inception state
  dict (``weights-inception-2015-12-05-6726825d.pth``) and a CLIP model folder in Hugging Face
  layout (e.g. a download of openai/clip-vit-large-patch14). Nothing is fetched.
- ``tiny_random_networks`` builds randomly initialised networks of the same architectures (a tiny
  CLIP config; the InceptionV3 at a 75-pixel input), writes them as local files and loads them
  back through ``load_networks``: tests and the SIMULATED demo use them, and every row they give
  says ``weights = "TINY RANDOM"``.
- FID on a few images per tool is noisy and biased upward (its covariance has at most n - 1
  non-zero eigenvalues): each FID comes with a bootstrap interval, and ``FID_NOTE`` says so.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from schemas.study import HPS_UNCALIBRATED_NOTE, STUDY_PIXEL_METRICS

__all__ = [
    "FID_NOTE",
    "TINY_RANDOM",
    "MetricNetworks",
    "ToolImages",
    "fid_from_features",
    "load_networks",
    "pixel_metrics",
    "pixel_metrics_notes",
    "study_pixel_metrics",
    "tiny_random_networks",
]

TINY_RANDOM = "TINY RANDOM"
REAL = "real"
FID_NOTE = (
    "FID on a few images per tool is noisy (and biased upward): read it with its bootstrap interval "
    "(fid_lo, fid_hi); published FIDs use 10,000+ images."
)
_MARKER = "imagebench-tiny-random"  # in the tiny CLIP's config.json and beside the tiny Inception weights
_TINY_INCEPTION_INPUT = 75  # the smallest input the InceptionV3 topology accepts: fast on CPU
_BATCH = 16


@dataclass(frozen=True)
class ToolImages:
    """One image of a tool, as judged: its file and the prompt text it was made for."""

    path: Path
    prompt: str


@dataclass
class MetricNetworks:
    """The networks behind the pixel metrics. ``weights`` is "real" or "TINY RANDOM"."""

    inception: Any  # tasks.beauty.inception.FIDInceptionV3
    inception_input: int
    clip_model: Any  # transformers.CLIPModel
    clip_processor: Any  # transformers.CLIPProcessor
    weights: Literal["real", "TINY RANDOM"]
    hps: Any = None  # tasks.hpsv3.scorer.HPSv3Scorer, or None: hps_mu is then null


@contextlib.contextmanager
def no_download_bars():
    """transformers' tqdm bars off while it reads or writes local files (restored after)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def load_networks(inception_weights: str | Path, clip_model: str | Path, hps: Any = None) -> MetricNetworks:
    """Load the networks from local files: ``inception_weights`` (a PyTorch state dict of the FID
    InceptionV3), ``clip_model`` (a folder with a CLIP model and processor), ``hps`` an already
    loaded HPSv3 scorer or None. Files written by :func:`tiny_random_networks` come back labelled
    TINY RANDOM; any other weights are labelled real."""
    from transformers import CLIPModel, CLIPProcessor

    from tasks.beauty.inception import INPUT_IMAGE_SIZE, load_fid_inception

    inception_weights, clip_model = Path(inception_weights), Path(clip_model)
    if not inception_weights.is_file():
        raise FileNotFoundError(f"Inception weights {inception_weights}: no such file (give the local FID InceptionV3 state dict)")
    if not (clip_model / "config.json").is_file():
        raise FileNotFoundError(f"CLIP model {clip_model}: no config.json there (give a local CLIP model folder)")
    marker = inception_weights.with_name(inception_weights.name + ".tiny-random.json")
    tiny_inception = marker.is_file()
    size = json.loads(marker.read_text())["input_size"] if tiny_inception else INPUT_IMAGE_SIZE
    try:
        inception = load_fid_inception(str(inception_weights), input_size=size)
    except Exception as exc:
        raise ValueError(f"Inception weights {inception_weights}: not a FID InceptionV3 state dict ({exc})") from exc
    with no_download_bars():  # a local folder: a "Loading weights ... it/s" bar reads like a download
        model = CLIPModel.from_pretrained(clip_model, use_safetensors=True).eval()  # never a pickle
        processor = CLIPProcessor.from_pretrained(clip_model)
    tiny_clip = bool(getattr(model.config, _MARKER.replace("-", "_"), False))
    tiny_hps = bool(hps is not None and getattr(hps, "uncalibrated", False))
    weights = TINY_RANDOM if (tiny_inception or tiny_clip or tiny_hps) else REAL
    return MetricNetworks(inception, size, model, processor, weights, hps)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character map (the base of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_random_networks(directory: str | Path, seed: int = 0, hps: Any = None) -> MetricNetworks:
    """Randomly initialised networks of the real architectures, written under ``directory``
    (``inception.pt`` + its marker, ``clip/``) and loaded back with :func:`load_networks`. Their
    numbers mean nothing: every row they give says TINY RANDOM."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

    from tasks.beauty.inception import FIDInceptionV3

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        net = FIDInceptionV3(input_size=_TINY_INCEPTION_INPUT)
        # He initialisation keeps activations at unit scale through the ReLUs (PyTorch's default
        # shrinks them to ~1e-7 by the pool layer, which would make every FID ~0).
        for m in net.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        torch.save(net.state_dict(), directory / "inception.pt")
        (directory / "inception.pt.tiny-random.json").write_text(json.dumps({"input_size": _TINY_INCEPTION_INPUT, "note": TINY_RANDOM}))

        clip_dir = directory / "clip"
        clip_dir.mkdir(exist_ok=True)
        vocab: dict[str, int] = {}
        for suffix in ("", "</w>"):
            for c in _bytes_to_unicode().values():
                vocab[c + suffix] = len(vocab)
        for special in ("<|startoftext|>", "<|endoftext|>"):
            vocab[special] = len(vocab)
        (clip_dir / "vocab.json").write_text(json.dumps(vocab))
        (clip_dir / "merges.txt").write_text("#version: 0.2\n")
        tokenizer = CLIPTokenizer(str(clip_dir / "vocab.json"), str(clip_dir / "merges.txt"))
        config = CLIPConfig(
            text_config=dict(
                vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
                pad_token_id=vocab["<|endoftext|>"],
            ),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8),
            projection_dim=16,
        )
        setattr(config, _MARKER.replace("-", "_"), True)
        with no_download_bars():
            CLIPModel(config).save_pretrained(clip_dir)
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(clip_dir)
    finally:
        torch.random.set_rng_state(gen_state)
    return load_networks(directory / "inception.pt", clip_dir, hps)


# --------------------------------------------------------------------------------------------
class _Features(torch.nn.Module):
    """Pass-through "network" for the torchmetrics classes: the features were computed once."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _ProjectedCLIP(torch.nn.Module):
    """transformers 5 returns model outputs from ``get_*_features``; torchmetrics 1.9 wants the
    projected embedding tensors (its ``pooler_output``)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    @staticmethod
    def _tensor(out: Any) -> torch.Tensor:
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def get_image_features(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._tensor(self.model.get_image_features(*args, **kwargs))

    def get_text_features(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._tensor(self.model.get_text_features(*args, **kwargs))


def _load_rgb(path: Path):
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except Exception as exc:
        raise ValueError(f"image {path}: cannot be read ({exc})") from exc


def _inception_features(net: Any, size: int, paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Pool features [N, 2048] and unbiased logits [N, 1008], float64, images resized with PIL's
    antialiased bicubic filter (clean-fid's recommendation) to the network's input size."""
    from PIL import Image

    pools, logits = [], []
    for start in range(0, len(paths), _BATCH):
        batch = [np.asarray(_load_rgb(p).resize((size, size), Image.Resampling.BICUBIC)) for p in paths[start : start + _BATCH]]
        x = torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2).contiguous()
        with torch.inference_mode():
            pool, logit = net(x)
        pools.append(pool.double().numpy())
        logits.append(logit.double().numpy())
    return np.concatenate(pools), np.concatenate(logits)


def fid_from_features(real: np.ndarray, fake: np.ndarray) -> float:
    """FID between two feature sets, exact and fast when there are fewer images than features:
    the non-zero eigenvalues of S_r S_f are those of (A_r A_f^T)(A_r A_f^T)^T / ((n_r-1)(n_f-1))
    with A the centred features, so tr sqrt(S_r S_f) is the nuclear norm of A_r A_f^T scaled.
    Agrees with torchmetrics' FrechetInceptionDistance (tested); used for the bootstrap."""
    if len(real) < 2 or len(fake) < 2:
        raise ValueError(f"FID needs at least 2 images on each side, got {len(real)} reference and {len(fake)} generated")
    mu_r, mu_f = real.mean(axis=0), fake.mean(axis=0)
    a_r, a_f = real - mu_r, fake - mu_f
    c_r, c_f = len(real) - 1, len(fake) - 1
    trace_r = float((a_r * a_r).sum()) / c_r
    trace_f = float((a_f * a_f).sum()) / c_f
    cross = np.linalg.svd(a_r @ a_f.T, compute_uv=False).sum() / math.sqrt(c_r * c_f)
    return float(((mu_r - mu_f) ** 2).sum() + trace_r + trace_f - 2.0 * cross)


@contextlib.contextmanager
def _torch_seed(seed: int):
    """KID subsets and IS splits draw from torch's global generator: fork it, so results are
    reproducible and the caller's generator is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _kid(ref: np.ndarray, gen: np.ndarray, seed: int) -> float:
    from torchmetrics.image.kid import KernelInceptionDistance

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "will save all extracted features": a few per tool here
        kid = KernelInceptionDistance(feature=_Features(ref.shape[1]), subsets=100, subset_size=min(len(ref), len(gen), 1000))
    kid.update(torch.from_numpy(ref), real=True)
    kid.update(torch.from_numpy(gen), real=False)
    with _torch_seed(seed):
        mean, _ = kid.compute()
    return float(mean)


def _inception_score(logits: np.ndarray, seed: int) -> float:
    from torchmetrics.image.inception import InceptionScore

    # The published protocol uses 10 splits of 5,000 images; with a few images per tool, one split.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "will save all extracted features": a few per tool here
        metric = InceptionScore(feature=_Features(logits.shape[1]), splits=10 if len(logits) >= 100 else 1)
    metric.update(torch.from_numpy(logits))
    with _torch_seed(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the std over one split is undefined; only the mean is kept
        mean, _ = metric.compute()
    return float(mean)


def _clip_score(networks: MetricNetworks, paths: Sequence[Path], prompts: Sequence[str]) -> float:
    from torchmetrics.multimodal.clip_score import CLIPScore

    model = _ProjectedCLIP(networks.clip_model)
    metric = CLIPScore(model_name_or_path=lambda: (model, networks.clip_processor))
    for start in range(0, len(paths), _BATCH):
        images = [torch.from_numpy(np.array(_load_rgb(p))).permute(2, 0, 1).contiguous() for p in paths[start : start + _BATCH]]
        metric.update(images, list(prompts[start : start + _BATCH]))
    return float(metric.compute())


def pixel_metrics(
    tool_images: Mapping[str, Sequence[ToolImages]],
    reference_images: Sequence[str | Path] | None,
    networks: MetricNetworks,
    *,
    study_id: str = "",
    resamples: int = 200,
    seed: int = 0,
    confidence: float = 0.95,
) -> pa.Table:
    """One row per tool (schema ``STUDY_PIXEL_METRICS``, sorted by tool): FID with a bootstrap
    percentile interval (the tool's images and the reference images each resampled with
    replacement), KID, CLIP score (prompt vs image), Inception Score, HPSv3 mu (mean over the
    tool's images; null without a scorer), n_images, weights ("real" or "TINY RANDOM") and
    hps_uncalibrated (the scorer's weights are the demo's: every output marks the mu UNCALIBRATED).
    FID/KID are null without reference images. The table's schema metadata carries FID_NOTE."""
    if not tool_images:
        raise ValueError("pixel_metrics needs at least one tool with images")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    for tool, items in tool_images.items():
        if len(items) < 2:
            raise ValueError(f"tool {tool}: {len(items)} image(s); the pixel metrics need at least 2 per tool")
    ref = None
    if reference_images:
        refs = [Path(p) for p in reference_images]
        if len(refs) < 2:
            raise ValueError(f"reference images: {len(refs)} given; FID and KID need at least 2")
        ref, _ = _inception_features(networks.inception, networks.inception_input, refs)
    rng = np.random.default_rng(seed)
    a = (1.0 - confidence) / 2.0
    rows: dict[str, list[Any]] = {name: [] for name in STUDY_PIXEL_METRICS.names}
    for tool in sorted(tool_images):
        items = list(tool_images[tool])
        paths = [Path(i.path) for i in items]
        prompts = [i.prompt for i in items]
        pool, logits = _inception_features(networks.inception, networks.inception_input, paths)
        fid = fid_lo = fid_hi = kid = None
        if ref is not None:
            # torchmetrics' FrechetInceptionDistance gives the same number (tested) but takes the
            # eigenvalues of a 2048 x 2048 product (seconds per call): too slow to bootstrap.
            fid, kid = fid_from_features(ref, pool), _kid(ref, pool, seed)
            draws = [
                fid_from_features(ref[rng.integers(0, len(ref), len(ref))], pool[rng.integers(0, len(pool), len(pool))])
                for _ in range(resamples)
            ]
            fid_lo, fid_hi = (float(v) for v in np.quantile(draws, [a, 1.0 - a]))
        hps_mu = None
        if networks.hps is not None:
            hps_mu = float(np.mean(networks.hps.score(paths, prompts)[:, 0]))
        rows["study_id"].append(study_id)
        rows["tool"].append(tool)
        rows["fid"].append(fid)
        rows["fid_lo"].append(fid_lo)
        rows["fid_hi"].append(fid_hi)
        rows["kid"].append(kid)
        rows["clip_score"].append(_clip_score(networks, paths, prompts))
        rows["inception_score"].append(_inception_score(logits, seed))
        rows["hps_mu"].append(hps_mu)
        rows["n_images"].append(len(items))
        rows["weights"].append(networks.weights)
        rows["hps_uncalibrated"].append(None if hps_mu is None else bool(getattr(networks.hps, "uncalibrated", False)))
    table = pa.table(rows, schema=STUDY_PIXEL_METRICS)
    return table.replace_schema_metadata({"note": FID_NOTE, "weights": networks.weights})


def pixel_metrics_notes(table: pa.Table) -> list[str]:
    """The sentences every display of a pixel-metrics table must carry: the FID caveat with the
    images per tool, and TINY RANDOM when the networks were random."""
    if table.num_rows == 0:
        return []
    n = sorted(set(table.column("n_images").to_pylist()))
    notes = [f"{FID_NOTE} Images per tool here: {', '.join(str(x) for x in n)}."]
    if TINY_RANDOM in set(table.column("weights").to_pylist()):
        notes.append(f"{TINY_RANDOM}: these pixel metrics come from randomly initialised networks and mean nothing.")
    if any(table.column("hps_uncalibrated").to_pylist()):
        notes.append(HPS_UNCALIBRATED_NOTE)
    return notes


def study_pixel_metrics(settings: Any, definition: Any, study_dir: str | Path) -> pa.Table:
    """The pixel metrics of an opened study, on the blinded images the judges saw. Networks: the
    local files named by ``IMAGEBENCH_BEAUTY_INCEPTION_WEIGHTS`` and ``IMAGEBENCH_BEAUTY_CLIP_MODEL``
    (settings ``beauty_inception_weights`` / ``beauty_clip_model``) and the HPSv3 scorer of the
    settings; a SIMULATED study without them uses tiny random networks (TINY RANDOM on every row);
    a real study without them gets an empty table (H1 and H4 are then "not tested")."""
    from tasks.beauty.study import IMAGES_DIR, open_panel_store
    from tasks.beauty.suite import load_beauty_suite

    study_dir = Path(study_dir)
    inception = getattr(settings, "beauty_inception_weights", None)
    clip = getattr(settings, "beauty_clip_model", None)
    if not (inception and clip) and not definition.simulated:
        return STUDY_PIXEL_METRICS.empty_table()
    store = open_panel_store(settings, definition.study_id, missing_ok=True)  # None: never opened for a panel
    try:
        image_rows = store.image_rows() if store is not None else []
    finally:
        if store is not None:
            store.dispose()
    if not image_rows:
        return STUDY_PIXEL_METRICS.empty_table()
    suite = load_beauty_suite(settings.reference_dir, definition.suite)
    prompt_text = {p.prompt_id: p.prompt for p in suite.prompts}
    images_dir = study_dir / IMAGES_DIR
    by_tool: dict[str, list[ToolImages]] = {}
    for row in image_rows:
        path = next(images_dir.glob(f"{row['image_id']}.*"), None)
        if path is None:
            raise FileNotFoundError(f"study {definition.study_id}: blinded image {row['image_id']} missing under {images_dir}")
        by_tool.setdefault(row["tool"], []).append(ToolImages(path, prompt_text.get(row["prompt_id"], row["prompt_id"])))
    hps = _hps_scorer(settings)
    if inception and clip:
        networks = load_networks(inception, clip, hps)
    else:
        networks = tiny_random_networks(study_dir / "tiny-random-networks", seed=definition.analysis.seed, hps=hps)
    references = None
    if definition.reference_images:
        folder = Path(definition.reference_images)
        references = sorted(p for p in folder.iterdir() if p.suffix.lower() in {".png", ".jpg", ".jpeg", ".webp"}) if folder.is_dir() else None
        if not references:
            raise FileNotFoundError(f"reference_images {folder}: no .png/.jpg/.webp images there")
    return pixel_metrics(by_tool, references, networks, study_id=definition.study_id, seed=definition.analysis.seed)


def _hps_scorer(settings: Any) -> Any:
    from tasks.hpsv3.scorer import HPSv3Scorer

    return HPSv3Scorer.load(
        settings.hpsv3_base_model, settings.hpsv3_checkpoint, device=settings.device, dtype=settings.dtype, rotary=settings.hpsv3_rotary
    )
