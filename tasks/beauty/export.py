"""`imagebench study export`: the open-data bundle of a study (CC-BY 4.0).

    answers.parquet / answers.csv   one row per published judge x image: salted-hash judge id, panel
                                    group, prompt, tool, answer, shown_at, answered_at (at the chosen
                                    resolution, never to before the plan: privacy.export_time),
                                    qc_flag, source; rows sorted by judge, tool, prompt
    yes_rates.csv, beauty_index.csv, hypotheses.csv, pixel_metrics.csv   the analysis (lake tables)
    study.json                      the study definition, judges replaced by the panel's counts
    preregistration.json            the pinned plan, byte for byte (when the study was opened; a
                                    plan of format /1 without its order seed, tasks/beauty/prereg.py)
    deviations.json                 every look at the results before the close, with its reason
                                    (a study opened for the panel app, or imported from a bundle
                                    that carried one; issue 27 item 5)
    prompts.jsonl                   the prompt suite as pinned
    anonymity.json                  the lab's publication choices and the re-identification figures
    datasheet.md                    protocol, schema, panel composition, quality control, privacy
                                    (what is and is not published, the measured risk), licence
    LICENSE.txt                     CC-BY 4.0
    memos/<content hash>.ogg        only recordings whose judge separately consented to publishing
                                    them, re-encoded without container metadata, linked to nothing
    SHA256SUMS                      over every file above

Nothing can re-identify a judge by itself: no label, token, session, IP address, image id or local
path is written (tests/beauty/test_publish.py scans every byte), nothing from which a judge's image
order could be recomputed (no order seed, no queue position, times floored, rows in a canonical
order: tests/beauty/test_anonymity.py runs that attack), no voice linked to answers, and no judge
unique on a published quasi-identifier (group, answer count, first and last time): the export
measures that on the rows it would publish and refuses, naming the options
(tasks/beauty/privacy.py, tasks/beauty/reident.py). The bundle is built in a temporary folder
beside the target and swapped in whole.
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
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.study import MEMO_KEEP_CONSENT, MEMO_MAX_SECONDS, MEMO_PUBLISH_CONSENT, PUBLISHED_GROUPS
from tasks.beauty.privacy import PublicationChoices, Withheld, apply_choices, check_groups, export_time, refusal
from tasks.beauty.reident import AnonymityReport, anonymity_report
from tasks.store.spreadsheet import write_csv

__all__ = ["ExportError", "ExportRefused", "PublicationChoices", "export_study", "export_time", "md"]

BUNDLE_MARKER = "datasheet.md"
ANONYMITY_FILE = "anonymity.json"
ANSWER_COLUMNS = ("judge_id", "panel_group", "prompt_id", "prompt", "tool", "answer", "shown_at", "answered_at",
                  "qc_flag", "source")
CC_BY = (
    "Creative Commons Attribution 4.0 International (CC BY 4.0)\n"
    "https://creativecommons.org/licenses/by/4.0/legalcode\n\n"
    "You are free to share and adapt this material for any purpose, even commercially, provided you give\n"
    "appropriate credit, provide a link to the licence, and indicate if changes were made.\n"
)


class ExportError(RuntimeError):
    """The bundle cannot be written (not analysed yet, or the target holds something else)."""


class ExportRefused(ExportError):
    """A judge would be unique on what the bundle publishes (the message has the figures and options)."""


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


def _public_definition(definition, counts: Counter, choices: PublicationChoices) -> dict:
    """The study definition without anything about judges but their number per published group
    (labels are identities in the making), merged groups as one, and without local paths."""
    d = definition.model_dump(mode="json")
    d.pop("judges", None)
    d.pop("reference_images", None)
    merged = choices.group_map()
    groups, done = [], set()
    for g in d["groups"]:
        name = merged.get(g["name"], g["name"])
        if name in done:
            continue
        done.add(name)
        if name == g["name"]:
            groups.append(g)
            continue
        parts = [x for x in d["groups"] if merged.get(x["name"]) == name]
        groups.append({"name": name,
                       "description": "; ".join(f"{x['name']}: {x['description'] or PUBLISHED_GROUPS.get(x['name'], '')}"
                                                for x in parts),
                       "selection_criteria": "; ".join(f"{x['name']}: {x['selection_criteria']}"
                                                       for x in parts if x["selection_criteria"])})
    d["groups"] = groups
    d["panel"] = {g["name"]: counts.get(g["name"], 0) for g in groups}
    return d


@dataclass(frozen=True)
class Published:
    """What this bundle publishes about its judges and their memos (the datasheet's privacy and
    quality sections, and anonymity.json)."""

    choices: PublicationChoices
    withheld: Withheld
    report: AnonymityReport
    memos_kept: int  # linked to an answer, kept with the judge's consent
    memos_published: int  # of those, with the separate consent to publication
    flags: Counter  # qc_flag -> published answers carrying it
    min_seconds: float

    def to_json(self) -> dict:
        return {"format": "imagebench-anonymity/1", "choices": self.choices.to_json(),
                "withheld": {"judges": self.withheld.judges, "answers": self.withheld.answers},
                "memos": {"kept_by_the_lab": self.memos_kept, "published": self.memos_published},
                "measures": self.report.to_json()}


_TIMES_TEXT = {"minute": "floored to the minute", "hour": "floored to the hour", "day": "floored to the day (UTC)",
               "none": "withheld: every time at or after the pre-registration is its `created_at`, every time "
                       "before it (every time, without a pre-registration) 1970-01-01T00:00:00Z"}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _privacy_lines(pub: Published, memo_study: bool, imported: bool = False) -> list[str]:
    ch, rep = pub.choices, pub.report
    lines = ["", "## Privacy: what is published and what is not", "",
             f"Export options: `{ch.flags()}` (also in `{ANONYMITY_FILE}`).", "",
             "- **Published, per answer**: a salted hash of the judge's label, the panel group"
             f"{' (merged as below)' if ch.merge_groups else ''}, tool, prompt, yes/no, the quality-control flag, and "
             f"the times shown and answered, {_TIMES_TEXT[ch.times]}.",
             "- **Never published**: names and labels, links and session tokens, the salt and the order secret, "
             "IP addresses, image ids, each judge's order (queue positions; rows are sorted by judge, tool and "
             "prompt), exact times, seconds on screen, and any link between a voice memo and a judge, an answer "
             "or a group."]
    if ch.drop_partial_judges:
        lines.append(f"- **Withheld**: the answers of {pub.withheld.judges} judge(s) who did not answer their whole "
                     f"queue ({pub.withheld.answers} answers): their answer count would single them out. The analysis "
                     "files are those of every answer, so a re-analysis of answers.parquet differs from them by these.")
    for name, parts in ch.to_json()["merge_groups"].items():
        lines.append(f"- **Merged groups**: {md(', '.join(parts))} are published as one group, {md(name)}, with "
                     "their judges' counts added; beauty_index.csv has no per-group rows for them (with the answers "
                     "they would tell which judges form each group), and a hypothesis about one of them cannot be "
                     "re-tested from this bundle.")
    if imported:
        lines.append("- **Voice memos**: none here: this study was imported from another lab's bundle, whose "
                     "published recordings (if any) stay in that bundle.")
    elif not memo_study:
        lines.append("- **Voice memos**: this study took none.")
    else:
        lines.append(
            f"- **Voice memos**: {pub.memos_kept} memo(s) were kept by the lab with the judge's consent "
            f"(\"{md(MEMO_KEEP_CONSENT)}\"); {pub.memos_published} of them are in `memos/`, those whose judge also ticked "
            f"the separate box \"{md(MEMO_PUBLISH_CONSENT)}\" (recorded with its time). The others are not published: a "
            "voice can identify a person, and through an answer, their group and all their answers. Published "
            "recordings are re-encoded (Ogg Opus, no container metadata), named by a hash of their content, and "
            "linked to no judge, answer or group.")
    lines += ["", "### Re-identification risk, measured on this bundle", "",
              "k-anonymity of what an outsider may know of a judge, on the published rows (answer count = the "
              "judge's rows; first / last time = their earliest `shown_at` and latest `answered_at` as published):", "",
              "| quasi-identifier | judges | classes | smallest class (k) | judges unique |", "|---|---|---|---|---|"]
    for q in rep.quasi_identifiers:
        lines.append(f"| {', '.join(q.columns)} | {q.judges} | {q.classes} | {q.min_class_size} | {q.unique_judges} |")
    lines += ["", "An attacker who knows a judge's group and k of their answers (tool, prompt, yes/no) keeps the "
              "judges of that group whose published answers hold all k, and names one of them. Means over every "
              "judge with at least k answers and every k of their answers:", "",
              "| k answers known | judges | candidates left (mean) | chance of naming the judge | computed |",
              "|---|---|---|---|---|"]
    for at in rep.attacks:
        cand = "–" if at.mean_candidates is None else f"{at.mean_candidates:.2f}"
        lines.append(f"| {at.known_answers} | {at.judges} | {cand} | {_pct(at.naming_probability)} | {at.method} |")
    return lines


def _quality_lines(pub: Published) -> list[str]:
    from tasks.beauty.quality import flag_meanings

    meanings = flag_meanings(pub.min_seconds)
    lines = ["", "## Quality control", "",
             "`qc_flag` of each answer (empty: not flagged), decided at home from what the panel server recorded; "
             "that evidence (whether and when the image was sent, seconds on screen) is not published. Flagged "
             "answers are kept; beauty_index.csv has the index without them (`beauty_index_unflagged`), and a study "
             "imported from this bundle flags the same answers.", "",
             "| qc_flag | meaning | answers |", "|---|---|---|"]
    for flag in sorted(set(meanings) | set(pub.flags)):
        lines.append(f"| {md(flag)} | {md(meanings.get(flag, 'carried over from the bundle this study was imported from'))} "
                     f"| {pub.flags.get(flag, 0)} |")
    return lines


def _datasheet(ctx, prereg_sha: str | None, counts: Counter, groups: list[dict], answers: pa.Table, index: pa.Table,
               notes: list[str], pub: Published, status=None, deviations: list[dict] | None = None) -> str:
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
        f"- Answers published: {answers.num_rows} from {len(set(answers.column('judge_id').to_pylist()))} judges "
        f"(source: {', '.join(sorted(set(answers.column('source').to_pylist())))}).",
        "", "## Panel composition (counts only: identities are not published)", "",
        "| group | description | selection criteria | judges |", "|---|---|---|---|",
    ]
    for g in groups:
        desc = g["description"] or PUBLISHED_GROUPS.get(g["name"], "")
        lines.append(f"| {md(g['name'])} | {md(desc)} | {md(g['selection_criteria'] or '–')} | {counts.get(g['name'], 0)} |")
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
    lines += _deviation_lines(deviations)
    lines += ["", "## Files and schema", "",
              "- `answers.parquet` / `answers.csv`: one row per published judge x image. `judge_id`: salted sha256 of "
              "the judge's label (the salt is not published, so ids cannot be recomputed from a guessed name); "
              "`panel_group`; `prompt_id`, `prompt`; `tool`; `answer` (yes/no; Parquet: boolean); `shown_at`, "
              f"`answered_at` (UTC, {_TIMES_TEXT[pub.choices.times]}, but never to before the pre-registration's "
              "`created_at` when the real time is at or after it, so the times show the plan came first exactly as "
              "the exact times do; the place in the judge's queue is not published, "
              "and rows are sorted by judge, tool and prompt, so no judge's order can be rebuilt); "
              "`qc_flag` (Quality control below); `source` (panel / import / simulated).",
              "- `yes_rates.csv`, `beauty_index.csv` (panel_group `all` and one row per group), `hypotheses.csv`, "
              "`pixel_metrics.csv`: the analysis, as in the lake tables of the same names (docs/BEAUTY.md).",
              f"- `memos/`: {pub.memos_published} voice recording(s) published with their judge's consent, linked to nothing.",
              f"- `{ANONYMITY_FILE}`: the export options and the re-identification figures below, for programs.",
              "- `deviations.json` (a study opened for the panel app): every look at the results before the close, "
              "with its reason (Pre-registration above).",
              "- `study.json`, `preregistration.json`, `prompts.jsonl`, `LICENSE.txt`, `SHA256SUMS` "
              "(`sha256sum -c SHA256SUMS` checks the bundle)."]
    lines += _quality_lines(pub)
    from tasks.beauty.bundles import imported_from

    lines += _privacy_lines(pub, d.memo or pub.memos_kept > 0, imported_from(ctx.study_dir) is not None)
    lines += ["", "## Beauty Index", "", "| rank | tool | Beauty Index [95% CI] | answers |", "|---|---|---|---|"]
    from tasks.beauty.publish import index_text, leaderboard_rows

    for r in leaderboard_rows(index):
        bi = index_text(r)
        lines.append(f"| {r['rank']} | {md(r['tool'])} | {bi} | {r['answers']} |")
    lines += ["", "## Licence", "", f"{md(d.licence)}: prompts, selection criteria, protocol, anonymised answers and "
              "report. Judges' identities are not part of the release.", ""]
    return "\n".join(lines)


def _deviation_lines(deviations: list[dict] | None) -> list[str]:
    """The datasheet's deviations from the pre-registration (issue 27 item 5): every look at the
    results before the close, with its reason, as the panel store recorded it (deviations.json)."""
    from tasks.beauty.prereg import DEVIATIONS_FILE, deviation_sentence

    if deviations is None:
        return []
    head = ["", "### Deviations from the pre-registration", ""]
    if not deviations:
        return head + [f"None recorded: no one looked at the results before the panel closed ({DEVIATIONS_FILE})."]
    return head + [f"The results were looked at before the panel closed, {len(deviations)} time(s), against the plan "
                   f"({DEVIATIONS_FILE}):", ""] + [f"- {md(deviation_sentence(x))}" for x in deviations]


def _published_memos(settings, ctx) -> tuple[int, dict[str, bytes]]:
    """(memos kept with an answer, {bundle path: bytes} of those whose judge consented to
    publication): each re-encoded without container metadata and named by its content's hash."""
    from tasks.beauty.sources import panel_memos
    from tasks.panel.memo_audio import PUBLISHED_MEMO_TYPE, MemoRejected, publishable_memo

    kept = panel_memos(ctx)
    consented = [m for m in kept if m.get("publish_consent_at") is not None]
    out: dict[str, bytes] = {}
    if consented:
        from tasks.runs.units_ingest import open_configured_store
        from tasks.store.storage import StoredObject

        objects = open_configured_store(settings)
        for m in consented:
            data = objects.read(StoredObject(uri="", key=m["object_key"], size=int(m["byte_size"]), etag=""))
            try:
                sound = publishable_memo(data, m["media_type"])
            except MemoRejected as exc:
                raise ExportError(f"memo {m['object_key']}: cannot be re-encoded for publication ({exc})") from None
            out[f"memos/{hashlib.sha256(sound).hexdigest()[:32]}.{PUBLISHED_MEMO_TYPE[0]}"] = sound
    return len(kept), out


def _unique_judges(rows: list[dict]) -> int:
    return len(anonymity_report(rows, known_answers=()).unique_ids)


def export_study(settings, study_id: str, out: Path, choices: PublicationChoices | None = None) -> Path:
    """Write the bundle of an analysed study into ``out`` (a new folder, or an earlier bundle,
    replaced whole), published as ``choices`` say (default: times to the minute, every judge,
    groups as declared). Raises :class:`ExportRefused`, writing nothing, when a judge would be
    unique on a published quasi-identifier set. Returns ``out``."""
    from tasks.beauty.prereg import DEVIATIONS_FILE, deviations_document, plan_time, public_preregistration, status_of
    from tasks.beauty.publish import SIMULATED_BANNER
    from tasks.beauty.sources import load_study_context, study_deviations
    from tasks.beauty.study import PREREG_FILE
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    choices = choices or PublicationChoices()
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / BUNDLE_MARKER).is_file())):
        raise ExportError(f"{out} exists and is not an earlier study bundle: choose a new folder")
    ctx = load_study_context(settings, study_id)
    d = ctx.definition
    check_groups(choices, [g.name for g in d.groups])
    lake = Lake(settings.lake_dir)
    tables = {t: read_study_partition(lake, t, study_id)
              for t in ("study_answers", "study_rates", "study_index", "study_hypotheses", "study_pixel_metrics")}
    if not tables["study_index"].num_rows:
        raise ExportError(f"study {study_id} has not been analysed: run imagebench study analyze --study {study_id} first")
    answers = tables["study_answers"]
    status = status_of(ctx.prereg, answers)
    notes = ([SIMULATED_BANNER] if d.simulated else []) + ([status.note] if status.note else [])

    # The rows as the lab holds them (exact times), then as the choices publish them.
    exact = [{"judge_id": a["judge_id"], "panel_group": a["panel_group"], "prompt_id": a["prompt_id"],
              "prompt": ctx.prompts.get(a["prompt_id"], ""), "tool": a["tool"], "answer": a["answer"],
              "shown_at": a["shown_at"], "answered_at": a["answered_at"], "qc_flag": a["qc_flag"], "source": a["source"]}
             for a in answers.to_pylist()]
    full_queue, created = len(d.tools) * len(ctx.prompt_ids), plan_time(ctx.prereg)
    rows, withheld = apply_choices(exact, choices, full_queue, created)
    report = anonymity_report(rows)
    if report.unique_ids:
        sizes = Counter({a["panel_group"]: 0 for a in exact})
        sizes.update(g for g in {a["judge_id"]: a["panel_group"] for a in exact}.values())
        raise ExportRefused(refusal(study_id, report, choices,
                                    lambda alt: _unique_judges(apply_choices(exact, alt, full_queue, created)[0]), sizes))
    rows.sort(key=lambda r: (r["judge_id"], r["tool"], r["prompt_id"]))  # not the order they were answered in
    memos_kept, memo_files = _published_memos(settings, ctx)
    pub = Published(choices, withheld, report, memos_kept, len(memo_files),
                    Counter(r["qc_flag"] for r in rows if r["qc_flag"] is not None), d.quality.min_seconds_on_screen)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        if memo_files:
            (tmp / "memos").mkdir()
            for name, sound in sorted(memo_files.items()):
                (tmp / name).write_bytes(sound)
        public = pa.Table.from_pylist(rows, schema=pa.schema([
            ("judge_id", pa.string()), ("panel_group", pa.string()), ("prompt_id", pa.string()), ("prompt", pa.string()),
            ("tool", pa.string()), ("answer", pa.bool_()), ("shown_at", answers.schema.field("shown_at").type),
            ("answered_at", answers.schema.field("answered_at").type),
            ("qc_flag", pa.string()), ("source", pa.string())]))
        pq.write_table(public, tmp / "answers.parquet", compression="zstd")
        (tmp / "answers.csv").write_text(_csv(public), encoding="utf-8")
        merged_away = set(choices.group_map())
        index = tables["study_index"]
        if merged_away:  # per-group rows of merged groups would tell which judges form each group
            index = index.filter(pc.invert(pc.is_in(index.column("panel_group"), pa.array(sorted(merged_away)))))
        for table, name in (("study_rates", "yes_rates"), ("study_index", "beauty_index"),
                            ("study_hypotheses", "hypotheses"), ("study_pixel_metrics", "pixel_metrics")):
            (tmp / f"{name}.csv").write_text(_csv(index if table == "study_index" else tables[table]), encoding="utf-8")

        counts = Counter({r["judge_id"]: r["panel_group"] for r in rows}.values())
        public_definition = _public_definition(d, counts, choices)
        (tmp / "study.json").write_text(json.dumps(public_definition, indent=1, sort_keys=True) + "\n")
        (tmp / ANONYMITY_FILE).write_text(json.dumps(pub.to_json(), indent=1, sort_keys=True, default=str) + "\n")
        prereg_sha = None
        if ctx.prereg is not None:
            data, redacted = public_preregistration((ctx.study_dir / PREREG_FILE).read_bytes())
            (tmp / PREREG_FILE).write_bytes(data)
            prereg_sha = hashlib.sha256(data).hexdigest()
            if redacted:
                notes.append(redacted)
        # Looks at the results before the close (issue 27 item 5): the panel's, or an imported study's bundle's.
        deviations = study_deviations(ctx)
        if deviations is not None:
            (tmp / DEVIATIONS_FILE).write_bytes(deviations_document(deviations, prereg_sha))
        (tmp / "prompts.jsonl").write_text(
            "".join(json.dumps({"prompt_id": p, "prompt": ctx.prompts[p]}) + "\n" for p in ctx.prompt_ids))
        (tmp / "LICENSE.txt").write_text(CC_BY)
        (tmp / BUNDLE_MARKER).write_text(
            _datasheet(ctx, prereg_sha, counts, public_definition["groups"], public, tables["study_index"], notes, pub,
                       status, deviations), encoding="utf-8")
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

