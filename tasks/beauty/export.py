"""`imagebench study export`: the open-data bundle of a study (CC-BY 4.0).

    answers.parquet / answers.csv   one row per judge x image: salted-hash judge id, panel group,
                                    prompt, tool, answer, shown_at, answered_at (floored to the
                                    minute, never to before the plan: export_time), memo file;
                                    rows sorted by judge, tool, prompt
    yes_rates.csv, beauty_index.csv, hypotheses.csv, pixel_metrics.csv   the analysis (lake tables)
    study.json                      the study definition, judges replaced by the panel's counts
    preregistration.json            the pinned plan, byte for byte (when the study was opened; a
                                    plan of format /1 without its order seed, tasks/beauty/prereg.py)
    prompts.jsonl                   the prompt suite as pinned
    datasheet.md                    protocol, schema, panel composition, licence, pre-registration sha256
    LICENSE.txt                     CC-BY 4.0
    memos/<judge_id>-<opaque>.<ext>  voice memos, only those kept with the judge's consent
    SHA256SUMS                      over every file above

Nothing can re-identify a judge: no label, token, session, IP address, image id or local path is
written (tests/beauty/test_publish.py scans every byte), and nothing from which a judge's image
order could be recomputed: no order seed, no queue position, times floored to the minute and rows
in a canonical order (tests/beauty/test_anonymity.py runs the re-identification attack). The bundle is built in a temporary
folder beside the target and swapped in whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.study import MEMO_MAX_SECONDS, PUBLISHED_GROUPS, salted_judge_id
from tasks.store.spreadsheet import write_csv

BUNDLE_MARKER = "datasheet.md"
ANSWER_COLUMNS = ("judge_id", "panel_group", "prompt_id", "prompt", "tool", "answer", "shown_at", "answered_at",
                  "memo_file", "source")
TIME_RESOLUTION_S = 60  # exported times are floored to the minute: enough to show the answers followed the plan
CC_BY = (
    "Creative Commons Attribution 4.0 International (CC BY 4.0)\n"
    "https://creativecommons.org/licenses/by/4.0/legalcode\n\n"
    "You are free to share and adapt this material for any purpose, even commercially, provided you give\n"
    "appropriate credit, provide a link to the licence, and indicate if changes were made.\n"
)


class ExportError(RuntimeError):
    """The bundle cannot be written (not analysed yet, or the target holds something else)."""


def _csv(table: pa.Table) -> str:
    """The table as CSV, no cell a spreadsheet would run (tasks.store.spreadsheet)."""
    buf = io.StringIO()
    write_csv(buf, table.column_names,
              ([None if v is None else ("yes" if v is True else "no" if v is False else
                                        v.isoformat() if hasattr(v, "isoformat") else v) for v in row.values()]
               for row in table.to_pylist()))
    return buf.getvalue()


_MARKDOWN_ACTIVE = re.compile(r"([\\`*_\[\]<>|!#~])")


def md(text) -> str:
    """A text of the study (or of another lab's bundle) as Markdown that shows it as written: the
    characters that make links, images, HTML, emphasis, headings or table cells are
    backslash-escaped, line breaks become spaces (issue 24 item 7, docs/BEAUTY.md)."""
    return _MARKDOWN_ACTIVE.sub(r"\\\1", " ".join(str(text).splitlines()))


def _public_definition(definition, counts: Counter) -> dict:
    """The study definition without anything about judges but their number per group (labels
    are identities in the making) and without local paths."""
    d = definition.model_dump(mode="json")
    d.pop("judges", None)
    d.pop("reference_images", None)
    d["panel"] = {g["name"]: counts.get(g["name"], 0) for g in d["groups"]}
    return d


def floor_time(ts):
    """A timestamp floored to ``TIME_RESOLUTION_S`` (None stays None)."""
    if ts is None:
        return None
    return ts.replace(second=0, microsecond=0)


def export_time(ts, created: datetime | None):
    """An answer time as the bundle publishes it (None stays None):

    - ``ts`` at or after the plan's ``created_at``: ``max(floor_time(ts), created_at)``;
    - ``ts`` before it (or no plan): ``floor_time(ts)``, which is before it too.

    So a bundle's times stand on the same side of ``created_at`` as the real ones, answer for
    answer, and ``tasks.beauty.prereg.status_of`` gives the bundle (`study import-bundle`) exactly
    the verdict it gives the study at home: a study answered in the minute it was opened stays
    pre-registered, and one whose answers predate its plan is still refused with the same count.
    Flooring alone would move an answer given seconds after the open to before it. Nothing new is
    published: ``created_at`` is in preregistration.json, and the only thing told beyond the
    minute is on which side of it an answer of that minute falls, which is what the verdict says.
    The rule is monotone (answered_at stays >= shown_at) and idempotent (a re-exported imported
    bundle keeps its times)."""
    if ts is None:
        return None
    floored = floor_time(ts)
    if created is not None and ts >= created:
        return max(floored, created)
    return floored


def _datasheet(ctx, prereg_sha: str | None, counts: Counter, answers: pa.Table, index: pa.Table, memos: int, notes: list[str],
               status=None) -> str:
    d = ctx.definition
    lines = [f"# Datasheet: Beauty Index study `{d.study_id}`", ""]  # study_id: [a-z0-9-]
    lines += [f"**{n}**" for n in notes] + ([""] if notes else [])
    lines += [
        md(d.title) if d.title else "", "",
        "## Protocol",
        f"- One question about every image: **\"{md(d.question)}\"** Yes / No, with server-side timestamps "
        f"(shown, answered){'; an optional voice memo of at most ' + str(MEMO_MAX_SECONDS) + ' s, never used for scoring' if d.memo else ''}.",
        "- Blind: judges never learnt which tool made an image; images one at a time, never side by side; "
        "order randomised per judge from a private secret whose sha256 was pre-registered at open.",
        "- Score: % of judges who said yes per (tool, prompt); Beauty Index of a tool = mean over the study's "
        "prompts of that (tool, prompt)'s % yes (0-100), with two-way cluster bootstrap intervals (judges x prompts).",
        f"- Prompt suite: {md(d.suite)} (sha256 `{ctx.suite_sha256}`, prompts.jsonl). Tools: {md(', '.join(d.tools))}.",
        f"- Answers: {answers.num_rows} from {len(set(answers.column('judge_id').to_pylist()))} judges "
        f"(source: {', '.join(sorted(set(answers.column('source').to_pylist())))}).",
        "", "## Panel composition (counts only: identities are not published)", "",
        "| group | description | selection criteria | judges |", "|---|---|---|---|",
    ]
    for g in d.groups:
        desc = g.description or PUBLISHED_GROUPS.get(g.name, "")
        lines.append(f"| {md(g.name)} | {md(desc)} | {md(g.selection_criteria or '–')} | {counts.get(g.name, 0)} |")
    lines += ["", "## Pre-registration", ""]
    if prereg_sha and status is not None and not status.preregistered:
        lines += [f"**Not pre-registered.** preregistration.json (sha256 `{prereg_sha}`) was written at "
                  f"{md(ctx.prereg.created_at)}, after {status.early_answers} of the answers had been given: the plan "
                  "postdates data, so its hypotheses are not a pre-registration. Hypotheses:", ""]
        lines += [f"- {md(k)}: {md(v)}" for k, v in ctx.prereg.hypotheses.items()]
    elif prereg_sha:
        lines += [f"preregistration.json, written once at open ({md(ctx.prereg.created_at)}) before every answer, sha256 "
                  f"`{prereg_sha}`. Per-judge image orders were drawn from a private secret; the file publishes only "
                  "its sha256 commitment. Hypotheses:", ""] + [f"- {md(k)}: {md(v)}" for k, v in ctx.prereg.hypotheses.items()]
    else:
        lines += ["None: the study was never opened in imagebench (answers imported), so no plan was pinned "
                  "before the answers; the analysis used the settings of study.json."]
    lines += ["", "## Files and schema", "",
              "- `answers.parquet` / `answers.csv`: one row per judge x image. `judge_id`: salted sha256 of the "
              "judge's label (the salt is not published, so ids cannot be recomputed from a guessed name); "
              "`panel_group`; `prompt_id`, `prompt`; `tool`; `answer` (yes/no; Parquet: boolean); `shown_at`, "
              f"`answered_at` (UTC, floored to {TIME_RESOLUTION_S} s, but never to before the pre-registration's "
              "`created_at` when the real time is at or after it, so the times show the plan came first exactly as "
              "the exact times do; the place in the judge's queue is not published, "
              "and rows are sorted by judge, tool and prompt, so no judge's order can be rebuilt); "
              "`memo_file` (memos/..., only where the judge consented); `source` (panel / import / simulated).",
              "- `yes_rates.csv`, `beauty_index.csv` (panel_group `all` and one row per group), `hypotheses.csv`, "
              "`pixel_metrics.csv`: the analysis, as in the lake tables of the same names (docs/BEAUTY.md).",
              f"- `memos/`: {memos} voice memo(s).",
              "- `study.json`, `preregistration.json`, `prompts.jsonl`, `LICENSE.txt`, `SHA256SUMS` "
              "(`sha256sum -c SHA256SUMS` checks the bundle).",
              "", "## Beauty Index", "", "| rank | tool | Beauty Index [95% CI] | answers |", "|---|---|---|---|"]
    from tasks.beauty.publish import index_text, leaderboard_rows

    for r in leaderboard_rows(index):
        bi = index_text(r)
        lines.append(f"| {r['rank']} | {md(r['tool'])} | {bi} | {r['answers']} |")
    lines += ["", "## Licence", "", f"{md(d.licence)}: prompts, selection criteria, protocol, anonymised answers and "
              "report. Judges' identities are not part of the release.", ""]
    return "\n".join(lines)


def export_study(settings, study_id: str, out: Path) -> Path:
    """Write the bundle of an analysed study into ``out`` (a new folder, or an earlier bundle,
    replaced whole). Returns ``out``."""
    from tasks.beauty.prereg import plan_time, public_preregistration, status_of
    from tasks.beauty.publish import SIMULATED_BANNER
    from tasks.beauty.sources import load_study_context, panel_memos
    from tasks.beauty.study import PREREG_FILE
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / BUNDLE_MARKER).is_file())):
        raise ExportError(f"{out} exists and is not an earlier study bundle: choose a new folder")
    ctx = load_study_context(settings, study_id)
    lake = Lake(settings.lake_dir)
    tables = {t: read_study_partition(lake, t, study_id)
              for t in ("study_answers", "study_rates", "study_index", "study_hypotheses", "study_pixel_metrics")}
    if not tables["study_index"].num_rows:
        raise ExportError(f"study {study_id} has not been analysed: run imagebench study analyze --study {study_id} first")
    answers = tables["study_answers"]
    status = status_of(ctx.prereg, answers)
    notes = ([SIMULATED_BANNER] if ctx.definition.simulated else []) + ([status.note] if status.note else [])

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        # memos: consented ones only, named by salted judge id and queue position
        memo_files: dict[tuple[str, int], str] = {}
        memos = panel_memos(ctx)
        if memos:
            from tasks.beauty.sources import study_salt
            from tasks.store.storage import StoredObject
            from tasks.runs.units_ingest import open_configured_store

            salt, objects = study_salt(ctx.study_dir), open_configured_store(settings)
            (tmp / "memos").mkdir()
            for m in memos:
                jid = salted_judge_id(salt, m["label"])
                ext = Path(m["object_key"]).suffix.lstrip(".").lower() or "bin"
                # named by a keyed hash, not the queue position (which would publish the judge's order)
                opaque = hashlib.sha256(f"{salt}:memo:{jid}:{int(m['position'])}".encode()).hexdigest()[:16]
                name = f"memos/{jid}-{opaque}.{ext}"
                data = objects.read(StoredObject(uri="", key=m["object_key"], size=int(m["byte_size"]), etag=""))
                (tmp / name).write_bytes(data)
                memo_files[(jid, int(m["position"]))] = name

        rows, created = [], plan_time(ctx.prereg)
        for a in answers.to_pylist():
            rows.append({
                "judge_id": a["judge_id"], "panel_group": a["panel_group"], "prompt_id": a["prompt_id"],
                "prompt": ctx.prompts.get(a["prompt_id"], ""), "tool": a["tool"], "answer": a["answer"],
                "shown_at": export_time(a["shown_at"], created), "answered_at": export_time(a["answered_at"], created),
                "memo_file": memo_files.get((a["judge_id"], a["position"])) if a["position"] is not None else None,
                "source": a["source"],
            })
        rows.sort(key=lambda r: (r["judge_id"], r["tool"], r["prompt_id"]))  # not the order they were answered in
        public = pa.Table.from_pylist(rows, schema=pa.schema([
            ("judge_id", pa.string()), ("panel_group", pa.string()), ("prompt_id", pa.string()), ("prompt", pa.string()),
            ("tool", pa.string()), ("answer", pa.bool_()), ("shown_at", answers.schema.field("shown_at").type),
            ("answered_at", answers.schema.field("answered_at").type),
            ("memo_file", pa.string()), ("source", pa.string())]))
        pq.write_table(public, tmp / "answers.parquet", compression="zstd")
        (tmp / "answers.csv").write_text(_csv(public), encoding="utf-8")
        for table, name in (("study_rates", "yes_rates"), ("study_index", "beauty_index"),
                            ("study_hypotheses", "hypotheses"), ("study_pixel_metrics", "pixel_metrics")):
            (tmp / f"{name}.csv").write_text(_csv(tables[table]), encoding="utf-8")

        groups_of = {a["judge_id"]: a["panel_group"] for a in rows}
        counts = Counter(groups_of.values())
        (tmp / "study.json").write_text(json.dumps(_public_definition(ctx.definition, counts), indent=1, sort_keys=True) + "\n")
        prereg_sha = None
        if ctx.prereg is not None:
            data, redacted = public_preregistration((ctx.study_dir / PREREG_FILE).read_bytes())
            (tmp / PREREG_FILE).write_bytes(data)
            prereg_sha = hashlib.sha256(data).hexdigest()
            if redacted:
                notes.append(redacted)
        (tmp / "prompts.jsonl").write_text(
            "".join(json.dumps({"prompt_id": p, "prompt": ctx.prompts[p]}) + "\n" for p in ctx.prompt_ids))
        (tmp / "LICENSE.txt").write_text(CC_BY)
        (tmp / BUNDLE_MARKER).write_text(
            _datasheet(ctx, prereg_sha, counts, answers, tables["study_index"], len(memo_files), notes, status), encoding="utf-8")
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        (tmp / "SHA256SUMS").write_text("".join(
            f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(tmp).as_posix()}\n" for p in files))
        if out.exists():
            shutil.rmtree(out)
        # mkdtemp makes it 0700, as the rest of the workspace; written outside it, the command gives
        # the bundle the modes of its user's umask (flows/cli/common.py publish_outside).
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

