"""`imagebench demo` / `make demo`: the whole pipeline on embedded defaults, offline.

1. Seeds the local object store with demo models built from scikit-image's bundled photos.
2. Without real HPSv3 weights, writes a tiny randomly initialised HPSv3-architecture model
   (flagged uncalibrated in its checkpoint metadata, so every output says so).
3. Builds a demo reference from the demo baseline field, in the workspace (never in ./reference).
4. Runs the nightly flow on the store (HPSv3 + the judges it can reach offline: Tesseract OCR
   for the Text Rendering prompts; the rest is shown as not judged), writes the static report
   to <home>/report, then the CLI prints the leaderboard.
Running it again changes nothing: the reference exists and every model is up to date.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Callable, ContextManager

from rich.console import Console

from schemas.settings import DEFAULT_CHECKPOINT, load_settings
from tasks.scores.reference import DEMO_REFERENCE_VERSION  # the reference hint knows the demo's too


def _real_weights_available() -> bool:
    """True when the user pointed us at real weights, or they sit in the local HF cache."""
    if "IMAGEBENCH_HPSV3_CHECKPOINT" in os.environ:
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(DEFAULT_CHECKPOINT, "HPSv3.safetensors")
        return isinstance(hit, str)
    except Exception:
        return False


def _configure(console: Console) -> None:
    """Point the settings at the demo's pieces (env vars, so the flows see them too)."""
    settings = load_settings()
    home = settings.home
    os.environ.setdefault("IMAGEBENCH_REFERENCE_DIR", str(home / "reference"))
    os.environ.setdefault("IMAGEBENCH_REFERENCE_VERSION", DEMO_REFERENCE_VERSION)
    if _real_weights_available():
        console.print("[green]using real HPSv3 weights[/]")
        return
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    model_dir = home / "demo-model"
    base_dir, ckpt = model_dir / "base", model_dir / "HPSv3-demo-uncalibrated.safetensors"
    if not ckpt.exists():
        console.print(f"writing tiny uncalibrated demo model to {model_dir}")
        write_tiny_base_model(base_dir)
        write_tiny_checkpoint(base_dir, ckpt, seed=0)
    os.environ["IMAGEBENCH_HPSV3_BASE_MODEL"] = str(base_dir.resolve())
    os.environ["IMAGEBENCH_HPSV3_CHECKPOINT"] = str(ckpt.resolve())
    console.print("[bold yellow]no real HPSv3 weights found: using UNCALIBRATED demo weights[/]")


def _pin_demo_definition(settings, console: Console) -> None:
    """The demo reference dir gets copies of the committed suite and judge routing, pinned like
    the real ones."""
    from tasks.scores.reference import pin_suite

    from tasks.scores.golden import copy_golden_set

    shipped = Path(__file__).resolve().parents[1] / "reference"
    for dst in (settings.suite_path, settings.routing_path):
        src = shipped / dst.name
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        pin_suite(settings.reference_dir, dst)
    copy_golden_set(shipped, settings.reference_dir, settings.golden_set)  # for the reference's canary


def run_demo(console: Console, progress: Callable[[], ContextManager], nightly_line: Callable[[dict], str]) -> None:
    """The demo's work, printed on ``console``; ``progress`` (the command line's progress display)
    and ``nightly_line`` (its one-line nightly summary) are passed in by the command, so this
    runtime module does not reach up into the command line."""
    _configure(console)
    settings = load_settings()
    # Saved before any work, so every later command in this workspace (score, nightly, backfill,
    # serve and the flow runs it serves) uses the demo's reference and scorer without exports.
    settings_file = write_workspace_settings(settings)
    from flows.env import prepare_prefect_env

    prepare_prefect_env(settings.home)
    from tasks.runs import pinned, units_ingest
    from tasks.store.demo import BASELINE_FIELD, CONTENDERS, seed_store

    _pin_demo_definition(settings, console)
    suite = pinned.load_pinned_suite(settings)
    store = units_ingest.open_configured_store(settings)
    console.print(f"seeding demo models into {store.uri}")
    written = seed_store(store, [(p.prompt_id, p.prompt) for p in suite.prompts], BASELINE_FIELD + CONTENDERS)
    for model_id, n in written.items():
        console.print(f"  {model_id}: {n} objects written" if n else f"  {model_id}: already present")

    from flows.pipeline import nightly_flow, reference_build_flow

    with progress():
        if settings.reference_path.exists():
            console.print(f"reference {settings.reference_version} exists: verifying, never rebuilding")
        else:
            console.print(f"building demo reference {settings.reference_version} from the baseline field")
            reference_build_flow(settings.reference_version, [m.model_id for m in BASELINE_FIELD])
        summary = nightly_flow()
    console.print(nightly_line(summary), highlight=False)
    for model_id, detail in summary["invalid"].items():  # a folder that is no model: one line, the demo goes on
        console.print(f"skipped {model_id!r}: {detail}", highlight=False, markup=False)
    from tasks.report import build_report
    from tasks.lake.report_data import report_data_from_lake

    from flows.demo_beauty import run_demo_study
    from tasks.report.study import build_study_pages

    run_demo_study(settings, console)  # a small Beauty Index study with SIMULATED answers (docs/BEAUTY.md)
    from flows.demo_vab import run_demo_vab

    run_demo_vab(settings, console)  # a small VAB run over the demo sets of graded degradations (docs/VAB.md)
    reference = pinned.load_verified_reference(settings, suite, None)
    studies = build_study_pages(settings, settings.home / "report")
    from tasks.report.vab import build_vab_pages

    vab_pages = build_vab_pages(settings, settings.home / "report")
    index = build_report(report_data_from_lake(settings, suite, reference), settings.home / "report", studies=studies,
                         vab=vab_pages)
    console.print(f"report: [bold]{index}[/] (sortable leaderboard, Capability-vs-EPS plot, heatmaps, model pages)")
    console.print("Beauty Index demo study ([bold yellow]SIMULATED[/] answers): `imagebench study leaderboard --study "
                  "demo-beauty`, its page report/studies/demo-beauty.html, `imagebench study export --study demo-beauty "
                  "--times none` (its simulated judges each took an hour of their own: with times, each would be unique)")
    console.print(
        f"the demo's settings (reference, scorer) are saved in [bold]{settings_file}[/]: `imagebench score`, "
        "`nightly`, `backfill` and `serve` in this workspace use them (environment variables still win)"
    )


DEMO_SETTING_KEYS = ("reference_dir", "reference_version", "hpsv3_base_model", "hpsv3_checkpoint")


def write_workspace_settings(settings) -> Path:
    """Write the demo's reference and scorer into ``<home>/imagebench.yaml`` (the workspace
    settings file schemas/settings.py reads below env vars and IMAGEBENCH_CONFIG). Other keys
    already in the file are kept; paths are written absolute, so any working directory works."""
    import yaml

    from schemas.settings import WORKSPACE_SETTINGS_FILE

    path = settings.home / WORKSPACE_SETTINGS_FILE
    values = yaml.safe_load(path.read_text()) if path.is_file() else {}
    values = values if isinstance(values, dict) else {}
    for key in DEMO_SETTING_KEYS:
        value = getattr(settings, key)
        if key == "reference_dir" or (key.startswith("hpsv3_") and Path(str(value)).exists()):
            value = str(Path(value).resolve())  # a local path, not a hub id
        values[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text("# Written by `imagebench demo`: settings of this workspace (env vars and IMAGEBENCH_CONFIG win).\n"
                   + yaml.safe_dump(values, sort_keys=True))
    tmp.replace(path)
    return path


# ---- what `make demo` prints last: the exact commands a user pastes next (issue 15, item 5) -------
#
# `make demo` runs `.venv/bin/imagebench demo`; it cannot change the user's shell, so a plain
# `imagebench leaderboard` typed afterwards is "command not found" unless the virtual environment's
# bin folder is on PATH. The demo says so, with the one line that fixes it. Standard library only.

# What to try after the demo, in the order a new user reads the README.
DEMO_NEXT_COMMANDS = (
    "imagebench leaderboard",
    "imagebench breakdown --model demo-patchy",
    "imagebench runs",
    "imagebench models list",
    "imagebench report --out site/",
)


def _shown_path(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when it is inside it (``.venv/bin``), else absolute."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def activation_line(bin_dir: Path, path_env: str | None, cwd: Path) -> str | None:
    """The shell line that puts ``bin_dir``'s ``imagebench`` first on PATH, or None when typing
    ``imagebench`` already runs that one (or ``bin_dir`` has no ``imagebench`` to point at)."""
    exe = bin_dir / "imagebench"
    if not exe.is_file():
        return None
    found = shutil.which("imagebench", path=path_env or "")
    if found is not None:
        try:
            if os.path.samefile(found, exe):
                return None
        except OSError:
            pass
    shown = _shown_path(bin_dir, cwd)
    if (bin_dir / "activate").is_file():
        return f"source {shlex.quote(shown + '/activate')}"
    return f'export PATH={shlex.quote(shown)}:"$PATH"'


def next_steps_text(bin_dir: Path, path_env: str | None, cwd: Path) -> str:
    """The lines the demo ends with: the activation line when needed, then commands to paste."""
    line = activation_line(bin_dir, path_env, cwd)
    out = []
    if line:
        out.append(f"next: `imagebench` is in {_shown_path(bin_dir, cwd)}, which is not on your PATH; "
                   "run this once in each new shell (or prefix the commands with that folder):")
        out.append(f"  {line}")
        out.append("then, for example:")
    else:
        out.append("next, for example:")
    out += [f"  {c}" for c in DEMO_NEXT_COMMANDS]
    return "\n".join(out)


def print_next_steps(console) -> None:
    """Print :func:`next_steps_text` for the running interpreter's bin folder (not resolved:
    ``.venv/bin/python`` is a symlink to the system Python)."""
    console.print(next_steps_text(Path(sys.executable).parent.absolute(), os.environ.get("PATH"), Path.cwd()),
                  markup=False, highlight=False, soft_wrap=True)
