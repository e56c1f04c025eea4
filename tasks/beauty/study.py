"""A Beauty Index study's life: ``init`` (a study.yaml to edit), ``open`` (ingest, blind,
pre-register, draw orders, issue tokens), ``status``, ``close``. The web app is
tasks/beauty/panel.py (on the panel shell, tasks/panel/app.py).

State lives under ``$IMAGEBENCH_HOME/studies/<study_id>/`` (schemas/study.py): ``study.yaml``,
``preregistration.json`` (create-once, read-only, pinned in that folder's ``SHA256SUMS``),
``images/<opaque id>.jpg`` (the blinded copies), ``panel-store.json`` (which panel database the
study lives in, written once at open: tasks/panel/db.py) and ``panel.sqlite`` (tasks/beauty/store.py,
unless the study lives in PostgreSQL).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas.panel import PANEL_STORE_RECORD_FILE
from schemas.study import (
    HYPOTHESES,
    BlindingRecord,
    PUBLISHED_GROUP_SIZES,
    STUDY_ID_RE,
    PreRegistration,
    QualitySettings,
    StudyDefinition,
)

STUDY_FILE = "study.yaml"
PREREG_FILE = "preregistration.json"
SUMS_FILE = "SHA256SUMS"
IMAGES_DIR = "images"
MEMO_PREFIX = "studies/{study_id}/memos/"


class StudyError(ValueError):
    """A study that cannot be initialised, opened, read or closed as asked (one-line message)."""


# ---- where things are ------------------------------------------------------------------------


def study_dir(settings, study_id: str) -> Path:
    if not isinstance(study_id, str) or not STUDY_ID_RE.fullmatch(study_id):
        raise StudyError(f"invalid study id {study_id!r}: must match {STUDY_ID_RE.pattern}")
    return Path(settings.home) / "studies" / study_id


def memo_key(study_id: str, memo_id: str, ext: str) -> str:
    return MEMO_PREFIX.format(study_id=study_id) + f"{memo_id}.{ext}"


def canonical_definition(definition: StudyDefinition) -> bytes:
    data = definition.model_dump(mode="json")
    if definition.quality == QualitySettings():
        data.pop("quality")  # a field added later: at its default, studies opened before it keep their hash
    if definition.blinding is None:
        data.pop("blinding")  # likewise (issue 27 item 7)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def load_definition(path: Path) -> StudyDefinition:
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: study file not found (imagebench study init ID writes one)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a mapping of study settings")
    try:
        return StudyDefinition.model_validate(data)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'study'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in exc.errors())
        raise StudyError(f"{path}: {errs}") from None


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_sums(d: Path) -> dict[str, str]:
    p = d / SUMS_FILE
    if not p.is_file():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        if line.strip():
            digest, _, name = line.partition("  ")
            out[name] = digest
    return out


def verify_preregistration(d: Path) -> PreRegistration | None:
    """The study's pre-registration, checked against its SHA256SUMS line (None before ``open``)."""
    path = d / PREREG_FILE
    pinned = _read_sums(d).get(PREREG_FILE)
    if not path.is_file():
        if pinned:
            raise StudyError(f"{path} is missing but pinned in {d / SUMS_FILE}: restore it from a backup")
        return None
    actual = _sha256_file(path)
    if pinned is None:
        raise StudyError(f"{path} is not pinned in {d / SUMS_FILE} (an interrupted open?): the plan cannot be trusted")
    if actual != pinned:
        raise StudyError(f"{path} was modified after it was written: sha256 {actual}, pinned {pinned}")
    return PreRegistration.model_validate_json(path.read_bytes())


def load_study(settings, study_id: str) -> tuple[StudyDefinition, PreRegistration | None, Path]:
    """(definition, pre-registration or None before open, study folder). Refuses a tampered
    pre-registration and a study.yaml edited after ``open``."""
    d = study_dir(settings, study_id)
    definition = load_definition(d / STUDY_FILE)
    if definition.study_id != study_id:
        raise StudyError(f"{d / STUDY_FILE}: study_id is {definition.study_id!r}, but the folder is {study_id!r}")
    prereg = verify_preregistration(d)
    if prereg is not None and (d / "imported-bundle.json").is_file():
        # Imported from another lab's bundle (tasks/beauty/bundles.py): the definition it pinned
        # named judges that were never published, so its hash cannot be checked here; what the
        # analysis reads from the plan must still agree with study.yaml.
        plan = (prereg.suite, prereg.analysis, prereg.host_tool, list(prereg.praised_for_aesthetics))
        if plan != (definition.suite, definition.analysis, definition.host_tool, list(definition.praised_for_aesthetics)):
            raise StudyError(f"{d / STUDY_FILE} disagrees with the imported pre-registration (suite, analysis, host_tool, "
                             "praised_for_aesthetics): the plan is frozen; restore it")
    elif prereg is not None:
        got = hashlib.sha256(canonical_definition(definition)).hexdigest()
        if got != prereg.definition_sha256:
            raise StudyError(f"{d / STUDY_FILE} changed after the study was opened (sha256 {got[:12]}..., "
                             f"pre-registered {prereg.definition_sha256[:12]}...): the plan is frozen; restore it")
    return definition, prereg, d


def open_panel_store(settings, study_id: str, *, create: bool = False, missing_ok: bool = False):
    """The study's panel store, checked against the database the study was opened in (another one
    is refused, naming both). ``missing_ok``: None when there is none, and nothing is created;
    ``create`` only for ``open``."""
    from tasks.beauty.store import PanelStore

    d, db = study_dir(settings, study_id), getattr(settings, "panel_database", None)
    if missing_ok:
        return PanelStore.find(d, study_id, db, create=create)
    return PanelStore.open(d, study_id=study_id, database=db, create=create)


# ---- init ----------------------------------------------------------------------------------------


def template(study_id: str, tools: list[str], host_tool: str | None = None) -> str:
    """A study.yaml to edit: the published panel shape (20 anonymous labels in five groups)."""
    judges = [{"label": f"{g}-{i:02d}", "group": g} for g, n in PUBLISHED_GROUP_SIZES.items() for i in range(1, n + 1)]
    body = {
        "study_id": study_id,
        "title": f"Beauty Index study {study_id}",
        "suite": "beauty-index-v1",
        "question": "Did this make you feel something?",
        "memo": True,
        "tools": tools,
        "host_tool": host_tool,
        "praised_for_aesthetics": [],
        "judges": judges,
    }
    head = ("# Beauty Index study (docs/BEAUTY.md). Edit, then: imagebench study open " + study_id + "\n"
            "# tools: folders of the object store's beauty/" + body["suite"] + "/<tool>/<prompt_id>.png (one image per prompt of the suite)\n"
            "# judges: anonymous labels only (never names); groups default to the five published ones\n"
            "# blinding: {shape: letterbox|crop, aspect: \"1:1\"}: needed when the tools' images differ in aspect ratio\n")
    return head + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)


def init_study(settings, study_id: str, tools: list[str] | None = None, host_tool: str | None = None) -> Path:
    """Write ``studies/<id>/study.yaml`` (refuses to overwrite one). Tools default to every tool in
    the store's Beauty place (``beauty/<suite>/<tool>/``: tasks/beauty/images.py). The file is
    validated before it is written."""
    from tasks.store.storage import validate_model_id

    d = study_dir(settings, study_id)
    path = d / STUDY_FILE
    if path.exists():
        raise StudyError(f"{path} already exists: edit it, or pick another study id")
    if not tools:
        from schemas.study import BEAUTY_SUITE_VERSION
        from tasks.beauty.images import list_tools
        from tasks.beauty.suite import load_beauty_suite

        where, tools = list_tools(settings, load_beauty_suite(settings.reference_dir, BEAUTY_SUITE_VERSION))
        if not tools:
            raise StudyError(f"no tools in {where}: put each tool's images there (<tool>/<prompt_id>.png), "
                             "or name the tools with --tools")
    for t in tools:
        validate_model_id(t)
    text = template(study_id, list(tools), host_tool)
    try:
        StudyDefinition.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise StudyError(f"cannot write a study with tools {tools}: {exc.errors()[0]['msg']}") from None
    d.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(text)
    return path


# ---- open ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenedStudy:
    study_dir: Path
    preregistration: PreRegistration
    admin_token: str = field(repr=False)
    judge_tokens: dict[str, str] = field(repr=False)  # label -> token: shown once, stored hashed
    n_images: int = 0
    blinding_report: list[str] = field(default_factory=list)  # what `study open` prints (tasks/panel/blind.py)
    image_places: list[str] = field(default_factory=list)  # where the images were read (tasks/beauty/images.py), printed too


def judge_order(order_key: int | str, label: str, image_ids: list[str]) -> list[str]:
    """The judge's permutation of the study's images: a pure function of the study's order key
    (the private order secret; the published seed for studies opened before it was kept private,
    tasks/beauty/prereg.py) and the label (reproducible; a different order per judge)."""
    key = int.from_bytes(hashlib.sha256(f"{order_key}:{label}".encode()).digest()[:8], "big")
    out = list(image_ids)
    random.Random(key).shuffle(out)
    return out


def missing_images(ingested: dict[str, list[dict]]) -> dict[str, list[str]]:
    """``{tool: ["<prompt_id> (<state>[: reason])", ...]}`` for every prompt without a usable image."""
    out: dict[str, list[str]] = {}
    for tool, rows in ingested.items():
        bad = [f"{r['prompt_id']} ({r['state']}{': ' + r['reason'] if r.get('reason') else ''})"
               for r in rows if r["state"] != "ok"]
        if bad:
            out[tool] = bad
    return out


def _write_prereg(d: Path, prereg: PreRegistration) -> None:
    """Create-once: a complete temp file hard-linked to the name (fails if it exists), read-only,
    then pinned in SHA256SUMS."""
    from tasks.panel.db import write_once_read_only

    data = prereg.to_json_bytes()
    write_once_read_only(d / PREREG_FILE, data)
    with open(d / SUMS_FILE, "a", encoding="utf-8") as fh:
        fh.write(f"{hashlib.sha256(data).hexdigest()}  {PREREG_FILE}\n")
        fh.flush()
        os.fsync(fh.fileno())


def open_study(settings, study_id: str, now: datetime | None = None) -> OpenedStudy:
    """Open the study: every tool's images ingested with the usual validation (refused, naming
    them, when a tool lacks a usable image for some prompt), blinded, the pre-registration written
    once, per-judge orders drawn from its seed, tokens issued. Prints nothing; returns the tokens
    (the only time they exist in clear)."""
    from tasks.beauty.suite import load_beauty_suite
    from tasks.beauty.images import ingest_tools, place_lines
    from tasks.panel.blind import BLIND_EXTENSION, blind_study, opaque_id
    from tasks.panel.store import new_token, sha256_hex

    from tasks.beauty.prereg import commitment, create_order_secret, order_key

    now = now or datetime.now(UTC)
    definition, prereg, d = load_study(settings, study_id)
    existing = _answers_in_lake(settings, study_id)
    if existing:  # checked before the panel store is touched: a refused open leaves nothing behind
        # A plan written after the data is no pre-registration (issue 16, item 6).
        raise StudyError(f"study {study_id} already has {existing} answers (imported or simulated): a study is "
                         "pre-registered before its first answer, so it cannot be opened now; open a new study")
    # Read-only first (another database than the study's is refused here, naming both; nothing created).
    found = open_panel_store(settings, study_id, missing_ok=True)
    if found is not None:
        try:
            if found.exists():
                raise StudyError(f"study {study_id} is already open (imagebench study status {study_id}); its links were shown at open")
        finally:
            found.dispose()
    if prereg is not None and (d / IMAGES_DIR).exists() and not (d / PANEL_STORE_RECORD_FILE).exists():
        raise StudyError(f"study {study_id} has a pre-registration and blinded images but no record of the panel database "
                         "it was opened in (an older imagebench), and this database does not hold it: set "
                         "IMAGEBENCH_PANEL_DATABASE to the database it was opened in")
    store = None
    try:
        suite = load_beauty_suite(settings.reference_dir, definition.suite)
        placed = ingest_tools(settings, suite, definition.tools, now)  # each tool's place in the store, validated
        ingested = {tool: p.rows for tool, p in placed.items()}
        missing = missing_images(ingested)
        if missing:
            detail = "; ".join(f"{t}: {', '.join(v)} (under {placed[t].key_prefix})" for t, v in missing.items())
            raise StudyError(f"study {study_id} cannot open: tools missing usable images for some prompts of "
                             f"{suite.version}: {detail}")

        # Blind everything first, in memory: a study whose tools can still be told apart opens nothing.
        pairs = [(tool, row) for tool in definition.tools for row in ingested[tool]]
        sources = [(tool, (Path(settings.home) / row["image_path"]).read_bytes()) for tool, row in pairs]
        shape = definition.blinding
        if shape is None:
            _require_one_shape(study_id, sources)  # mixed aspects need a decision (issue 27 item 7)
        served, report = blind_study(sources, aspect=shape.aspect if shape else "1:1",
                                     shape=shape.shape if shape else "letterbox", decided=shape is not None)
        if report.leaks:
            raise StudyError(f"study {study_id} cannot open: blinding leaves a tool recognisable: {'; '.join(report.leaks)}")

        # The study's database, recorded before anything of the study is written (an open that
        # crashes after this can only be finished in the same database).
        store = open_panel_store(settings, study_id, create=True)
        store.record_in(d)
        if prereg is None:
            prereg = PreRegistration(
                study_id=study_id, created_at=now.isoformat(),
                definition_sha256=hashlib.sha256(canonical_definition(definition)).hexdigest(),
                suite=suite.version, suite_sha256=suite.sha256, hypotheses=dict(HYPOTHESES),
                analysis=definition.analysis, order_commitment=commitment(create_order_secret(d)),
                host_tool=definition.host_tool, praised_for_aesthetics=list(definition.praised_for_aesthetics),
                blinding=BlindingRecord(**report.shape))
            _write_prereg(d, prereg)
        elif prereg.suite_sha256 != suite.sha256:
            raise StudyError(f"{d / PREREG_FILE} was registered with suite sha256 {prereg.suite_sha256}, not {suite.sha256}")

        # Blind into a fresh folder, then swap it in (a crashed open leaves no half folder in use).
        tmp = Path(tempfile.mkdtemp(dir=d, prefix=".images."))
        image_rows = []
        for (tool, row), data in zip(pairs, served):
            image_id = opaque_id()
            (tmp / f"{image_id}.{BLIND_EXTENSION}").write_bytes(data)
            image_rows.append({"image_id": image_id, "tool": tool, "prompt_id": row["prompt_id"],
                               "source_sha256": row["image_sha256"], "blind_sha256": hashlib.sha256(data).hexdigest()})
        if (d / IMAGES_DIR).exists():
            shutil.rmtree(d / IMAGES_DIR)  # left by an open that crashed before the store was written
        os.replace(tmp, d / IMAGES_DIR)

        # Canonical order before shuffling: (tool, prompt), so the permutation depends only on seed + label.
        by_pair = sorted(image_rows, key=lambda r: (r["tool"], r["prompt_id"]))
        ids = [r["image_id"] for r in by_pair]
        tokens = {j.label: new_token() for j in definition.judges}
        admin = new_token()
        key = order_key(prereg, d)
        store.create_study(
            # The store keeps no order secret (0): the queues themselves are stored.
            order_seed=key if isinstance(key, int) else 0, memo=definition.memo, admin_token_sha256=sha256_hex(admin), opened_at=now,
            image_rows=image_rows,
            judge_rows=[{"label": j.label, "panel_group": j.group, "token_sha256": sha256_hex(tokens[j.label])}
                        for j in definition.judges],
            queues={j.label: judge_order(key, j.label, ids) for j in definition.judges})
        return OpenedStudy(d, prereg, admin, tokens, len(image_rows), report.lines,
                           place_lines(settings, suite.version, placed))
    finally:
        if store is not None:
            store.dispose()


def _require_one_shape(study_id: str, sources: list[tuple[str, bytes]]) -> None:
    """Refuse a study whose pictures come in more than one shape and that has not decided how they
    are made one (``blinding`` in study.yaml), naming each tool's aspects and what letterboxing
    them on the square would leave for the shape to tell."""
    from tasks.panel.blind import aspects_by_tool, image_facts, source_shapes, told_apart_by_shape

    facts = [image_facts(tool, data) for tool, data in sources]
    boxes = source_shapes(facts)
    if len({box for _, box in boxes}) <= 1:
        return
    told = told_apart_by_shape(boxes)
    n_tools = len({tool for tool, _ in sources})
    raise StudyError(
        f"study {study_id} cannot open: its images come in {len({box for _, box in boxes})} shapes ({aspects_by_tool(facts)}); "
        "decide in study.yaml how they are made one shape before any judge sees them, e.g. "
        "blinding: {shape: letterbox, aspect: \"1:1\"} keeps each picture whole on grey bands, whose shape alone "
        f"tells apart {len(told)} of {n_tools} tools here, or blinding: {{shape: crop, aspect: \"1:1\"}} cuts each "
        "picture's centre to that aspect (no band, nothing of the shape left). The decision and the figure are "
        "recorded in the pre-registration (docs/BEAUTY.md)")


def _answers_in_lake(settings, study_id: str) -> int:
    """How many answers the lake holds for the study (imported or simulated before any open)."""
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    return read_study_partition(Lake(settings.lake_dir), "study_answers", study_id).num_rows


# ---- status / close ------------------------------------------------------------------------------


def study_status(settings, study_id: str) -> dict:
    definition, prereg, d = load_study(settings, study_id)
    store = open_panel_store(settings, study_id, missing_ok=True)  # read-only: creates no database
    try:
        row = store.study_row() if store is not None else None
        if row is None and prereg is not None and (d / IMAGES_DIR).exists() and not (d / PANEL_STORE_RECORD_FILE).exists():
            # Opened by an imagebench that kept no record of its database: not "defined", elsewhere.
            raise StudyError(f"study {study_id} was opened (pre-registration, blinded images) but this panel database does "
                             "not hold it: set IMAGEBENCH_PANEL_DATABASE to the database it was opened in")
        if row is None:
            return {"study_id": study_id, "state": "defined", "tools": definition.tools, "judges": [],
                    "answers": 0, "images": 0, "preregistration_sha256": None, "study_dir": str(d)}
        from tasks.panel.store import from_us

        judges = store.judge_progress()
        return {
            "study_id": study_id, "state": row["state"], "opened_at": from_us(row["opened_at"]),
            "closed_at": from_us(row["closed_at"]) if row["closed_at"] else None, "tools": definition.tools,
            "judges": judges, "answers": sum(j["answered"] for j in judges),
            "expected": sum(j["total"] for j in judges), "images": len(store.image_rows()),
            "preregistration_sha256": _read_sums(d).get(PREREG_FILE), "study_dir": str(d),
            "simulated": definition.simulated, "deviations": store.deviations(),
        }
    finally:
        if store is not None:
            store.dispose()


def close_study(settings, study_id: str) -> bool:
    """Close the study: the panel accepts nothing after this. False when it was already closed."""
    load_study(settings, study_id)
    store = open_panel_store(settings, study_id, missing_ok=True)
    if store is None:
        raise StudyError(f"study {study_id} was never opened (imagebench study open {study_id})")
    try:
        if not store.exists():
            raise StudyError(f"study {study_id} was never opened (imagebench study open {study_id})")
        return store.close()
    finally:
        store.dispose()


def peek_results(settings, study_id: str, reason: str) -> tuple[dict, list[dict]]:
    """A look at the results of an open study before its close (issue 27 item 5): recorded first
    as a deviation from the pre-registration with ``reason`` (refused without one), then the
    answers and yes per (tool, prompt). Returns (the deviation, the pairs)."""
    from tasks.beauty.prereg import PEEK, reason_problem
    from tasks.panel.store import StudyClosed

    problem = reason_problem(reason)
    if problem:
        raise StudyError(f"study {study_id}: nothing shown: {problem}")
    load_study(settings, study_id)
    store = open_panel_store(settings, study_id, missing_ok=True)
    if store is None or not store.exists():
        if store is not None:
            store.dispose()
        raise StudyError(f"study {study_id} was never opened (imagebench study open {study_id})")
    try:
        try:
            dev = store.record_deviation(PEEK, reason.strip(), "command line")
        except StudyClosed:
            raise StudyError(f"study {study_id} is closed: its results are no deviation; see imagebench study analyze "
                             f"--study {study_id}") from None
        return dev, store.pair_counts()
    finally:
        store.dispose()


PANEL_URL_FILE = "panel-url"  # the public URL given at open: the panel's cookies are Secure when it is https


def remember_panel_url(settings, study_id: str, url: str) -> None:
    (study_dir(settings, study_id) / PANEL_URL_FILE).write_text(url.rstrip("/") + "\n", encoding="utf-8")


def panel_url_of(settings, study_id: str) -> str | None:
    """The study's public URL: the ``panel_url`` setting, else the one given at ``study open``."""
    if getattr(settings, "panel_url", None):
        return settings.panel_url
    path = study_dir(settings, study_id) / PANEL_URL_FILE
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8").strip() or None


def relink_judge(settings, study_id: str, label: str) -> str:
    """A new link for judge ``label`` of an open study (the old one dies, with the judge's
    sessions). Returns the token: shown once, stored hashed."""
    definition, _, _ = load_study(settings, study_id)
    if label not in {j.label for j in definition.judges}:
        raise StudyError(f"study {study_id} has no judge {label!r} (labels are in its study.yaml)")
    store = open_panel_store(settings, study_id)
    try:
        if not store.exists():
            raise StudyError(f"study {study_id} was never opened (imagebench study open {study_id})")
        return store.relink_judge(label)
    finally:
        store.dispose()
