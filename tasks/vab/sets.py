"""VAB set collections: import, pin, load.

A collection (``--sets S``) comes from our JSONL manifest (:func:`import_manifest`) or from the
official release's Parquet files (:func:`import_release`, tasks.vab.release). Every image goes through the ingest
validation (tasks.store.ingest.inspect_image), is hashed and copied into the workspace's
content-addressed image cache; the tasks are validated by schemas.vab.VabTask.

Bad input (fewer than 2 images, best/worst out of range, a worst label on a 2-image set, the same
image twice in a set, a task id used twice, an image that fails ingest) is named by task id, one
line per bad task, all of them at once; nothing is written unless ``skip_bad`` keeps the good
tasks (the rejected ones are then recorded beside the pinned copy).

Pinned copy: ``$IMAGEBENCH_HOME/vab/sets/<S>/tasks.jsonl`` plus ``pin.json`` (its sha256, source,
rejected tasks, trial scheme: :func:`trial_scheme`). Create-once: importing the same content again is a no-op, other content under
the same name is refused. The lake table ``vab_tasks`` (partition ``sets=<S>``) holds the same
rows for SQL. :func:`load_sets` reads the pinned copy and checks its hash.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from schemas.vab import DOMAINS, MAX_IMAGES, MIN_IMAGES, TRIAL_SCHEME_LEGACY, TRIAL_SCHEME_OFFICIAL, TRIAL_SCHEMES, VabTask
from tasks.store.ingest import DEFAULT_LIMITS, ImageLimits, Rejected, cache_image, cache_relpath, inspect_image
from tasks.store.durable import atomic_write
from tasks.vab.rawtask import RawTask
from tasks.vab.tables import check_set_name, read_csv_with_header, write_partition

PIN_DIR = "vab/sets"
TASKS_FILE = "tasks.jsonl"
PIN_FILE = "pin.json"
PIN_FORMAT = "imagebench-vab-sets/1"


class BadSets(ValueError):
    """Some tasks of an import are invalid: ``problems`` maps task id (or line) to the reason."""

    def __init__(self, source: str, problems: dict[str, str]):
        self.problems = problems
        lines = "; ".join(f"task {k}: {v}" for k, v in problems.items())
        super().__init__(f"{source}: {len(problems)} bad task(s), nothing imported: {lines}")


def _name(raw: RawTask) -> str:
    return repr(raw.task_id) if isinstance(raw.task_id, str) and raw.task_id else raw.where


def _short(exc: ValidationError, task_id: Any) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ").removeprefix(f"task {task_id!r}: ")  # named once, by the caller
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def validate_tasks(raws: Sequence[RawTask], home: Path, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[list[VabTask], dict[str, str], dict[str, tuple[str, bytes]]]:
    """Validate every task; returns (good tasks with images as cache paths, problems by task,
    image bytes to cache by sha256). Nothing is written here."""
    problems: dict[str, str] = {}
    ids = Counter(r.task_id for r in raws if isinstance(r.task_id, str))
    good: list[VabTask] = []
    blobs: dict[str, tuple[str, bytes]] = {}
    for raw in raws:
        name = _name(raw)
        if isinstance(raw.task_id, str) and ids[raw.task_id] > 1:
            problems[name] = f"task id used {ids[raw.task_id]} times in this import"
            continue
        if raw.domain not in DOMAINS:
            problems[name] = f"domain {raw.domain!r} is not one of {', '.join(DOMAINS)}"
            continue
        if not MIN_IMAGES <= len(raw.images) <= MAX_IMAGES:
            problems[name] = f"{len(raw.images)} image(s); a task has {MIN_IMAGES} to {MAX_IMAGES}"
            continue
        names = [n for n, _ in raw.images]
        if len(set(names)) != len(names):
            dup = next(n for n, c in Counter(names).items() if c > 1)
            problems[name] = f"image {dup} appears twice in the set"
            continue
        rels, shas, mine = [], [], {}
        try:
            for img_name, load in raw.images:
                try:
                    data = load()
                except OSError as exc:
                    raise Rejected("not_decodable", f"{img_name}: cannot read: {exc.strerror or exc}") from None
                info = inspect_image(data, img_name, limits)
                sha = hashlib.sha256(data).hexdigest()
                rels.append(cache_relpath(sha, info.format))
                shas.append(sha)
                mine[sha] = (info.format, data)
        except Rejected as exc:
            problems[name] = f"image rejected by ingest validation: {exc}"
            continue
        if len(set(shas)) != len(shas):
            i, j = [k for k, s in enumerate(shas) if shas.count(s) > 1][:2]
            problems[name] = f"images {names[i]} and {names[j]} have the same content (duplicate image)"
            continue
        try:
            task = VabTask(task_id=raw.task_id, domain=raw.domain, substyle=raw.substyle, images=rels,
                           image_sha256=shas, best=raw.best, worst=raw.worst, expert_labels=raw.expert_labels,
                           labels=raw.labels)
        except ValidationError as exc:
            problems[name] = _short(exc, raw.task_id)
            continue
        good.append(task)
        blobs.update(mine)
    return good, problems, blobs


def _pin_dir(settings: Any, name: str) -> Path:
    return Path(settings.home) / PIN_DIR / check_set_name(name)


def _tasks_jsonl(tasks: Sequence[VabTask]) -> bytes:
    # `labels` only where the release has them: a manifest pinned before the field existed keeps its hash
    return "".join(t.model_dump_json(exclude={"labels"} if t.labels is None else None) + "\n" for t in tasks).encode()


def _lake_rows(name: str, tasks: Sequence[VabTask]) -> pa.Table:
    from schemas.vab import VAB_TASKS

    return pa.Table.from_pylist(
        [{"sets": name, "task_id": t.task_id, "domain": t.domain, "substyle": t.substyle, "n_images": len(t.images),
          "image_uris": list(t.images), "image_sha256": list(t.image_sha256), "best": t.best, "worst": t.worst}
         for t in tasks], schema=VAB_TASKS)


@dataclass(frozen=True)
class ImportResult:
    name: str
    tasks: int
    rejected: dict[str, str]
    already_pinned: bool
    pin_path: Path


def store_sets(settings: Any, name: str, raws: Sequence[RawTask], source: str, skip_bad: bool = False,
               limits: ImageLimits = DEFAULT_LIMITS, read_problems: dict[str, str] | None = None) -> ImportResult:
    """Validate, cache the images, pin the collection and write its ``vab_tasks`` partition.
    ``read_problems``: tasks the reader already rejected (reported with the others)."""
    from tasks.lake.tables import Lake

    check_set_name(name)
    home = Path(settings.home)
    tasks, problems, blobs = validate_tasks(raws, home, limits)
    problems = {**(read_problems or {}), **problems}
    if problems and not skip_bad:
        raise BadSets(source, problems)
    if not tasks:
        raise ValueError(f"{source}: no valid task to import" + (f" ({len(problems)} rejected)" if problems else ""))
    body = _tasks_jsonl(tasks)
    sha = hashlib.sha256(body).hexdigest()
    pdir = _pin_dir(settings, name)
    pin = pdir / PIN_FILE
    if pin.is_file():
        old = json.loads(pin.read_text())
        if old.get("sha256") != sha:
            raise ValueError(f"set collection {name!r} is pinned with other content ({old.get('source')}, "
                             f"{old.get('tasks')} tasks): import under a new --name")
        write_partition(Lake(settings.lake_dir), "vab_tasks", name, _lake_rows(name, tasks))  # heal a lost lake
        return ImportResult(name, len(tasks), problems, True, pdir)
    from tasks.lake.validation import require_valid

    require_valid("vab_tasks", _lake_rows(name, tasks))  # before anything is cached, pinned or written
    for s, (fmt, data) in blobs.items():
        cache_image(home, s, fmt, data)
    pdir.mkdir(parents=True, exist_ok=True)
    atomic_write(pdir / TASKS_FILE, body)
    write_partition(Lake(settings.lake_dir), "vab_tasks", name, _lake_rows(name, tasks))
    meta = {"format": PIN_FORMAT, "name": name, "sha256": sha, "tasks": len(tasks), "source": source,
            "trial_scheme": TRIAL_SCHEME_OFFICIAL, "rejected": problems, "pinned_at": datetime.now(timezone.utc).isoformat()}
    atomic_write(pin, (json.dumps(meta, indent=2) + "\n").encode())  # last: the pin marks a complete import
    return ImportResult(name, len(tasks), problems, False, pdir)


def read_manifest(file: Path, problems: dict[str, str] | None = None) -> list[RawTask]:
    """Our JSONL manifest: one object per line with ``task_id``, ``domain``, ``images`` (paths
    relative to the file, stored order), ``best``, ``worst`` (1-based; null for 2 images) and
    optionally ``substyle``, ``expert_labels``. A line that is not a JSON object is named by line.
    Bad lines raise :class:`BadSets`, or are added to ``problems`` when it is given."""
    file = Path(file)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read the manifest: {exc}") from None
    base = file.parent
    collect = problems is not None
    raws: list[RawTask] = []
    problems = {} if problems is None else problems
    allowed = {"task_id", "domain", "substyle", "images", "best", "worst", "expert_labels"}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems[f"line {i}"] = f"not JSON: {exc.msg}"
            continue
        if not isinstance(obj, dict):
            problems[f"line {i}"] = "not a JSON object"
            continue
        tid = obj.get("task_id")
        key = repr(tid) if isinstance(tid, str) and tid else f"line {i}"
        unknown = sorted(set(obj) - allowed)
        missing = [k for k in ("task_id", "domain", "images", "best") if k not in obj]
        if unknown or missing:
            problems[key] = f"line {i}: " + "; ".join(
                ([f"unknown field(s) {unknown}"] if unknown else []) + ([f"missing field(s) {missing}"] if missing else []))
            continue
        images = obj["images"]
        if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
            problems[key] = f"line {i}: images must be a list of paths"
            continue
        loaders = []
        for p in images:
            path = Path(p) if Path(p).is_absolute() else base / p
            loaders.append((p, (lambda path=path: path.read_bytes())))
        raws.append(RawTask(f"line {i}", tid, obj["domain"], obj.get("substyle"), loaders, obj["best"],
                            obj.get("worst"), obj.get("expert_labels")))
    if problems and not collect:
        raise BadSets(str(file), problems)
    if not raws and not problems:
        raise ValueError(f"{file}: the manifest holds no task")
    return raws


def zero_based_hint(raws: Sequence[RawTask]) -> str | None:
    """Why the labels of ``raws`` look 0-based, or None. Positions are 1-based: a file where some
    task names position 0 and no task ever names its last image has every label shifted by one;
    ``--skip-bad`` would otherwise import the tasks whose shifted labels happen to be in range."""
    zeros = last = 0
    for r in raws:
        n = len(r.images)
        for v in (r.best, r.worst):
            if isinstance(v, int) and not isinstance(v, bool):
                zeros += v == 0
                last += v == n
    if zeros and not last:
        return (f"{zeros} label(s) name position 0 and none names a set's last image: best/worst look 0-based, "
                f"they are 1-based (add 1 to every best and worst); nothing imported")
    return None


def import_manifest(settings: Any, file: Path, name: str, skip_bad: bool = False) -> ImportResult:
    """`imagebench vab import-sets FILE.jsonl --name S`. A file whose labels look 0-based is
    refused whole, even with ``skip_bad`` (:func:`zero_based_hint`)."""
    check_set_name(name)
    problems: dict[str, str] = {}
    raws = read_manifest(file, problems)
    hint = zero_based_hint(raws)
    if hint:
        raise ValueError(f"{file}: {hint}")
    return store_sets(settings, name, raws, str(file), skip_bad, read_problems=problems)


def import_release(settings: Any, path: Path, name: str, skip_bad: bool = False) -> ImportResult:
    """The official release (gated: the user downloads it) from a local file or folder
    (tasks.vab.release)."""
    from tasks.vab.release import read_release

    check_set_name(name)
    problems: dict[str, str] = {}
    raws = read_release(Path(path), problems)
    return store_sets(settings, name, raws, str(path), skip_bad, read_problems=problems)


def import_any(settings: Any, path: Path, name: str, skip_bad: bool = False) -> ImportResult:
    """``vab import-sets``: a ``.parquet`` file or a folder is the official release, else our JSONL."""
    path = Path(path)
    if path.is_dir() or path.suffix == ".parquet":
        return import_release(settings, path, name, skip_bad)
    return import_manifest(settings, path, name, skip_bad)


LAKE_LABEL_COLUMNS = ("prompt_id", "domain", "models", "best", "worst")


def read_lake_labels(settings: Any, file: Path, problems: dict[str, str] | None = None) -> list[RawTask]:
    """Sets built from the lake (how our own judges are audited): a CSV with columns
    ``prompt_id,domain,models,best,worst``, one row per prompt of the workspace's suite:
    ``models`` the scored models whose images form the set (space-separated, stored order),
    ``best``/``worst`` model ids of that list (the experts' labels; ``worst`` empty for 2 models).
    Each image is the model's ``ok`` image of that prompt in the lake's ``images`` table (its
    content-addressed copy). The task id is the prompt id; the substyle is the prompt's category.
    Bad rows raise :class:`BadSets`, or are added to ``problems`` when it is given."""
    from tasks.lake.tables import Lake
    from tasks.store.storage import InvalidModelId, validate_model_id
    from tasks.runs.pinned import load_pinned_suite

    file = Path(file)
    reader = read_csv_with_header(file, LAKE_LABEL_COLUMNS)
    prompts = load_pinned_suite(settings).by_id
    recs = list(reader)
    wanted: set[str] = set()
    collect = problems is not None
    problems = {} if problems is None else problems
    for line, rec in enumerate(recs, 2):
        for m in (rec.get("models") or "").split():
            try:
                wanted.add(validate_model_id(m))
            except (InvalidModelId, ValueError) as exc:
                problems[repr(rec.get("prompt_id") or f"line {line}")] = f"line {line}: {exc}"
    if problems:
        raise BadSets(str(file), problems)  # a malformed model id: the file is not what we think
    images = Lake(settings.lake_dir).read("images", sorted(wanted)).to_pylist()
    by_key = {(r["model_id"], r["prompt_id"]): r for r in images if r["suite_version"] == settings.suite_version}
    raws = []
    home = Path(settings.home)
    for line, rec in enumerate(recs, 2):
        pid = (rec["prompt_id"] or "").strip()
        models = (rec["models"] or "").split()
        key = repr(pid) if pid else f"line {line}"
        if pid not in prompts:
            problems[key] = f"line {line}: prompt {pid!r} is not in suite {settings.suite_version}"
            continue
        loaders, missing = [], []
        for m in models:
            row = by_key.get((m, pid))
            if row is None or row["state"] != "ok" or not row["image_path"]:
                missing.append(f"{m} ({row['state'] if row else 'no image in the lake'})")
                continue
            loaders.append((m, (lambda p=home / row["image_path"]: p.read_bytes())))
        if missing:
            problems[key] = f"line {line}: no usable image of {', '.join(missing)}"
            continue

        def pos(model: str, what: str) -> int | None:
            model = (model or "").strip()
            if not model:
                return None
            if model not in models:
                raise ValueError(f"{what} {model!r} is not one of the set's models")
            return models.index(model) + 1

        try:
            best, worst = pos(rec["best"], "best"), pos(rec["worst"], "worst")
            if best is None:
                raise ValueError("no best label")
        except ValueError as exc:
            problems[key] = f"line {line}: {exc}"
            continue
        raws.append(RawTask(f"line {line}", pid, (rec["domain"] or "").strip(), prompts[pid].category, loaders,
                            best, worst))
    if problems and not collect:
        raise BadSets(str(file), problems)
    if not raws and not problems:
        raise ValueError(f"{file}: no set rows")
    return raws


def build_from_lake(settings: Any, file: Path, name: str, skip_bad: bool = False) -> ImportResult:
    """`imagebench vab build-sets LABELS.csv --name S`: see :func:`read_lake_labels`."""
    check_set_name(name)
    problems: dict[str, str] = {}
    raws = read_lake_labels(settings, file, problems)
    return store_sets(settings, name, raws, str(file), skip_bad, read_problems=problems)


def load_sets(settings: Any, name: str) -> list[VabTask]:
    """The pinned tasks of collection ``name``, in stored order (images as paths relative to the
    workspace home: see :func:`image_paths`)."""
    pdir = _pin_dir(settings, name)
    pin, body_path = pdir / PIN_FILE, pdir / TASKS_FILE
    if not pin.is_file():
        raise LookupError(f"set collection {name!r} not found: import it with imagebench vab import-sets FILE.jsonl --name {name}")
    meta = json.loads(pin.read_text())
    body = body_path.read_bytes()
    if hashlib.sha256(body).hexdigest() != meta.get("sha256"):
        raise ValueError(f"{body_path}: does not match its pin (sha256 in {pin}): the pinned copy was changed")
    return [VabTask.model_validate_json(line) for line in body.decode().splitlines() if line.strip()]


def trial_scheme(settings: Any, name: str) -> str:
    """The trial scheme recorded in the collection's pin (schemas.vab.TRIAL_SCHEMES); a pin made
    before schemes were recorded keeps the first one."""
    pin = _pin_dir(settings, name) / PIN_FILE
    if not pin.is_file():
        raise LookupError(f"set collection {name!r} not found: import it with imagebench vab import-sets FILE --name {name}")
    scheme = json.loads(pin.read_text()).get("trial_scheme", TRIAL_SCHEME_LEGACY)
    if scheme not in TRIAL_SCHEMES:
        raise ValueError(f"{pin}: unknown trial scheme {scheme!r}")
    return scheme


def image_paths(settings: Any, task: VabTask) -> list[Path]:
    """Absolute paths of the task's images (stored order) in the workspace image cache."""
    return [Path(settings.home) / rel for rel in task.images]
