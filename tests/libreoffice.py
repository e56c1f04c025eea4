"""A CSV file opened in a real spreadsheet: LibreOffice Calc, headless (Debian's
libreoffice-calc-nogui, installed by `make setup`), with the CSV import a user gets by opening
the file (comma-separated, double quotes, UTF-8; LibreOffice evaluates formulas on import).

:func:`open_csv` converts the file to flat OpenDocument (``.fods``) and returns every cell as
Calc holds it: its type (float, string ...), the text it shows and its formula, if any. A cell
with a formula is a cell the spreadsheet ran (issue 24 item 7).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

NS = {
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
}
CSV_IMPORT = "CSV:44,34,76,1"  # separator ',', text delimiter '"', UTF-8, from line 1


@dataclass(frozen=True)
class Cell:
    value_type: str | None  # "float", "string" ... (None: an empty cell)
    text: str  # what the cell shows
    formula: str | None  # set when Calc read the cell as a formula
    value: str | None  # office:value of a number


def soffice() -> str:
    path = shutil.which("soffice")
    if path is None:
        raise RuntimeError("soffice not found: make setup installs libreoffice-calc-nogui (Debian)")
    return path


def open_csv(csv_file: Path, timeout: float = 180) -> list[list[Cell]]:
    """The rows of ``csv_file`` as LibreOffice Calc imports them (a fresh profile per call, so
    that two tests never share one)."""
    with tempfile.TemporaryDirectory(prefix="lo-") as tmp:
        tmp_path = Path(tmp)
        src = tmp_path / "in.csv"
        shutil.copyfile(csv_file, src)
        proc = subprocess.run(
            [soffice(), f"-env:UserInstallation=file://{tmp_path / 'profile'}", "--headless", "--norestore",
             f"--infilter={CSV_IMPORT}", "--convert-to", "fods", "--outdir", str(tmp_path / "out"), str(src)],
            capture_output=True, text=True, timeout=timeout, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
        out = tmp_path / "out" / "in.fods"
        if not out.is_file():
            raise RuntimeError(f"LibreOffice did not convert {csv_file}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
        root = ET.parse(out).getroot()
    rows = []
    for row in root.iter(f"{{{NS['table']}}}table-row"):
        cells = []
        for c in row.findall("table:table-cell", NS):
            repeat = int(c.get(f"{{{NS['table']}}}number-columns-repeated", "1"))
            text = "\n".join("".join(p.itertext()) for p in c.findall("text:p", NS))
            cell = Cell(c.get(f"{{{NS['office']}}}value-type"), text, c.get(f"{{{NS['table']}}}formula"),
                        c.get(f"{{{NS['office']}}}value"))
            cells.extend([cell] * min(repeat, 64))  # trailing empty cells come as one huge repeat
        while cells and cells[-1].value_type is None and not cells[-1].text:
            cells.pop()
        if cells:
            rows.append(cells)
    return rows
