"""The run record: what one flow run discovered, scored, skipped, quarantined and errored, and
how long each stage took. Written to the lake's ``runs`` table and shown as a markdown artifact.

Pure bookkeeping (no Prefect): the flow fills it as results come back, then calls :meth:`row`
and :meth:`markdown`. Stage seconds are busy time summed over that stage's tasks, measured inside
the tasks (they may run on other processes), so stages that overlap add up to more than the wall
time in ``total_s``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from schemas.lake import MODEL_DISPOSITIONS, STAGES

COUNTERS = (
    "images_ok", "images_quarantined", "images_missing", "hps_images_scored", "hps_images_resumed",
    "judge_items", "verdicts_decided", "prefect_tasks",
)
MAX_ERROR_CHARS = 2000


@dataclass
class RunRecord:
    run_id: str
    flow: str
    suite_version: str
    reference_version: str
    parameters: dict[str, Any] = field(default_factory=dict)
    scorer_id: str | None = None
    runtime: str | None = None  # ScorerRuntime JSON of the run's scoring process (canary)
    canary_max_drift: float | None = None
    flow_run_id: str | None = None
    deployment: str | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    _t0: float = field(default_factory=time.monotonic, repr=False)
    dispositions: dict[str, str] = field(default_factory=dict)  # model -> disposition
    skipped: dict[str, str] = field(default_factory=dict)  # folder -> why it is no model (the artifact says it)
    errors: list[str] = field(default_factory=list)
    corrupt_files: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    stage_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    stage: str = "start"  # the last stage entered: how far a crashed run got
    # Writes the record while the run goes on (tasks.runs.state.RunJournal); None: only at the end.
    journal: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ---- filling ------------------------------------------------------------------------
    def enter(self, stage: str, force: bool = False) -> None:
        """The run moves on to ``stage`` (e.g. "hpsv3 lab-a"); the journal records it (every
        time when ``force``, else at most once a second)."""
        with self._lock:
            self.stage = stage
        if self.journal is not None:
            self.journal.checkpoint(force)

    def mark(self, model_id: str, disposition: str) -> None:
        if disposition not in MODEL_DISPOSITIONS:
            raise ValueError(f"unknown disposition {disposition!r}")
        with self._lock:
            if self.dispositions.get(model_id) != "errored":  # an error is final for the run
                self.dispositions[model_id] = disposition

    def skip(self, folder: str, why: str) -> None:
        """An object-store folder that is no model of the suite: counted as "invalid", with why."""
        self.mark(folder, "invalid")
        with self._lock:
            self.skipped[folder] = " ".join(str(why).split())[:MAX_ERROR_CHARS]

    def error(self, model_id: str | None, message: str) -> None:
        text = " ".join(str(message).split())[:MAX_ERROR_CHARS]
        with self._lock:
            self.errors.append(f"{model_id}: {text}" if model_id else text)
            if model_id:
                self.dispositions[model_id] = "errored"

    def corrupt(self, description: str) -> None:
        with self._lock:
            self.corrupt_files.append(description)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self.counts[k] += int(v)

    def timed(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.stage_s[stage] += float(seconds)

    # ---- reading ------------------------------------------------------------------------
    def models(self, disposition: str) -> list[str]:
        return sorted(m for m, d in self.dispositions.items() if d == disposition)

    @property
    def failed(self) -> bool:
        return bool(self.errors or self.corrupt_files)

    def row(self, status: str, error: str | None = None) -> dict[str, Any]:
        finished = datetime.now(timezone.utc)
        row: dict[str, Any] = {
            "run_id": self.run_id,
            "flow": self.flow,
            "flow_run_id": self.flow_run_id,
            "deployment": self.deployment,
            "parameters_json": json.dumps(self.parameters, sort_keys=True, default=str),
            "suite_version": self.suite_version,
            "reference_version": self.reference_version,
            "scorer_id": self.scorer_id,
            "runtime": self.runtime,
            "canary_max_drift": self.canary_max_drift,
            "status": status,
            "stage": self.stage,
            "error": " ".join(error.split())[:MAX_ERROR_CHARS] if error else None,
            "started_at": self.started_at,
            "finished_at": finished,
            "total_s": time.monotonic() - self._t0,
            "models_discovered": len(self.dispositions),
            "errors": list(self.errors),
            "corrupt_files": list(self.corrupt_files),
        }
        for d in MODEL_DISPOSITIONS:
            row[f"models_{d}"] = self.models(d)
        row.update(self.counts)
        for s in STAGES:
            row[f"{s}_s"] = self.stage_s[s]
        return row

    def markdown(self, row: dict[str, Any]) -> str:
        lines = [
            f"# {self.flow} run {self.run_id}: {row['status']}",
            "",
            f"- suite `{self.suite_version}`, reference `{self.reference_version}`, scorer `{self.scorer_id}`",
            f"- {row['total_s']:.1f} s wall; {row['prefect_tasks']} Prefect tasks",
        ]
        if row["error"]:
            lines.append(f"- **error**: {row['error']}")
        lines += ["", "| models | count | which |", "|---|---|---|"]
        for d in MODEL_DISPOSITIONS:
            ms = row[f"models_{d}"]
            if ms:
                shown = ", ".join(ms[:20]) + (f", ... ({len(ms) - 20} more)" if len(ms) > 20 else "")
                lines.append(f"| {d} | {len(ms)} | {shown} |")
        lines += ["", "| images | count |", "|---|---|"]
        lines += [f"| {k} | {row[k]} |" for k in COUNTERS if k != "prefect_tasks"]
        lines += ["", "| stage | busy seconds |", "|---|---|"]
        lines += [f"| {s} | {row[f'{s}_s']:.2f} |" for s in STAGES]
        if self.skipped:
            lines += ["", "## Skipped folders (no model of the suite)", ""]
            lines += [f"- `{f}`: {why}" for f, why in sorted(self.skipped.items())]
        if row["errors"]:
            lines += ["", "## Errors", ""] + [f"- {e}" for e in row["errors"]]
        if row["corrupt_files"]:
            lines += ["", "## Corrupt lake files (moved to `_corrupt/`, recomputed)", ""]
            lines += [f"- {c}" for c in row["corrupt_files"]]
        return "\n".join(lines) + "\n"
