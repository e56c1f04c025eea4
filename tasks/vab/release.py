"""The official VAB release as the authors' toolkit loads it (``load_dataset(..., split="test")``):
a folder as Hugging Face stores the dataset (``data/test-*.parquet``, read in name order) or one
Parquet file, one row per task with the columns

    task_id, domain (fine-art | illustration | photograph), substyle, n_images,
    images (list of Hugging Face Image structs {bytes, path}), labels (the images' letters, in
    the stored = trial-0 order), ground_truth_best, ground_truth_worst (letters)

Domains are mapped to ours one way (schemas.vab.RELEASE_DOMAINS); the letters are kept on the task
(``VabTask.labels``) and turned into 1-based positions (``best = labels.index(letter) + 1``). A
2-image task's ``ground_truth_worst`` must be the other letter (or null): our tasks have no worst
label for 2 images, and the official pick_worst asks for the other image. Extra columns are
ignored. A row that breaks these rules is named by task id; every image then goes through the same
ingest checks as our manifest (tasks.vab.sets.store_sets). An image struct without bytes is read
from its ``path`` only when that path, every symlink followed, lies inside the release's folder
(the folder given, or the one file's folder): an absolute path elsewhere, a ``..`` or a symlink
leading out is refused by task id and path, and nothing outside is read (docs/VAB.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.vab import RELEASE_DOMAINS
from tasks.vab.rawtask import RawTask

RELEASE_COLUMNS = ("task_id", "domain", "substyle", "n_images", "images", "labels", "ground_truth_best", "ground_truth_worst")
RELEASE_GLOB = "data/test-*.parquet"


def release_files(path: Path) -> list[Path]:
    """The Parquet files of the release at ``path`` (a file, or the dataset's folder)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob(RELEASE_GLOB) if p.is_file())
        if not files:
            raise ValueError(f"{path}: no {RELEASE_GLOB} in this folder (the Hugging Face layout of the release's test split)")
        return files
    if not path.is_file():
        raise ValueError(f"{path}: no such file or folder")
    return [path]


def release_root(path: Path) -> Path:
    """The release's folder, symlinks resolved: the folder given, or the folder of the one file."""
    path = Path(path)
    return Path(os.path.realpath(path if path.is_dir() else path.parent))


def _inside(root: Path, file: Path, k: int, rel: str) -> Path:
    """The real path of an image struct's ``path`` (relative to its Parquet file's folder, as the
    datasets library stores it) when it lies inside the release folder ``root`` after every
    symlink is followed; else ValueError naming the path. A release is someone else's file: it
    reads no file of the user's elsewhere (issue 24 item 8)."""
    real = Path(os.path.realpath(file.parent / rel))  # an absolute rel replaces file.parent
    if not real.is_relative_to(root):
        # Named as the release writes it: the reason is kept in the pin (no local path of the user's).
        raise ValueError(f"images[{k}] path {rel!r} is outside the release folder (symlinks followed): "
                         "a release's images are its own bytes or files inside its folder")
    return real


def _image_loaders(file: Path, i: int, images: list, root: Path) -> list:
    out = []
    for k, img in enumerate(images):
        label = f"{file.name}[{i}].images[{k}]"
        if not isinstance(img, dict):
            raise ValueError(f"images[{k}] is not a Hugging Face image struct {{bytes, path}}")
        data, rel = img.get("bytes"), img.get("path")
        name = rel or label
        if data is None:
            if not rel:
                raise ValueError(f"images[{k}] has neither bytes nor a path")
            p = _inside(root, file, k, rel)
            out.append((name, (lambda p=p: p.read_bytes())))
        else:
            out.append((name, (lambda d=data: d)))
    return out


def _positions(row: dict) -> tuple[list[str], int, int | None]:
    """(labels, best, worst) of a release row, 1-based; ValueError saying what is wrong."""
    labels, n = row["labels"], row["n_images"]
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
        raise ValueError(f"labels {labels!r} must be a list of letters")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels {labels} name an image twice")
    if n != len(labels) or n != len(row["images"] or []):
        raise ValueError(f"n_images={n} but {len(row['images'] or [])} image(s) and {len(labels)} label(s)")
    best, worst = row["ground_truth_best"], row["ground_truth_worst"]
    if best not in labels:
        raise ValueError(f"ground_truth_best {best!r} is not one of the labels {labels}")
    if n == 2:
        if worst is not None and worst != next(x for x in labels if x != best):
            raise ValueError(f"ground_truth_worst {worst!r} of a 2-image task must be the other image")
        return labels, labels.index(best) + 1, None
    if worst not in labels:
        raise ValueError(f"ground_truth_worst {worst!r} is not one of the labels {labels}")
    if worst == best:
        raise ValueError(f"ground_truth_best and ground_truth_worst are the same image ({best})")
    return labels, labels.index(best) + 1, labels.index(worst) + 1


def read_release(path: Path, problems: dict[str, str]) -> list[RawTask]:
    """The release's tasks; rows that break the layout's rules go to ``problems`` (by task id)."""
    import pyarrow.parquet as pq

    raws: list[RawTask] = []
    root = release_root(Path(path))
    for file in release_files(Path(path)):
        try:
            table = pq.read_table(file)
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            raise ValueError(f"{file}: not a readable Parquet file: {exc}") from None
        missing = [c for c in RELEASE_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{file}: not the VAB release layout: no column(s) {', '.join(missing)} "
                             f"(columns: {', '.join(table.column_names)}; expected {', '.join(RELEASE_COLUMNS)})")
        for i, row in enumerate(table.select(list(RELEASE_COLUMNS)).to_pylist()):
            tid = row["task_id"]
            key = repr(tid) if isinstance(tid, str) and tid else f"{file.name} row {i}"
            try:
                if row["domain"] not in RELEASE_DOMAINS:
                    raise ValueError(f"domain {row['domain']!r} is not one of {', '.join(RELEASE_DOMAINS)}")
                labels, best, worst = _positions(row)
                loaders = _image_loaders(file, i, row["images"], root)
            except ValueError as exc:
                problems[key] = str(exc)
                continue
            raws.append(RawTask(f"{file.name} row {i}", tid, RELEASE_DOMAINS[row["domain"]], row["substyle"], loaders,
                                best, worst, labels=labels))
    if not raws and not problems:
        raise ValueError(f"{path}: the release holds no task")
    return raws
