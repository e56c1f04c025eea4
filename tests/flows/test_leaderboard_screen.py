"""What the screen shows of `imagebench leaderboard` (issue 26 item 7): below about 200 columns the
table turned into eight vertical `-[ RECORD n ]` blocks (110 lines at 120 columns). Now one line per
model that fits 100 columns, in a real terminal (a pseudo-terminal of that size, as a person's
window) and in a pipe told its width by COLUMNS; `--wide` shows every column at full width; the
figures are written in the one number style while --format json keeps full precision."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pytest

from schemas.lake import MODEL_SCORES
from tests.flows.conftest import REPO
from tests.terminal import on_a_terminal

T0 = dt.datetime(2026, 11, 27, 16, 40, tzinfo=dt.timezone.utc)
PROMPTS, ELIGIBLE = 192, 165
# The demo's eight models, their figures as the demo prints them: (overall, capability, eps, ci
# half-widths, judged, images missing, quarantined). demo-patchy: 12 PASS of 27 decided, 15 of them
# FAIL for images that never came (44.4444...); the others 15 of 15 judged.
FIELD = {
    "demo-pristine": (75.1, 100.0, 50.2, 15, 0, 0),
    "demo-baseline-b": (75.0, 100.0, 50.0, 15, 0, 0),
    "demo-baseline-a": (75.0, 100.0, 50.0, 15, 0, 0),
    "demo-jpeg-q10": (75.0, 100.0, 50.0, 15, 0, 0),
    "demo-baseline-c": (74.9, 100.0, 49.8, 15, 0, 0),
    "demo-noise-s40": (68.5, 86.66666666666667, 50.3, 15, 0, 0),
    "demo-patchy": (45.6, 44.44444444444444, 46.7, 12, 12, 3),
    "demo-blur-r3": (24.7, 0.0, 49.4, 15, 0, 0),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.runs import pinned

    home = tmp_path_factory.mktemp("screen") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEBENCH_HOME", str(home))
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR", "IMAGEBENCH_REFERENCE_VERSION"):
            mp.delenv(key, raising=False)
        settings = load_settings()
        suite = pinned.load_pinned_suite(settings)
        lake = Lake(settings.lake_dir)
        for m, (overall, cap, eps, judged, missing, quarantined) in FIELD.items():
            no_image = missing + quarantined
            passed = round(cap * (judged + no_image) / 100)
            row = {
                "model_id": m, "suite_version": suite.version, "reference_version": settings.reference_version,
                "reference_sha256": "0" * 64, "scorer_name": "hpsv3", "scorer_id": "0123456789abcdef",
                "eps": eps, "eps_lo": eps - 1.9, "eps_hi": eps + 1.9, "eps_prompts_scored": ELIGIBLE - no_image,
                "eps_prompts_eligible": ELIGIBLE, "eps_prompts_lost": no_image,
                "capability": cap, "capability_lo": max(0.0, cap - 20.4), "capability_hi": min(100.0, cap + 18.3),
                "overall": overall, "overall_lo": overall - 9.6, "overall_hi": overall + 8.3,
                "verdicts_pass": passed, "verdicts_fail": judged + no_image - passed,
                "verdicts_undecided": PROMPTS - judged - no_image, "judge_coverage": (judged + no_image) / PROMPTS,
                "provisional": True, "images_ok": PROMPTS - no_image, "images_quarantined": quarantined,
                "images_missing": missing, "complete": no_image == 0, "uncalibrated": True,
                "source_fingerprint": "0" * 64, "run_id": "run-1", "scored_at": T0,
            }
            lake.write_partition("model_scores", m, pa.Table.from_pylist([row], schema=MODEL_SCORES))
    return home


def _env(home, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEBENCH_") and k != "COLUMNS"}
    return {**env, "IMAGEBENCH_HOME": str(home), "IMAGEBENCH_WARM": "off", **extra}


def _piped(home, *args: str, columns: int) -> str:
    done = subprocess.run([sys.executable, "-m", "flows.cli", "leaderboard", *args], cwd=REPO,
                          env=_env(home, COLUMNS=str(columns)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _in_terminal(home, *args: str, columns: int, rows: int = 50) -> str:
    """The command's output in a pseudo-terminal of ``columns`` x ``rows`` (no COLUMNS variable):
    what a person sees in a window that size."""
    code, out = on_a_terminal([sys.executable, "-m", "flows.cli", "leaderboard", *args],
                              _env(home, TERM="xterm-256color"), REPO, timeout=300, size=(columns, rows))
    assert code == 0, out
    text = out.replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # colours and styles


def _model_lines(text: str) -> dict[str, list[str]]:
    return {m: [line for line in text.splitlines() if re.search(rf"(^|\s){re.escape(m)}(\s|$)", line)] for m in FIELD}


def _check_fits(text: str, columns: int) -> None:
    assert "RECORD" not in text, text
    too_wide = [line for line in text.splitlines() if len(line) > columns]
    assert not too_wide, (columns, too_wide)
    lines = _model_lines(text)
    for m, found in lines.items():
        assert len(found) == 1, (m, text)  # one line per model, never a block of lines
    patchy = lines["demo-patchy"][0]
    # The headline figures with their intervals, the band, the judge count, in the one style.
    assert re.search(r"\b\d+(-\d+)?\s+demo-patchy\s+45\.6 \[36\.0, 53\.9\]\s+44\.4 \[24\.0, 62\.7\]\s+46\.7 \[44\.8, 48\.6\]"
                     r"\s+12/192\s", patchy), patchy
    assert "44.4444" not in text and "%" not in patchy
    # Every flag is there, spelled out or as a letter the legend under the table explains.
    flags = patchy.split("12/192", 1)[1].split()
    assert flags in (["provisional", "incomplete", "UNCALIBRATED"], ["P", "I", "U"]), patchy
    if flags == ["P", "I", "U"]:
        assert re.search(r"P provisional.*I incomplete.*U UNCALIBRATED", " ".join(text.split())), text


@pytest.mark.parametrize("columns", [100, 120])
def test_the_leaderboard_fits_a_terminal_of_100_and_120_columns(home, columns):
    _check_fits(_in_terminal(home, columns=columns), columns)


@pytest.mark.parametrize("columns", [100, 120])
def test_the_leaderboard_fits_the_width_a_pipe_is_given(home, columns):
    _check_fits(_piped(home, columns=columns), columns)


def test_wide_shows_every_column_one_line_per_model(home):
    text = _in_terminal(home, "--wide", columns=100)
    assert "RECORD" not in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("band"))
    assert header.split() == ["band", "model_id", "overall", "capability", "eps", "judged", "decided", "coverage",
                              "eps_scored", "quarantined", "missing", "flags", "reference", "scored_at"]
    lines = _model_lines(text)
    assert all(len(found) == 1 for found in lines.values()), text
    patchy = lines["demo-patchy"][0].split()
    # decided 27/192 = the 12 a judge decided and the 15 images that never came; coverage 14.1%
    assert patchy[patchy.index("12/192") + 1: patchy.index("12/192") + 6] == ["27/192", "14.1%", "150/165", "3", "12"]
    assert "provisional incomplete UNCALIBRATED" in lines["demo-patchy"][0]
    assert max(len(line) for line in text.splitlines()) > 100  # its full width, not folded to the window


def test_json_keeps_full_precision_and_the_counts(home):
    rows = {r["model_id"]: r for r in json.loads(_piped(home, "--format", "json", columns=100))}
    patchy = rows["demo-patchy"]
    assert patchy["capability"] == FIELD["demo-patchy"][1]  # 44.44444444444444, not 44.4
    assert (patchy["judged"], patchy["decided"], patchy["prompts"]) == (12, 27, 192)
    assert patchy["coverage"] == 27 / 192
    assert "judge_coverage" not in patchy  # one word for one thing: coverage is decided / prompts
