"""Small input files given on the command line: pairs for ad-hoc HPSv3, baseline model lists."""

from __future__ import annotations

import csv
from pathlib import Path


class InputFileError(ValueError):
    """A command-line input file is malformed; the message names the file and the line."""


def read_pairs(path: Path) -> tuple[list[Path], list[str]]:
    """``image,prompt`` CSV -> (image paths, prompts), in input order.

    Relative image paths are resolved against the CSV's own folder, so a pairs file and its
    images can be moved together. Every image is checked as ingest checks a model's images
    (``tasks.store.ingest.inspect_image``, the same function): one that ingest would quarantine
    (a 1x1 pixel, a truncated file, an animation) refuses the whole file, each such image named by
    line with ingest's reason, before any model is loaded; nothing is ever scored silently.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: pairs file not found")
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = {"image", "prompt"} - set(reader.fieldnames or [])
        if missing:
            raise InputFileError(f"{path}: missing column(s) {sorted(missing)}; expected header 'image,prompt'")
        images: list[Path] = []
        prompts: list[str] = []
        lines: list[int] = []
        for lineno, row in enumerate(reader, start=2):
            image, prompt = (row.get("image") or "").strip(), row.get("prompt") or ""
            if not image:
                raise InputFileError(f"{path}:{lineno}: empty image path")
            if not prompt.strip():
                raise InputFileError(f"{path}:{lineno}: empty prompt")
            p = Path(image)
            if not p.is_absolute():
                p = path.parent / p
            if not p.is_file():
                raise InputFileError(f"{path}:{lineno}: image {image!r} not found (looked at {p})")
            images.append(p)
            prompts.append(prompt)
            lines.append(lineno)
    if not images:
        raise InputFileError(f"{path}: no pairs")
    _refuse_what_ingest_refuses(path, images, lines)
    return images, prompts


def _refuse_what_ingest_refuses(path: Path, images: list[Path], lines: list[int]) -> None:
    """One line naming every image of the pairs file that ingest would quarantine, and why."""
    from tasks.store.ingest import Rejected, inspect_image

    refused = []
    for lineno, image in zip(lines, images):
        try:
            inspect_image(image.read_bytes(), image.name)
        except Rejected as exc:
            refused.append(f"{path}:{lineno}: {exc.reason}: {exc.detail}")
    if refused:
        what = "this image" if len(refused) == 1 else f"these {len(refused)} images"
        raise InputFileError(f"nothing scored: ingest refuses {what}: " + "; ".join(refused))


def read_baseline(path: Path) -> list[str]:
    """One model id per line; blank lines and '#' comments ignored; ids validated, no duplicates."""
    from tasks.store.storage import InvalidModelId, validate_model_id

    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: baseline file not found")
    models: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            validate_model_id(line)
        except InvalidModelId as exc:
            raise InputFileError(f"{path}:{lineno}: {exc}") from None
        if line in models:
            raise InputFileError(f"{path}:{lineno}: model {line!r} listed twice")
        models.append(line)
    if not models:
        raise InputFileError(f"{path}: no baseline model ids")
    return models
