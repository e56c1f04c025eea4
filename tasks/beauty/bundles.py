"""`imagebench study import-bundle DIR`: another lab's open-data bundle as a study of this workspace.

The bundle is what `imagebench study export` writes (tasks/beauty/export.py). Before anything is
written it is verified whole:

- every file is listed in ``SHA256SUMS`` and matches its digest (no path outside the folder, no
  unlisted file);
- ``preregistration.json`` parses, names the bundle's study and the same prompt suite (by sha256)
  as this workspace pins, and was written before every answer (``tasks.beauty.prereg``: a plan
  written after the data is no pre-registration, so such a bundle is refused). The bundle's times
  are floored (to the minute by default) but never to before the plan (``tasks.beauty.privacy.export_time``), so
  this verdict is the one the exporting lab's own workspace gives, answer for answer;
- ``study.json`` and the answers fit each other (tools, groups, prompts of the suite, one answer
  per judge and image, answered at or after shown, a ``qc_flag`` its quality settings define).

Then the study gets its folder (``study.yaml`` built from ``study.json``, the bundle's
pre-registration byte for byte and pinned, its ``deviations.json`` byte for byte when it has one
(an export of the imported study publishes them again), a marker ``imported-bundle.json``) and its answers go to
the lake (``study_answers``, source ``import``, the bundle's judge ids and quality-control flags
unchanged): `study analyze`,
`study leaderboard`, `study export` and the report treat it as any study. No torch, Prefect or GX.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import ValidationError

from schemas.study import STUDY_ANSWERS, STUDY_ID_RE, PreRegistration, StudyDefinition
from tasks.beauty.prereg import DEVIATIONS_FILE, parse_deviations

IMPORTED_MARKER = "imported-bundle.json"
JUDGE_ID_RE = re.compile(r"^[0-9a-f]{16,64}$")  # as expectations/study_answers.json requires
REQUIRED_FILES = ("answers.parquet", "study.json", "preregistration.json", "prompts.jsonl", "datasheet.md")
MAX_BUNDLE_FILE_BYTES = 512 * 1024 * 1024


class BundleError(ValueError):
    """A bundle that cannot be imported (the message names the bundle and why)."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    sums_sha256: str  # of SHA256SUMS: what was verified
    prereg_bytes: bytes
    prereg: PreRegistration
    definition: dict  # study.json
    answers: pa.Table  # the bundle's answers.parquet
    deviations_bytes: bytes | None = None  # deviations.json, checked (a bundle written before it has none)


def _read_sums(path: Path) -> dict[str, str]:
    sums_file = path / "SHA256SUMS"
    if not sums_file.is_file():
        raise BundleError(f"{path}: no SHA256SUMS (not a study bundle, or an incomplete copy)")
    out: dict[str, str] = {}
    for n, line in enumerate(sums_file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        rel = PurePosixPath(name)
        if not sep or len(digest) != 64 or rel.is_absolute() or ".." in rel.parts or not name:
            raise BundleError(f"{sums_file}:{n}: not a 'sha256  relative/path' line")
        out[name] = digest.lower()
    return out


def verify_files(path: Path) -> str:
    """Every file of the bundle listed in SHA256SUMS and matching it. Returns SHA256SUMS's sha256."""
    sums = _read_sums(path)
    listed = set(sums)
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    if present - listed:
        raise BundleError(f"{path}: file(s) {sorted(present - listed)[:5]} are not covered by SHA256SUMS")
    for name, digest in sorted(sums.items()):
        f = path / name
        if not f.is_file():
            raise BundleError(f"{path}: {name} is listed in SHA256SUMS but missing")
        if f.stat().st_size > MAX_BUNDLE_FILE_BYTES:
            raise BundleError(f"{f}: larger than {MAX_BUNDLE_FILE_BYTES // 2**20} MiB")
        actual = hashlib.sha256(f.read_bytes()).hexdigest()
        if actual != digest:
            raise BundleError(f"{f}: sha256 {actual} does not match SHA256SUMS ({digest}): the bundle was altered")
    missing = [n for n in REQUIRED_FILES if n not in sums]
    if missing:
        raise BundleError(f"{path}: missing {missing} (a bundle of a study that was never pre-registered cannot be imported)"
                          if "preregistration.json" in missing else f"{path}: missing {missing}")
    return hashlib.sha256((path / "SHA256SUMS").read_bytes()).hexdigest()


def read_bundle(path: Path) -> Bundle:
    """The bundle verified (files, pre-registration before every answer) and parsed."""
    from tasks.beauty.prereg import status_of

    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"{path}: not a folder (give the bundle folder that holds SHA256SUMS)")
    sums_sha = verify_files(path)
    prereg_bytes = (path / "preregistration.json").read_bytes()
    try:
        prereg = PreRegistration.model_validate_json(prereg_bytes)
    except ValueError as exc:
        raise BundleError(f"{path / 'preregistration.json'}: not a pre-registration ({str(exc).splitlines()[0]})") from None
    try:
        definition = json.loads((path / "study.json").read_text(encoding="utf-8"))
        answers = pq.read_table(path / "answers.parquet")
    except (ValueError, OSError, pa.ArrowException) as exc:
        raise BundleError(f"{path}: study.json or answers.parquet unreadable ({exc})") from None
    need = {"judge_id", "panel_group", "prompt_id", "tool", "answer", "shown_at", "answered_at", "source"}
    if not isinstance(definition, dict) or need - set(answers.column_names):
        raise BundleError(f"{path}: answers.parquet lacks column(s) {sorted(need - set(answers.column_names))}")
    if definition.get("study_id") != prereg.study_id:
        raise BundleError(f"{path}: study.json is study {definition.get('study_id')!r} but preregistration.json {prereg.study_id!r}")
    if not answers.num_rows:
        raise BundleError(f"{path}: answers.parquet holds no answers")
    status = status_of(prereg, answers)
    if not status.preregistered:
        raise BundleError(f"{path}: refused: {status.note}")
    deviations = path / DEVIATIONS_FILE
    deviations_bytes = deviations.read_bytes() if deviations.is_file() else None
    if deviations_bytes is not None:
        try:
            parse_deviations(deviations_bytes, str(deviations), hashlib.sha256(prereg_bytes).hexdigest())
        except ValueError as exc:
            raise BundleError(str(exc)) from None
    return Bundle(path, sums_sha, prereg_bytes, prereg, definition, answers, deviations_bytes)


def _definition(bundle: Bundle, study_id: str) -> StudyDefinition:
    """study.yaml for the imported study: the bundle's public definition, its plan's settings, and
    one placeholder judge per judge id (labels are not published; the ids stay the bundle's)."""
    d = {k: v for k, v in bundle.definition.items() if k != "panel"}
    groups = bundle.answers.column("panel_group").to_pylist()
    judges = dict(zip(bundle.answers.column("judge_id").to_pylist(), groups))
    d.update(study_id=study_id, judges=[{"label": f"j{jid[:31]}", "group": g} for jid, g in sorted(judges.items())],
             analysis=bundle.prereg.analysis.model_dump(mode="json"), host_tool=bundle.prereg.host_tool,
             praised_for_aesthetics=list(bundle.prereg.praised_for_aesthetics), suite=bundle.prereg.suite)
    d.setdefault("simulated", set(bundle.answers.column("source").to_pylist()) == {"simulated"})
    try:
        return StudyDefinition.model_validate(d)
    except ValidationError as exc:  # one line: every field and why, as tasks.beauty.study.load_definition says it
        errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'study'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in exc.errors())
        raise BundleError(f"{bundle.path / 'study.json'}: {errs}") from None


def _answers(bundle: Bundle, definition: StudyDefinition, prompt_ids: list[str]) -> pa.Table:
    """The bundle's answers as ``STUDY_ANSWERS`` rows of the new study, checked against it. Each
    answer keeps its ``qc_flag`` (one of the flags the bundle's quality settings define), so the
    analysis here flags what the home study flagged (issue 27 item 3); a bundle written before
    flags were published has none."""
    from tasks.beauty.quality import flag_meanings

    tools, groups, prompts = set(definition.tools), {g.name for g in definition.groups}, set(prompt_ids)
    known_flags = set(flag_meanings(definition.quality.min_seconds_on_screen))
    simulated = definition.simulated
    rows, seen = [], set()
    for i, a in enumerate(bundle.answers.to_pylist()):
        where = f"{bundle.path / 'answers.parquet'} row {i}"
        for col, allowed in (("tool", tools), ("panel_group", groups), ("prompt_id", prompts)):
            if a[col] not in allowed:
                raise BundleError(f"{where}: {col} {a[col]!r} is not in the study's {col}s ({', '.join(sorted(allowed))})")
        if not isinstance(a["answer"], bool) or a["shown_at"] is None or a["answered_at"] is None:
            raise BundleError(f"{where}: answer, shown_at and answered_at must be given")
        if a["answered_at"] < a["shown_at"]:
            raise BundleError(f"{where}: answered_at is before shown_at")
        flag = a.get("qc_flag")
        if flag is not None and flag not in known_flags:
            raise BundleError(f"{where}: qc_flag {str(flag)[:40]!r} is not one of {sorted(known_flags)} "
                              "(study.json quality settings)")
        if not isinstance(a["judge_id"], str) or not JUDGE_ID_RE.fullmatch(a["judge_id"]):
            raise BundleError(f"{where}: judge_id must be a salted sha256 (hex), got {str(a['judge_id'])[:20]!r}")
        key = (a["judge_id"], a["tool"], a["prompt_id"])
        if key in seen:
            raise BundleError(f"{where}: judge {a['judge_id'][:12]}... answered ({a['tool']}, {a['prompt_id']}) twice")
        seen.add(key)
        rows.append({"study_id": definition.study_id, "judge_id": a["judge_id"], "panel_group": a["panel_group"],
                     "tool": a["tool"], "prompt_id": a["prompt_id"], "image_id": None, "position": None,
                     "answer": a["answer"], "shown_at": a["shown_at"], "answered_at": a["answered_at"],
                     "memo": bool(a.get("memo_file")), "source": "simulated" if simulated else "import",
                     "qc_flag": flag})
    return pa.Table.from_pylist(rows, schema=STUDY_ANSWERS)


def import_bundle(settings, path: Path, study_id: str | None = None, now: datetime | None = None) -> tuple[str, int, int]:
    """Verify the bundle and make it a study of this workspace (``study_id``: the bundle's own id
    unless given). Refuses a study id already used here. Returns (study id, answers, judges)."""
    from tasks.beauty.study import study_dir
    from tasks.beauty.suite import load_beauty_suite
    from tasks.beauty.tables import partition_path
    from tasks.lake.tables import Lake

    bundle = read_bundle(Path(path))
    study_id = study_id or bundle.prereg.study_id
    if not STUDY_ID_RE.fullmatch(study_id):
        raise BundleError(f"study id {study_id!r} must match {STUDY_ID_RE.pattern} (choose one with --as)")
    d = study_dir(settings, study_id)
    lake = Lake(settings.lake_dir)
    if d.exists() or partition_path(lake, "study_answers", study_id).exists():
        raise BundleError(f"study {study_id} already exists in this workspace: import the bundle under another id (--as NEW_ID)")
    try:
        suite = load_beauty_suite(settings.reference_dir, bundle.prereg.suite)
    except (OSError, ValueError, LookupError) as exc:
        raise BundleError(f"{path}: its prompt suite {bundle.prereg.suite} is not pinned here ({exc})") from None
    if suite.sha256 != bundle.prereg.suite_sha256:
        raise BundleError(f"{path}: pre-registered with suite {bundle.prereg.suite} sha256 {bundle.prereg.suite_sha256}, "
                          f"this workspace pins {suite.sha256}: the prompts differ")
    definition = _definition(bundle, study_id)
    answers = _answers(bundle, definition, [p.prompt_id for p in suite.prompts])
    d.mkdir(parents=True)
    try:
        _write_study(bundle, d, definition, answers, lake, Path(path), now)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)  # nothing half-imported is left behind
        raise
    return study_id, answers.num_rows, len(set(answers.column("judge_id").to_pylist()))


def _write_study(bundle: Bundle, d: Path, definition: StudyDefinition, answers: pa.Table, lake, path: Path,
                 now: datetime | None) -> None:
    from tasks.beauty.study import PREREG_FILE, STUDY_FILE, SUMS_FILE
    from tasks.beauty.tables import write_study_partition

    (d / STUDY_FILE).write_text(f"# imported from the open-data bundle {Path(path).name} (SHA256SUMS sha256 "
                                f"{bundle.sums_sha256}); judges are placeholders for the bundle's judge ids\n"
                                + yaml.safe_dump(definition.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    (d / PREREG_FILE).write_bytes(bundle.prereg_bytes)
    os.chmod(d / PREREG_FILE, 0o400)  # read-only, and private as the whole workspace (issue 24 item 2)
    with open(d / SUMS_FILE, "a", encoding="utf-8") as fh:
        fh.write(f"{hashlib.sha256(bundle.prereg_bytes).hexdigest()}  {PREREG_FILE}\n")
    if bundle.deviations_bytes is not None:  # kept byte for byte: an export of this study writes them again
        (d / DEVIATIONS_FILE).write_bytes(bundle.deviations_bytes)
    (d / IMPORTED_MARKER).write_text(json.dumps({
        "bundle": Path(path).name, "sha256sums_sha256": bundle.sums_sha256, "original_study_id": bundle.prereg.study_id,
        "imported_at": (now or datetime.now(UTC)).isoformat()}, indent=1) + "\n")
    write_study_partition(lake, "study_answers", definition.study_id, answers)


def imported_deviations(study_dir: Path) -> list[dict] | None:
    """The deviations a study imported from a bundle brought with it (issue 27 item 5: the bundle
    publishes every look at the results before the close), oldest first; None for a study without
    that record (a native study, or a bundle written before deviations were published)."""
    f = Path(study_dir) / DEVIATIONS_FILE
    if imported_from(study_dir) is None or not f.is_file():
        return None
    return parse_deviations(f.read_bytes(), str(f), None)


def imported_from(study_dir: Path) -> dict | None:
    """The import record of a study made from a bundle, or None for a native study."""
    marker = Path(study_dir) / IMPORTED_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None
