"""`imagebench models ...`: which models the workspace knows, and retiring them (reversibly).

A typer sub-app added by flows/cli/__init__.py (ARCHITECTURE.md section 7: one file per area). The
logic lives in tasks/runs/models.py; nothing heavy is imported here (no torch, Prefect or GX).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flows.cli.common import OutputFormat, cli_settings, err, render, user_errors, warn_uncalibrated

models_app = typer.Typer(
    help="Models: list them (state, images, scored, retired); retire or unretire one.", no_args_is_help=True
)

TABLE_COLUMNS = ("model_id", "state", "in_store", "images", "scored", "complete", "eps", "capability", "retired / skipped")


def _store_models(settings, console) -> list[str] | None:
    """The store's model folders, or None (with a warning) when the store cannot be listed."""
    return _open_store(settings, console)[1]


def _open_store(settings, console):
    """(the store, its model folders), or (None, None) with a warning when it cannot be listed."""
    from tasks.runs.units_ingest import open_configured_store

    try:
        store = open_configured_store(settings)
        return store, store.list_models()
    except Exception as exc:  # noqa: BLE001 - the lake still answers; say why the store column is empty
        console.print(f"[yellow]store {settings.store_uri} not listed ({type(exc).__name__}: {exc}): "
                      "lake only[/]", highlight=False, soft_wrap=True)
        return None, None


@models_app.command("list")
def models_list(
    source: Annotated[Optional[str], typer.Option(help="object store URI to list (default: IMAGEBENCH_STORE)")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Every model of the store and the lake: state (new, ingested, scored, retired, or "not a
    model": a store folder the nightly skips, with its line), image counts, whether it has a
    result under the reference in force, and its retirement."""
    with user_errors():
        settings = cli_settings()
        if source:
            settings = settings.model_copy(update={"store": source})
        from tasks.runs.models import LIST_COLUMNS, list_models

        store, names = _open_store(settings, err)
        # A folder the nightly skips is listed as such, with its line (tasks.runs.models.nightly_skip).
        folder_keys = None if store is None else (lambda m: [o.key for o in store.list_model_objects(m)])
        rows = list_models(settings, names, folder_keys)
        if fmt is not OutputFormat.table:
            render(LIST_COLUMNS, [[r[c] for c in LIST_COLUMNS] for r in rows], fmt, title="imagebench models")
            warn_uncalibrated(any(r["uncalibrated"] for r in rows), fmt)
            return
        table = []
        for r in rows:
            retired = (f"{r['retired_at']:%Y-%m-%d %H:%M} by {r['retired_by']}: {r['retired_reason']}"
                       if r["retired"] else f"skipped by the nightly: {r['skipped_reason']}" if r["skipped_reason"] else "")
            table.append([
                r["model_id"], r["state"], "" if r["in_store"] is None else r["in_store"],
                f"{r['images_ok']} ok / {r['images_quarantined']} quarantined / {r['images_missing']} missing",
                r["scored"], "" if r["complete"] is None else r["complete"],
                None if r["eps"] is None else round(r["eps"], 1),
                None if r["capability"] is None else round(r["capability"], 1), retired,
            ])
        render(TABLE_COLUMNS, table, fmt, title=f"imagebench models (reference {settings.reference_version})")
        warn_uncalibrated(any(r["uncalibrated"] for r in rows), fmt)


def _record(event: str, model: str, reason: str, by: str | None) -> None:
    with user_errors():
        from tasks.store.storage import validate_model_id

        validate_model_id(model)
        settings = cli_settings()
        from tasks.runs import models

        if event == "retired":
            row = models.retire(settings, model, reason, by, store_models=_known_or_store(settings, model, err))
        else:
            row = models.unretire(settings, model, reason, by)
        models.ensure_catalog(settings)  # a catalog of an older format would not honour the record
        what = "hidden from the leaderboard and the nightly" if event == "retired" else "back on the leaderboard and in the nightly"
        err.print(f"[green]{model} {event}[/] ({row['at']:%Y-%m-%d %H:%M:%S} UTC, by {row['actor']}: {row['reason']}): "
                  f"{what}; its rows stay in the lake", highlight=False, soft_wrap=True)


def _known_or_store(settings, model: str, console) -> list[str] | None:
    from tasks.lake.tables import Lake

    lake = Lake(settings.lake_dir)
    if any(lake.partition_path(t, model).is_file() for t in ("images", "model_scores", "hps_scores", "verdicts")):
        return None  # known to the lake: no need to list the store
    return _store_models(settings, console)


@models_app.command("retire")
def models_retire(
    model: Annotated[str, typer.Argument(metavar="MODEL")],
    reason: Annotated[str, typer.Option("--reason", help="why (recorded with who and when)")],
    by: Annotated[Optional[str], typer.Option("--by", help="who (default: user@host)")] = None,
) -> None:
    """Hide a model from the leaderboard and the nightly; its rows stay in the lake
    (`imagebench models unretire` reverses it). Recorded in the lake table model_events."""
    _record("retired", model, reason, by)


@models_app.command("unretire")
def models_unretire(
    model: Annotated[str, typer.Argument(metavar="MODEL")],
    reason: Annotated[str, typer.Option("--reason", help="why (recorded with who and when)")],
    by: Annotated[Optional[str], typer.Option("--by", help="who (default: user@host)")] = None,
) -> None:
    """Undo a retirement: the model is back on the leaderboard and in the nightly."""
    _record("unretired", model, reason, by)
