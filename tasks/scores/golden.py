"""The golden-set canary: upgrade the runtime, keep the frozen reference.

A small pinned set of images (``reference/golden-<set>.jsonl`` + ``reference/golden-<set>/``) is
scored when a reference is built, and their mu are stored in the reference with the runtime
that gave them. Before a run scores anything, the same images are scored in the run's runtime
(library versions, device, dtype, rotary mode, attention kernel): within the tolerance of
:func:`tolerance_for` the run goes on and records its runtime; beyond it the run refuses, naming
the images and the drift. ``imagebench reference canary`` runs the same check on demand.

The comparison is a pure function (:func:`compare`); loading and scoring are thin wrappers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.reference import GoldenItem, GoldenMu, GoldenRecord, ReferenceFile, ScorerRuntime
from tasks.scores.reference import ReferenceError, ReferenceTampered, read_sha256sums

if TYPE_CHECKING:
    from tasks.scores.suite import Suite

DEFAULT_GOLDEN_SET = "golden-v1"

# Largest |mu(run) - mu(reference build)| on any golden image that still counts as "the same
# scorer", by compute dtype (the looser of the two runtimes' applies). How they were chosen
# (docs/REFERENCE.md, "Golden-set canary"):
# - float32: the same images in other forward batches move mu by <= 3e-7 and thread counts by 0
#   (tests/tasks/hpsv3/test_numerics.py); the float32 rotary mode, the smallest real arithmetic
#   change we know of, moves it by ~7e-4. 1e-4 is ~300x the noise and 7x under that change.
# - bfloat16: the CPU's kernels move it across machines: oneDNN's instruction set by 8.5e-3 on
#   the golden set (bench/bench_kernel_spread.py), MKL's by up to 7.3e-3 in the official code; a
#   machine that differs in both can add them (1.6e-2). 3e-2 covers that sum 1.9x and the largest
#   single spread 3.5x, so moving a reference to another CPU is not refused for its kernels. A
#   bf16 runtime cannot see changes as small as the rotary mode: use float32 to check those.
TOLERANCE_BY_DTYPE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-2}


class CanaryDrift(ReferenceError):
    """The run's runtime moves the golden set's mu beyond the tolerance: the run refuses."""


class GoldenSetError(ReferenceError):
    """The golden set is missing, unpinned or modified, or the reference has none."""


def manifest_filename(name: str) -> str:
    return f"{name}.jsonl"


@dataclass(frozen=True)
class GoldenSet:
    name: str
    manifest_sha256: str
    items: tuple[GoldenItem, ...]
    root: Path  # the reference directory (item files are relative to it)

    def paths(self) -> list[str]:
        return [str(self.root / it.file) for it in self.items]

    def prompts(self) -> list[str]:
        return [it.prompt for it in self.items]


def load_golden_set(reference_dir: str | Path, name: str = DEFAULT_GOLDEN_SET) -> GoldenSet:
    """Load and verify a golden set: its manifest pinned in SHA256SUMS, each image's sha256 as
    the manifest says. Raises :class:`GoldenSetError` / :class:`ReferenceTampered` naming the file."""
    root = Path(reference_dir)
    manifest = root / manifest_filename(name)
    if not manifest.is_file():
        raise GoldenSetError(f"{manifest}: golden set {name!r} not found (it ships in reference/; docs/REFERENCE.md)")
    data = manifest.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    pinned = read_sha256sums(root).get(manifest.name)
    if pinned is None:
        raise ReferenceTampered(f"{manifest} is not pinned in {root / 'SHA256SUMS'}")
    if pinned != digest:
        raise ReferenceTampered(f"{manifest} was modified: expected sha256 {pinned} (SHA256SUMS), actual {digest}")
    items = tuple(GoldenItem.model_validate_json(line) for line in data.decode().splitlines() if line.strip())
    if not items or len({it.item_id for it in items}) != len(items):
        raise GoldenSetError(f"{manifest}: empty, or an item id appears twice")
    for it in items:
        path = root / it.file
        if not path.is_file():
            raise GoldenSetError(f"{path}: golden image {it.item_id} is missing")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != it.sha256:
            raise ReferenceTampered(f"{path}: golden image {it.item_id} was modified: expected sha256 {it.sha256}, actual {actual}")
    return GoldenSet(name=name, manifest_sha256=digest, items=items, root=root)


def golden_record(golden: GoldenSet, mus: Sequence[float], runtime: ScorerRuntime) -> GoldenRecord:
    """What a reference stores: each golden image's mu under the runtime that built it."""
    return GoldenRecord(
        set=golden.name,
        manifest_sha256=golden.manifest_sha256,
        runtime=runtime,
        items=[GoldenMu(item_id=it.item_id, image_sha256=it.sha256, mu=float(m)) for it, m in zip(golden.items, mus, strict=True)],
    )


def tolerance_for(reference_dtype: str, run_dtype: str) -> float:
    """The tolerance between two runtimes: the looser of their dtypes' (an unknown dtype is refused)."""
    for dtype in (reference_dtype, run_dtype):
        if dtype not in TOLERANCE_BY_DTYPE:
            raise CanaryDrift(f"no canary tolerance is defined for dtype {dtype!r} (known: {sorted(TOLERANCE_BY_DTYPE)})")
    return max(TOLERANCE_BY_DTYPE[reference_dtype], TOLERANCE_BY_DTYPE[run_dtype])


@dataclass(frozen=True)
class CanaryResult:
    """The canary's verdict on one runtime (pure data: printed, logged, put in run records)."""

    golden_set: str
    reference_version: str
    tolerance: float
    drifts: dict[str, float]  # item id -> mu(run) - mu(reference build)
    runtime: ScorerRuntime
    reference_runtime: ScorerRuntime

    @property
    def max_drift(self) -> float:
        return max(abs(d) for d in self.drifts.values())

    @property
    def offenders(self) -> list[tuple[str, float]]:
        """Images beyond tolerance, largest drift first."""
        bad = [(k, d) for k, d in self.drifts.items() if abs(d) > self.tolerance]
        return sorted(bad, key=lambda kv: -abs(kv[1]))

    @property
    def passed(self) -> bool:
        return not self.offenders

    def runtime_changes(self) -> dict[str, tuple[Any, Any]]:
        a, b = self.reference_runtime.model_dump(), self.runtime.model_dump()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def describe(self) -> str:
        changes = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in self.runtime_changes().items()) or "none"
        head = (
            f"golden-set canary ({self.golden_set}, {len(self.drifts)} images) against reference "
            f"{self.reference_version}: max |drift| {self.max_drift:.3g} (tolerance {self.tolerance:g}); "
            f"runtime changes since the reference was built: {changes}"
        )
        if self.passed:
            return head
        worst = "; ".join(f"{k} {d:+.3g}" for k, d in self.offenders[:8])
        return (
            f"{head}. {len(self.offenders)} image(s) beyond tolerance: {worst}. This runtime does not "
            "reproduce the reference's scorer: run it in the reference's runtime, or build a new "
            "reference version in this one (docs/REFERENCE.md)"
        )

    def as_row(self) -> dict[str, Any]:
        return {
            "golden_set": self.golden_set, "reference_version": self.reference_version,
            "tolerance": self.tolerance, "max_drift": self.max_drift, "passed": self.passed,
            "runtime": self.runtime.model_dump(), "runtime_changes": {k: list(v) for k, v in self.runtime_changes().items()},
            "drifts": self.drifts,
        }


def compare(reference: ReferenceFile, golden: GoldenSet, mus: Sequence[float], runtime: ScorerRuntime) -> CanaryResult:
    """Pure: the run's golden mu against the reference's. The golden set must be the one the
    reference was built with (same manifest sha256)."""
    stored = reference.golden
    if stored is None:
        raise GoldenSetError(
            f"reference {reference.version} stores no golden-set mu, so this runtime cannot be checked "
            "against it (references of imported scores have none; others: build a new version)"
        )
    if stored.set != golden.name or stored.manifest_sha256 != golden.manifest_sha256:
        raise GoldenSetError(
            f"reference {reference.version} was built with golden set {stored.set} ({stored.manifest_sha256[:12]}), "
            f"not with {golden.name} ({golden.manifest_sha256[:12]})"
        )
    expected = {g.item_id: g.mu for g in stored.items}
    drifts = {it.item_id: float(m) - expected[it.item_id] for it, m in zip(golden.items, mus, strict=True)}
    return CanaryResult(
        golden_set=golden.name,
        reference_version=reference.version,
        tolerance=tolerance_for(stored.runtime.dtype, runtime.dtype),
        drifts=drifts,
        runtime=runtime,
        reference_runtime=stored.runtime,
    )


def score_golden(scorer: Any, golden: GoldenSet, batch_size: int) -> tuple[list[float], ScorerRuntime]:
    """The golden set's mu under ``scorer`` in this process's runtime, at ``batch_size``."""
    out, sizes = scorer.score_with_batch_sizes(golden.paths(), golden.prompts(), batch_size=batch_size)
    return [float(m) for m in out[:, 0]], scorer.runtime(max(sizes))


def run_canary(scorer: Any, reference: ReferenceFile, reference_dir: str | Path, batch_size: int) -> CanaryResult:
    """Score the reference's golden set now and compare; raises :class:`CanaryDrift` beyond tolerance."""
    if reference.golden is None:
        compare(reference, None, [], None)  # type: ignore[arg-type]  # raises GoldenSetError, named
    golden = load_golden_set(reference_dir, reference.golden.set)
    mus, runtime = score_golden(scorer, golden, batch_size)
    result = compare(reference, golden, mus, runtime)
    if not result.passed:
        raise CanaryDrift(result.describe())
    return result


def copy_golden_set(src_dir: str | Path, dst_dir: str | Path, name: str = DEFAULT_GOLDEN_SET) -> GoldenSet:
    """Copy a shipped golden set (manifest + images) into another reference directory (the demo's,
    a test's) and pin its manifest there; verified on both sides, existing copies kept as they are."""
    import shutil

    from tasks.scores.reference import pin_suite

    src = load_golden_set(src_dir, name)
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    manifest = dst / manifest_filename(name)
    if not manifest.exists():
        shutil.copyfile(Path(src_dir) / manifest.name, manifest)
    for it in src.items:
        target = dst / it.file
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(src_dir) / it.file, target)
    pin_suite(dst, manifest)
    return load_golden_set(dst, name)


# --- making a golden set (once; the files are then shipped and pinned) ------------------------

GOLDEN_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "horse", "camera", "logo", "retina", "hubble_deep_field", "brick", "colorwheel", "immunohistochemistry")
GOLDEN_PER_CATEGORY = 4


def _golden_prompts(suite: Suite) -> list[Any]:
    """4 prompts per category, each from another tag, in suite order: 24 over the 6 categories."""
    picked: dict[str, list[Any]] = {}
    tags: set[str] = set()
    for p in suite.prompts:
        chosen = picked.setdefault(p.category, [])
        if len(chosen) < GOLDEN_PER_CATEGORY and p.tag not in tags:
            chosen.append(p)
            tags.add(p.tag)
    return [p for ps in picked.values() for p in ps]


def _golden_image(index: int) -> Any:
    """A crop of a bundled public-domain scikit-image photo: sizes and aspect ratios vary (so
    smart_resize rounds both ways), one is greyscale and one keeps an alpha channel."""
    import numpy as np
    import skimage.data
    from PIL import Image

    name = GOLDEN_PHOTOS[index % len(GOLDEN_PHOTOS)]
    img = Image.fromarray(getattr(skimage.data, name)())
    if img.mode not in ("L", "RGBA"):
        img = img.convert("RGB")
    rng = np.random.default_rng(1000 + index)
    w = int(min(img.width, rng.integers(140, 260)))
    h = int(min(img.height, w * rng.uniform(0.6, 1.6)))
    x = int(rng.integers(0, img.width - w + 1))
    y = int(rng.integers(0, img.height - h + 1))
    return img.crop((x, y, x + w, y + h))


def write_golden_set(reference_dir: str | Path, suite: Suite, name: str = DEFAULT_GOLDEN_SET) -> Path:
    """Create ``reference/<name>.jsonl`` and ``reference/<name>/`` once and pin the manifest in
    SHA256SUMS (create-once, as the suite and references: an existing set is never rewritten)."""
    from tasks.scores.reference import pin_suite

    root = Path(reference_dir)
    manifest = root / manifest_filename(name)
    folder = root / name
    if manifest.exists() or folder.exists():
        raise GoldenSetError(f"{manifest} or {folder} exists: golden sets are immutable, choose a new name")
    folder.mkdir(parents=True)
    lines = []
    for i, prompt in enumerate(_golden_prompts(suite)):
        file = f"{name}/{i + 1:02d}-{prompt.prompt_id}.png"
        _golden_image(i).save(root / file, format="PNG", optimize=True)
        sha = hashlib.sha256((root / file).read_bytes()).hexdigest()
        item = GoldenItem(item_id=f"g{i + 1:02d}", file=file, sha256=sha, prompt_id=prompt.prompt_id, prompt=prompt.prompt)
        lines.append(json.dumps(item.model_dump(), sort_keys=True, ensure_ascii=False))
    with open(manifest, "x", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    pin_suite(root, manifest)
    return manifest
