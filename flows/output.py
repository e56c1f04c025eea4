"""Render rows as a rich table, CSV or JSON. No heavy imports: used by `sql` and `leaderboard`."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import math
import sys
from collections.abc import Sequence
from enum import Enum
from typing import Any, TextIO


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def render(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: OutputFormat,
    title: str | None = None,
    out: TextIO | None = None,
) -> None:
    out = out or sys.stdout
    if fmt is OutputFormat.json:
        objs = [{c: _jsonable(v) for c, v in zip(columns, row)} for row in rows]
        out.write(json.dumps(objs, indent=1) + "\n")
    elif fmt is OutputFormat.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(file=out)
        if not console.is_terminal:
            console = Console(file=out, width=240)  # piped: never fold cells into slivers
        cells = [[_cell(v) for v in row] for row in rows]
        if table_width(columns, cells) > console.width:
            # Too wide to read as columns (34 of them from `select *`): one block per record.
            out.write(vertical(columns, cells, title))
            return
        table = Table(title=title, show_lines=False)
        for c in columns:
            table.add_column(c, overflow="fold")
        for row in cells:
            table.add_row(*row)
        console.print(table)


def table_width(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> int:
    """Characters a rich table needs to show every cell unfolded (borders and padding included)."""
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    return sum(widths) + 3 * len(widths) + 1


def vertical(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None) -> str:
    """psql's expanded display: ``-[ RECORD n ]`` then one ``column | value`` line per column."""
    name_w = max((len(c) for c in columns), default=0)
    value_w = min(60, max((len(v) for row in cells for v in row), default=0))
    lines = [title] if title else []
    for n, row in enumerate(cells, 1):
        head = f"-[ RECORD {n} ]"
        lines.append(head + "-" * max(1, name_w + 3 + value_w - len(head)))
        lines += [f"{c:<{name_w}} | {v}" for c, v in zip(columns, row)]
    if not cells:
        lines.append("(0 rows)")
    return "\n".join(lines) + "\n"


def nightly_line(summary: dict) -> str:
    """One line that adds up: every discovered model in exactly one disposition, each named."""
    errored = set(summary.get("errored", []))
    up_to_date = [m for m in summary.get("up_to_date", []) if m not in errored]
    rejudged = len(set(summary.get("rejudged", [])) & set(up_to_date))
    parts = [
        ("scored", len(summary.get("scored", []))),
        ("unchanged (same images)", len([m for m in summary.get("unchanged", []) if m not in errored])),
        (f"up to date ({rejudged} with new verdicts)", len(up_to_date)),
        ("busy (another run holds them)", len(summary.get("busy", []))),
        ("retired", len(summary.get("retired", []))),
        ("invalid", len(summary.get("invalid", {}))),
        ("errored", len(errored)),
    ]
    discovered = int(summary.get("discovered", 0))
    left = discovered - sum(n for _, n in parts)
    if left > 0:  # never print a sum that does not add up: whatever is left is named too
        parts.append(("without a result (see `imagebench runs`)", left))
    shown = [f"{n} {label}" for label, n in parts if n or label == "scored"]
    return f"nightly: {discovered} models discovered: " + ", ".join(shown)


# `imagebench runs` as a person reads it: what each run found and did, as counts, and where its
# time went (every column of the run record with --format csv|json).
RUNS_TABLE = ("run", "flow", "status", "started", "took_s", "discovered", "scored", "up_to_date", "skipped",
              "errored", "images_scored", "verdicts", "stage_s")
STAGE_NAMES = ("ingest", "hpsv3", "judge", "commit", "catalog")  # schemas.lake.STAGES (not imported: light)


def runs_table(records: Sequence[dict]) -> tuple[list[str], list[list[Any]]]:
    """One row per run record: ``scored`` counts new, incremental and replaced models;
    ``up_to_date`` the models with nothing to score (up to date, or unchanged content);
    ``skipped`` the busy and invalid ones; ``stage_s`` the seconds of each stage the run spent
    time in. A run that did not complete says at which stage it stopped."""

    def n(record: dict, *keys: str) -> int:
        return sum(len(record.get(f"models_{k}") or []) for k in keys)

    rows = []
    for r in records:
        status = r.get("status") or ""
        if status != "completed" and r.get("stage"):
            status = f"{status} at {r['stage']}"
        started = r.get("started_at")
        seconds = [(s, float(r.get(f"{s}_s") or 0)) for s in STAGE_NAMES]
        stages = [f"{s} {v:.0f}" if v >= 10 else f"{s} {v:.1f}" for s, v in seconds if v > 0]
        rows.append([
            str(r.get("run_id") or "")[:8], r.get("flow"), status,
            started.strftime("%Y-%m-%d %H:%M") if isinstance(started, dt.datetime) else started,
            None if r.get("total_s") is None else round(float(r["total_s"])),
            r.get("models_discovered"), n(r, "new", "incremental", "replaced"), n(r, "up_to_date", "unchanged"),
            n(r, "busy", "invalid"), n(r, "errored"), r.get("hps_images_scored"), r.get("verdicts_decided"),
            ", ".join(stages) or "-",
        ])
    return list(RUNS_TABLE), rows
