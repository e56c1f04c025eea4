"""`imagebench study import-answers FILE --study ID`: answers of a panel run elsewhere.

A lab that ran the published protocol with its own tools (paper forms, another experiment
server) brings one CSV, ``judge,group,tool,prompt_id,answer,shown_at,answered_at``, and gets the
same scores, analysis, export and report as a study run in the panel app. The study still needs
its ``study.yaml`` (tools, groups, prompt suite, hypotheses' host tool and aesthetics tools).

Validated like every import: the whole file is checked before anything is written, and the first
bad row is named by its line; nothing is recorded then. The answers are stored in the lake table
``study_answers`` (source ``"import"``) under salted-hash judge ids: the labels in the CSV are
never stored. No torch, Prefect or GX here.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from schemas.study import LABEL_RE, STUDY_ANSWERS, StudyDefinition, salted_judge_id

CSV_COLUMNS = ("judge", "group", "tool", "prompt_id", "answer", "shown_at", "answered_at")
ANSWERS = {"yes": True, "no": False}
MAX_IMPORT_BYTES = 64 * 1024 * 1024


class AnswersImportError(ValueError):
    """A CSV of answers that cannot be imported (the message names the file and line)."""


def _timestamp(value: str, column: str, where: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value.strip())
    except ValueError:
        raise AnswersImportError(f"{where}: {column} {value!r} is not an ISO 8601 timestamp") from None
    if ts.tzinfo is None:  # a local time would shift every answer by the lab's offset
        raise AnswersImportError(f"{where}: {column} {value!r} has no UTC offset (write e.g. 2026-11-26T10:00:00Z)")
    return ts.astimezone(timezone.utc)


def parse_answers_csv(
    data: bytes, source: str, definition: StudyDefinition, prompt_ids: list[str], salt: str
) -> pa.Table:
    """The CSV's rows as a ``STUDY_ANSWERS`` table (source ``"import"``), or :class:`AnswersImportError`
    naming the first bad line. Rules: exactly the columns above; a group the study declares; a tool
    of the study; a prompt of the study's suite; ``yes``/``no``; ISO timestamps with an offset,
    answered at or after shown; one answer per (judge, tool, prompt); a judge in one group (the
    group the study file gives them, when it names them)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AnswersImportError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = tuple(h.strip() for h in (reader.fieldnames or ()))
    if header != CSV_COLUMNS:
        raise AnswersImportError(f"{source}:1: columns must be {','.join(CSV_COLUMNS)}; found {','.join(header) or 'none'}")
    groups = {g.name for g in definition.groups}
    declared = {j.label: j.group for j in definition.judges}
    tools, prompts = set(definition.tools), set(prompt_ids)
    rows: list[dict] = []
    seen: dict[tuple[str, str, str], int] = {}
    group_of: dict[str, tuple[str, int]] = {}
    for raw in reader:
        line = reader.line_num
        where = f"{source}:{line}"
        if None in raw or any(v is None for v in raw.values()):
            raise AnswersImportError(f"{where}: expected {len(CSV_COLUMNS)} fields")
        r = {k.strip(): (v or "").strip() for k, v in raw.items()}
        judge, group, tool, prompt_id = r["judge"], r["group"], r["tool"], r["prompt_id"]
        if not LABEL_RE.fullmatch(judge):
            raise AnswersImportError(f"{where}: judge label {judge!r} must match {LABEL_RE.pattern}")
        if group not in groups:
            raise AnswersImportError(f"{where}: group {group!r} is not a panel group of study {definition.study_id} ({', '.join(sorted(groups))})")
        if judge in declared and declared[judge] != group:
            raise AnswersImportError(f"{where}: judge {judge!r} is in group {declared[judge]!r} in study.yaml, not {group!r}")
        first = group_of.setdefault(judge, (group, line))
        if first[0] != group:
            raise AnswersImportError(f"{where}: judge {judge!r} was in group {first[0]!r} on line {first[1]}, here {group!r}")
        if tool not in tools:
            raise AnswersImportError(f"{where}: tool {tool!r} is not a tool of study {definition.study_id} ({', '.join(definition.tools)})")
        if prompt_id not in prompts:
            raise AnswersImportError(f"{where}: prompt_id {prompt_id!r} is not in suite {definition.suite}")
        answer = ANSWERS.get(r["answer"].lower())
        if answer is None:
            raise AnswersImportError(f"{where}: answer {r['answer']!r} must be yes or no")
        shown, answered = _timestamp(r["shown_at"], "shown_at", where), _timestamp(r["answered_at"], "answered_at", where)
        if answered < shown:
            raise AnswersImportError(f"{where}: answered_at {r['answered_at']} is before shown_at {r['shown_at']}")
        key = (judge, tool, prompt_id)
        if key in seen:
            raise AnswersImportError(f"{where}: judge {judge!r} already answered tool {tool!r}, prompt {prompt_id!r} on line {seen[key]}")
        seen[key] = line
        rows.append({
            "study_id": definition.study_id, "judge_id": salted_judge_id(salt, judge), "panel_group": group,
            "tool": tool, "prompt_id": prompt_id, "image_id": None, "position": None, "answer": answer,
            "shown_at": shown, "answered_at": answered, "memo": False, "source": "import",
        })
    if not rows:
        raise AnswersImportError(f"{source}: no answers (a header line only)")
    return pa.Table.from_pylist(rows, schema=STUDY_ANSWERS)


def import_answers(settings, study_id: str, path: Path) -> tuple[int, int]:
    """Validate ``path`` whole, then store its answers as the study's imported answers (replacing
    an earlier import of this study). Refuses a study whose panel already holds answers: one study
    has one source of answers. Returns ``(answers, judges)``."""
    from tasks.beauty.sources import load_study_context, panel_answers, study_salt
    from tasks.beauty.tables import read_study_partition, write_study_partition
    from tasks.lake.tables import Lake

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.stat().st_size > MAX_IMPORT_BYTES:
        raise AnswersImportError(f"{path}: larger than {MAX_IMPORT_BYTES // (1024 * 1024)} MiB")
    ctx = load_study_context(settings, study_id)
    if ctx.definition.simulated:
        raise AnswersImportError(f"study {study_id} is a SIMULATED study (study.yaml simulated: true): it takes no real answers")
    table = parse_answers_csv(path.read_bytes(), str(path), ctx.definition, ctx.prompt_ids, study_salt(ctx.study_dir))
    live = panel_answers(ctx)
    if live is not None and live.num_rows:
        raise AnswersImportError(f"study {study_id} already has {live.num_rows} answers from its panel app: import into a study of its own")
    lake = Lake(settings.lake_dir)
    old = read_study_partition(lake, "study_answers", study_id)
    if old.num_rows and set(old.column("source").to_pylist()) - {"import"}:
        raise AnswersImportError(f"study {study_id} holds answers from {sorted(set(old.column('source').to_pylist()))}: import into a study of its own")
    write_study_partition(lake, "study_answers", study_id, table)
    return table.num_rows, len(set(table.column("judge_id").to_pylist()))
