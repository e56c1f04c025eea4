"""Real studies for the issue-16 tests: a workspace whose object store holds the tools' images,
a study opened by ``open_study`` (blinded, pre-registered), answers recorded through the panel
store exactly as the web app records them, analysed by the publish units into the lake."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

TOOLS = ("tool-alpha", "tool-beta", "tool-gamma")
# The template's own labels: exactly what an attacker would guess first.
JUDGES = [("photographers-01", "photographers"), ("photographers-02", "photographers"),
          ("aphantasia-01", "aphantasia"), ("aphantasia-02", "aphantasia")]


def workspace(home: Path, mp: pytest.MonkeyPatch, tools=TOOLS):
    """Settings of a fresh workspace (environment as the CLI sees it) with every tool's images."""
    from schemas.settings import load_settings
    from tasks.beauty.suite import load_beauty_suite
    from tasks.runs.units_ingest import open_configured_store
    from tests.flows.conftest import image_bytes

    mp.setenv("IMAGEBENCH_HOME", str(home))
    for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE", "IMAGEBENCH_REFERENCE_DIR"):
        mp.delenv(key, raising=False)
    settings = load_settings()
    store = open_configured_store(settings)
    for t, tool in enumerate(tools):
        for k, p in enumerate(load_beauty_suite(settings.reference_dir).prompts):
            store.write(f"models/{tool}/{p.prompt_id}.png", image_bytes(100 * t + k, side=64))
    return settings


def write_definition(settings, study_id: str, judges=JUDGES, tools=TOOLS, resamples: int = 100, **fields) -> Path:
    """study.yaml of a test study (``fields``: more of its keys, e.g. ``quality``)."""
    from tasks.beauty.study import study_dir

    d = study_dir(settings, study_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / "study.yaml").write_text(yaml.safe_dump({
        "study_id": study_id, "tools": list(tools), "host_tool": tools[-1], "memo": False,
        "judges": [{"label": label, "group": group} for label, group in judges],
        "analysis": {"bootstrap_resamples": resamples, "permutations": 100}, **fields,
    }))
    return d


@dataclass
class Study:
    study_id: str
    study_dir: Path
    opened_at: datetime


def panel_clock(mp: pytest.MonkeyPatch, start: datetime, step: timedelta) -> None:
    """The panel store's clock made explicit: its first reading is ``start``, each next one
    ``step`` later (``next_item`` reads it for shown_at, ``record_answer`` for answered_at), so
    tests choose where answers fall against the plan's ``created_at`` and the minute."""
    from tasks.panel.store import to_us

    state = {"t": to_us(start)}
    step_us = int(step.total_seconds() * 1_000_000)

    def now_us() -> int:
        t = state["t"]
        state["t"] += step_us
        return t

    mp.setattr("tasks.beauty.store.now_us", now_us)


def open_and_answer(settings, study_id: str, answer: Callable[[str, str, str], bool], judges=JUDGES,
                    stop_after: dict[str, int] | None = None, opened_ago: timedelta = timedelta(hours=2),
                    legacy_seed: int | None = None, opened_at: datetime | None = None, interleave: bool = False,
                    loads_image: Callable[[str, str, str], bool] | None = None, **fields) -> Study:
    """Open the study (its plan dated ``opened_ago`` before now, or at ``opened_at``) and let each
    judge answer through the panel store: ``answer(label, tool, prompt_id)``; ``stop_after[label]``
    answers at most (0: never started). ``legacy_seed``: a format-/1 pre-registration (the seed
    published in the plan, as studies opened before issue 16 have) written before the open.
    ``interleave``: the judges take turns, one answer each per round (a panel answering at the same
    time), instead of one judge after the other. ``loads_image(label, tool, prompt_id)``: whether
    the judge's browser fetches the image before answering (the store's quality-control evidence;
    default: never). ``fields``: more keys of study.yaml."""
    from tasks.beauty.study import open_study
    from tasks.beauty.store import PanelStore

    write_definition(settings, study_id, judges, **fields)
    opened_at = opened_at or datetime.now(UTC) - opened_ago
    if legacy_seed is not None:
        write_legacy_preregistration(settings, study_id, legacy_seed, opened_at)
    opened = open_study(settings, study_id, now=opened_at)
    panel = PanelStore.open(opened.study_dir, study_id=study_id)
    try:
        pairs = {r["image_id"]: (r["tool"], r["prompt_id"]) for r in panel.image_rows()}

        def answer_next(label: str) -> bool:
            """The judge's next answer; False when they are done (or stopped)."""
            limit = (stop_after or {}).get(label)
            if limit is not None and panel.progress_of(label)[0] >= limit:
                return False
            item = panel.next_item(label)
            if item is None:
                return False
            tool, prompt = pairs[item.image_id]
            if loads_image is not None and loads_image(label, tool, prompt):
                panel.serve_image(label, item.image_id)
            panel.record_answer(label, item.position, item.image_id, answer(label, tool, prompt))
            return True

        if interleave:
            active = [label for label, _ in judges]
            while active:
                active = [label for label in active if answer_next(label)]
        else:
            for label, _ in judges:
                while answer_next(label):
                    pass
    finally:
        panel.dispose()
    return Study(study_id, opened.study_dir, opened_at)


def write_legacy_preregistration(settings, study_id: str, seed: int, created: datetime) -> None:
    """A pre-registration as imagebench wrote it before issue 16 (format /1, order seed in it)."""
    from schemas.study import HYPOTHESES, PreRegistration
    from tasks.beauty.study import _write_prereg, canonical_definition, load_definition, study_dir
    from tasks.beauty.suite import load_beauty_suite
    import hashlib

    d = study_dir(settings, study_id)
    definition = load_definition(d / "study.yaml")
    suite = load_beauty_suite(settings.reference_dir)
    _write_prereg(d, PreRegistration(
        format="imagebench-preregistration/1", study_id=study_id, created_at=created.isoformat(),
        definition_sha256=hashlib.sha256(canonical_definition(definition)).hexdigest(), suite=suite.version,
        suite_sha256=suite.sha256, hypotheses=dict(HYPOTHESES), analysis=definition.analysis, order_seed=seed,
        host_tool=definition.host_tool, praised_for_aesthetics=list(definition.praised_for_aesthetics)))


def analyse(settings, study_id: str, mixed_resamples: int = 3):
    """The `study-analyze` flow's units (the flow itself is run by the CLI tests): answers ->
    analysis -> Great Expectations -> lake -> catalog."""
    from tasks.runs import pinned, units_aggregate
    from tasks.beauty import publish
    from tasks.beauty.sources import collect_answers, load_study_context

    ctx = load_study_context(settings, study_id)
    tables = publish.analyze(settings, ctx, collect_answers(settings, ctx), mixed_resamples=mixed_resamples)
    publish.validate(tables)
    publish.write(settings, tables)
    units_aggregate.refresh(settings, pinned.load_pinned_suite(settings))
    return tables


def cli(*args: str):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)
