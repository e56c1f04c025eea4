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

        table = Table(title=title, show_lines=False)
        for c in columns:
            table.add_column(c, overflow="fold")
        for row in rows:
            table.add_row(*(_cell(v) for v in row))
        console = Console(file=out)
        if not console.is_terminal:
            console = Console(file=out, width=240)  # piped: never fold cells into slivers
        console.print(table)
