"""What the static site shows: plain dataclasses, filled by an adapter (lake -> ReportData) or by
``ReportData.example()`` in tests. Nothing here reads the lake."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GroupScore", "ImageRow", "LeaderboardRow", "ReportData"]


@dataclass
class LeaderboardRow:
    """One model on the leaderboard. Scores are 0..100; ``None`` (or NaN) means "not computed"
    and is shown as a dash, sorted last."""

    model_id: str
    capability: float | None = None
    capability_lo: float | None = None
    capability_hi: float | None = None
    eps: float | None = None
    eps_lo: float | None = None
    eps_hi: float | None = None
    overall: float | None = None
    overall_lo: float | None = None
    overall_hi: float | None = None
    rank: int | None = None
    rank_best: int | None = None  # None: same as rank
    rank_worst: int | None = None  # None: same as rank
    coverage: float | None = None  # judge coverage, 0..1
    provisional: bool = False  # Capability/Overall not final (coverage < 1)
    complete: bool = True  # no EPS-eligible prompt lost
    uncalibrated: bool = False  # demo weights
    flags: list[str] = field(default_factory=list)  # extra flags shown as badges
    eps_prompts_scored: int | None = None
    eps_prompts_eligible: int | None = None
    judged: int | None = None  # prompts a judge decided (PASS/FAIL on an ok image)
    total: int | None = None  # prompts in the suite
    decided: int | None = None  # prompts with PASS/FAIL, missing and quarantined images (FAIL) included


@dataclass
class GroupScore:
    """A model's scores over one category or tag (heatmap cell)."""

    capability: float | None = None
    eps: float | None = None
    n: int | None = None  # prompts in the group (shown in the tooltip)
    decided: int | None = None  # prompts with PASS/FAIL (missing/quarantined images are FAIL)
    judged: int | None = None  # of those, decided by a judge (0: Capability is "not judged")
    passed: int | None = None  # PASS verdicts
    failed: int | None = None  # every FAIL the headline counts, no_image included
    no_image: int | None = None  # of those, missing or quarantined images (FAIL by rule)
    undecided: int | None = None  # ERROR, UNPARSABLE or not judged


@dataclass
class ImageRow:
    """One (model, prompt): the image, its HPSv3 mu and the judge's verdict."""

    model_id: str
    prompt_id: str
    category: str
    tag: str
    prompt: str
    question: str | None = None
    image_path: Path | str | None = None  # on disk; relative paths resolve against ReportData.image_root
    state: str = "ok"  # ok / missing / quarantined (anything else is shown as given)
    reason: str | None = None  # quarantine reason
    mu: float | None = None
    verdict: str | None = None  # PASS / FAIL / ERROR / UNPARSABLE / None (not judged)
    judge: str | None = None
    rationale: str | None = None
    eps_eligible: bool | None = None


@dataclass
class ReportData:
    """Everything the site shows. ``rows`` in any order (the site orders by rank, then Overall,
    then EPS); ``by_category[model_id][category]`` and ``by_tag[model_id][tag]`` feed the
    heatmaps; ``images`` is flat (grouped per model and category on the model pages)."""

    rows: list[LeaderboardRow]
    by_category: dict[str, dict[str, GroupScore]] = field(default_factory=dict)
    by_tag: dict[str, dict[str, GroupScore]] = field(default_factory=dict)
    images: list[ImageRow] = field(default_factory=list)
    categories: list[str] | None = None  # column order of the category heatmaps (default: suite order)
    tag_categories: dict[str, str] | None = None  # tag -> category (default: taken from images)
    image_root: Path | None = None  # base of relative ImageRow.image_path (the workspace)
    title: str = "imagebench leaderboard"
    meta: dict[str, str] = field(default_factory=dict)  # shown under the title: suite, reference, scorer...
    generated_at: str | None = None  # shown in the footer (kept out of the output when None: reproducible)

    @classmethod
    def example(cls, image_dir: Path | None = None) -> "ReportData":
        """A small, complete data set: 5 models, 6 categories, 12 tags, 24 prompts per model, with
        missing and quarantined images, an unjudged model, an uncalibrated flag and hostile text
        (``<script>`` in a rationale and a prompt). With ``image_dir``, writes small PNGs there
        (one deliberately unreadable) and points the image rows at them."""
        return _example(cls, image_dir)


# ---------------------------------------------------------------------------------------------
# Example data (deterministic)

_EX_CATEGORIES = {
    "Text Rendering": ["Signage", "Handwriting"],
    "Spatial Reasoning": ["Left/Right", "Counting"],
    "Human Realism": ["Hands", "Faces"],
    "Professional Studio": ["Product Shots", "Food"],
    "Graphical Design": ["Posters", "Bar Charts"],
    "Truthfulness": ["Landmarks", "Animals"],
}
_EX_MODELS = [
    # model_id, capability, eps, coverage, complete, (rank, rank_best, rank_worst)
    ("acme-diffusion-xl", 71.0, 63.5, 1.0, True, (1, 1, 2)),
    ("Nimbus.v2_beta", 64.0, 66.0, 1.0, True, (2, 1, 2)),
    ("pixelforge-3", 52.5, 48.2, 0.75, True, (3, 3, 3)),
    ("tiny-gan-0.1", 31.0, 35.4, 1.0, False, (4, 4, 4)),
    ("unjudged-model", None, 44.0, 0.0, True, (None, None, None)),
]
XSS_RATIONALE = (
    'The sign reads "OPEN". <script>window.__pwned = 1; document.title = "pwned"</script>'
    '<img src=x onerror="window.__pwned = 2"> & friends'
)


def _example(cls: type[ReportData], image_dir: Path | None) -> ReportData:
    import random

    rng = random.Random(1234)
    rows: list[LeaderboardRow] = []
    by_category: dict[str, dict[str, GroupScore]] = {}
    by_tag: dict[str, dict[str, GroupScore]] = {}
    images: list[ImageRow] = []
    tag_categories = {t: c for c, tags in _EX_CATEGORIES.items() for t in tags}
    if image_dir is not None:
        image_dir = Path(image_dir)
        image_dir.mkdir(parents=True, exist_ok=True)

    for mi, (model_id, cap, eps, cov, complete, (rank, rank_best, rank_worst)) in enumerate(_EX_MODELS):
        total = 24
        judged = round(total * cov)
        cap_hw = 9.0 if cap is not None else None
        eps_hw = 4.0
        overall = None if cap is None else 0.5 * cap + 0.5 * eps
        rows.append(
            LeaderboardRow(
                model_id=model_id,
                capability=cap,
                capability_lo=None if cap is None else cap - cap_hw,
                capability_hi=None if cap is None else min(100.0, cap + cap_hw),
                eps=eps,
                eps_lo=eps - eps_hw,
                eps_hi=eps + eps_hw,
                overall=overall,
                overall_lo=None if overall is None else overall - 5.0,
                overall_hi=None if overall is None else overall + 5.0,
                rank=rank,
                rank_best=rank_best,
                rank_worst=rank_worst,
                coverage=cov,
                provisional=cov < 1.0,
                complete=complete,
                uncalibrated=True,
                flags=["imported"] if model_id == "pixelforge-3" else [],
                eps_prompts_scored=20 - (2 if not complete else 0),
                eps_prompts_eligible=20,
                judged=judged,
                total=total,
                decided=judged,
            )
        )
        by_category[model_id] = {}
        by_tag[model_id] = {}
        n = 0
        for cat, tags in _EX_CATEGORIES.items():
            ccap = None if cap is None else max(0.0, min(100.0, cap + rng.uniform(-25, 25)))
            ceps = None if cat == "Text Rendering" else max(0.0, min(100.0, eps + rng.uniform(-15, 15)))
            by_category[model_id][cat] = GroupScore(ccap, ceps, 2 * len(tags))
            for tag in tags:
                tcap = None if ccap is None else max(0.0, min(100.0, ccap + rng.uniform(-20, 20)))
                teps = None if ceps is None else max(0.0, min(100.0, ceps + rng.uniform(-10, 10)))
                by_tag[model_id][tag] = GroupScore(tcap, teps, 2)
                for k in (1, 2):
                    pid = f"{tag.lower().replace('/', '-').replace(' ', '-')}-{k:02d}"
                    state, reason = "ok", None
                    if not complete and n == 3:
                        state = "missing"
                    elif not complete and n == 7:
                        state, reason = "quarantined", "not_decodable"
                    verdict = judge = rationale = None
                    if n < judged:
                        if state != "ok":
                            verdict, rationale = "FAIL", "No image: counted as a failure."
                        else:
                            verdict = rng.choice(["PASS", "PASS", "FAIL", "ERROR", "UNPARSABLE"] if cap else ["PASS"])
                            rationale = f"The image {'matches' if verdict == 'PASS' else 'does not match'} the prompt."
                        judge = "ocr+qwen-vl" if cat == "Text Rendering" else "qwen-vl"
                    if model_id == "acme-diffusion-xl" and pid == "signage-01":
                        rationale = XSS_RATIONALE
                    prompt = f"A photo for {tag} number {k}, with a sign that says 'OPEN'."
                    if pid == "signage-02":
                        prompt = 'A neon sign reading "<script>alert(1)</script>" & <b>bold</b>'
                    path = None
                    if state == "ok":
                        path = f"{model_id}/{pid}.png"
                        if image_dir is not None:
                            _write_example_png(
                                image_dir / path, mi, n, broken=(model_id, pid) == ("pixelforge-3", "faces-02")
                            )
                    images.append(
                        ImageRow(
                            model_id=model_id,
                            prompt_id=pid,
                            category=cat,
                            tag=tag,
                            prompt=prompt,
                            question=f"Does the image show {tag.lower()} as described?",
                            image_path=path,
                            state=state,
                            reason=reason,
                            mu=None if state != "ok" else round(rng.gauss(eps / 20.0 - 2.0, 1.0), 3),
                            verdict=verdict,
                            judge=judge,
                            rationale=rationale,
                            eps_eligible=cat != "Text Rendering",
                        )
                    )
                    n += 1
    return cls(
        rows=rows,
        by_category=by_category,
        by_tag=by_tag,
        images=images,
        categories=list(_EX_CATEGORIES),
        tag_categories=tag_categories,
        image_root=image_dir,
        title="imagebench leaderboard (example data)",
        meta={"suite": "example-v1", "reference": "v1", "scorer": "hpsv3 (demo weights)"},
    )


def _write_example_png(path: Path, model_index: int, n: int, broken: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if broken:  # an "ok" image whose file cannot be decoded: the site must show a placeholder
        path.write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
        return
    from PIL import Image, ImageDraw

    w, h = 160 + 40 * (n % 3), 160  # a few aspect ratios
    hue = (model_index * 53 + n * 11) % 256
    img = Image.new("RGB", (w, h), (hue, 200 - hue // 2, 255 - hue))
    d = ImageDraw.Draw(img)
    d.ellipse((20, 20, w - 20, h - 20), fill=(255 - hue, hue, 120))
    d.rectangle((w // 3, h // 3, w // 2, h // 2), fill=(20, 20, 20))
    img.save(path, "PNG")
