"""docs/RELIABILITY.md: every row names tests that exist (so CI runs what the table claims)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "RELIABILITY.md"


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_row_names_existing_tests():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and not line.startswith("| fault") and not line.startswith("| threat") and "---" not in line]
    assert len(rows) >= 25
    for row in rows:
        last = row.rstrip(" |").rsplit(" | ", 1)[-1]
        if last.startswith("same test"):  # backed by the test of the row above
            continue
        files = re.findall(r"`(tests/[\w/]+\.py)", last)
        assert files, f"row without a test file: {row[:80]}"
        current = None
        for token in re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?", last):
            path, name = token
            if path:
                current = REPO / path
                assert current.is_file(), f"{path} does not exist ({row[:60]})"
            if name:
                assert name in _functions(current), f"{current.relative_to(REPO)}::{name} does not exist ({row[:60]})"
        # names in parentheses after a file, e.g. (`test_a`, `test_b`)
        for name in re.findall(r"`(test_\w+)`", last):
            assert any(name in _functions(REPO / f) for f in files), f"{name} not found in {files}"
