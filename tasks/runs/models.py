"""The models a workspace knows: which exist, in what state, retired or not, and the checks that
keep a typo or a wrong store prefix from reaching the lake.

Plain functions over the lake and the object store (no Prefect, torch or Great Expectations:
`imagebench models list` and `sql` stay light). The CLI is flows/cli/models.py.

* ``require_objects``: an ingest that finds no object for a model refuses and changes nothing:
  a model unknown everywhere is a typo (nearest ids named); a model with ingested images is a
  wrong store or prefix (the source searched and the one its images came from named).
* ``not_a_model``: why a folder under ``models/`` is no model of the suite (none of its objects
  names a prompt of it: a Beauty Index tool's images in the layout before issue 26 item 2, stray
  files): the nightly skips it with that line, ``score`` refuses it with it.
* ``retire`` / ``unretire``: append a ``model_events`` row (who, when, why); the leaderboard view
  and the nightly honour the latest event of each model; nothing is deleted.
* ``nightly_skip``: the line the nightly skips a store folder with (empty, or :func:`not_a_model`
  and never ingested); ``list_models`` shows the same line, state "not a model".
* ``list_models``: store + lake + events, one row per model.
* ``quarantine_lines``: why each of a model's objects was quarantined (every ingesting command
  prints them).
* ``ensure_catalog``: the DuckDB catalog exists (and is of the current format) from the first
  command on, so ``prompts`` can be queried before anything was scored.
"""

from __future__ import annotations

import difflib
import getpass
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from schemas.lake import MODEL_EVENTS
from schemas.settings import Settings
from tasks.lake.tables import Lake
from tasks.store.storage import MODELS_PREFIX, beauty_root, prompt_id_of_key, validate_model_id


class ModelNotFound(LookupError):
    """No such model: no object in the store (and nothing in the lake); the message names the
    store and prefix searched and the nearest existing ids."""


class NotAModel(ModelNotFound):
    """A folder under ``models/`` whose objects name no prompt of the suite: no model of it."""


class StoreMismatch(LookupError):
    """The store has no object of a model the lake holds ingested images of: a wrong store or
    prefix. The ingest refuses; nothing is changed."""


class ModelStateError(ValueError):
    """retire of a retired model, unretire of a model that is not retired."""


def nearest_ids(model_id: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Existing ids closest to a mistyped one (case-insensitive ``difflib.get_close_matches``)."""
    by_lower: dict[str, str] = {}
    for c in sorted(set(candidates)):
        by_lower.setdefault(c.lower(), c)
    return [by_lower[m] for m in difflib.get_close_matches(model_id.lower(), list(by_lower), n=n, cutoff=0.6)]


def _suggestion(model_id: str, candidates: Sequence[str]) -> str:
    # Never the id itself ("no model 'a' ...; did you mean 'a'?"): a folder of that name that holds
    # nothing of the suite is explained by not_a_model, not by a spelling.
    candidates = [c for c in candidates if c != model_id]
    close = nearest_ids(model_id, candidates)
    if close:
        return "did you mean " + ", ".join(repr(c) for c in close) + "?"
    if candidates:
        shown = ", ".join(sorted(candidates)[:5]) + (", ..." if len(candidates) > 5 else "")
        return f"models there: {shown} ({len(candidates)}; `imagebench models list`)"
    return f"the store has no model folders under {MODELS_PREFIX} at all: is this the right store and prefix?"


def not_a_model(model_id: str, keys: Sequence[str], suite_version: str, suites: dict[str, frozenset[str]]) -> str | None:
    """Why the folder ``models/<model_id>/`` with objects ``keys`` is not a model of the suite
    ``suite_version``, or None when it is (some object names one of its prompts, even badly: a
    ``p.bmp`` is then quarantined by ingest) or holds nothing (an empty folder, said elsewhere).
    ``suites``: every pinned suite's prompt ids (tasks.scores.suite.prompt_ids_by_suite)."""
    own = suites.get(suite_version, frozenset())
    named = [prompt_id_of_key(k) for k in keys]
    if not keys or any(p in own for p in named):
        return None
    folder = f"{MODELS_PREFIX}{model_id}/"
    parts = []
    for version, ids in sorted(suites.items()):
        n = sum(1 for p in named if p is not None and p in ids)
        if version == suite_version or not n:
            continue
        where = (f": a Beauty Index study's tool, whose images go under {beauty_root(version)}{model_id}/"
                 if version.startswith("beauty-") else "")
        parts.append(f"{n} image{'s' if n != 1 else ''} for prompts of {version}{where}")
    others = [k for k, p in zip(keys, named) if not any(p is not None and p in ids for ids in suites.values())]
    if others:
        parts.append(f"{len(others)} named for no prompt (e.g. {others[0]})")
    n = len(keys)
    return (f"{folder} is not a model of {suite_version}: none of its {n} object{'s' if n != 1 else ''} is an image "
            f"for one of its prompts ({'; '.join(parts)})")


def ever_ingested(lake: Lake, model_id: str) -> bool:
    """Whether the lake holds an image of the model that was there (ok or quarantined): such a
    model stays one, whatever its folder holds now (ingest then refuses or re-scores it)."""
    if not lake.partition_path("images", model_id).is_file():
        return False
    return any(s != "missing" for s in lake.read("images", [model_id]).column("state").to_pylist())


def nightly_skip(lake: Lake, model_id: str, keys: Sequence[str], suite_version: str,
                 suites: dict[str, frozenset[str]]) -> str | None:
    """The one line the nightly skips the folder ``models/<model_id>/`` (a valid id, not retired,
    objects ``keys``) with, or None when the nightly takes it as a model of ``suite_version``:
    an empty folder never ingested, or one of which no object names a prompt of the suite
    (:func:`not_a_model`) and no image was ever ingested. `imagebench models list` shows the
    same line (state "not a model"), so it never lists as "new" what the nightly will not score."""
    if not keys and not lake.partition_path("images", model_id).is_file():
        # An empty folder never ingested: nothing to score (one with ingested images goes on to
        # ingest, which refuses it loudly: require_objects).
        return f"empty folder: no objects under {MODELS_PREFIX}{model_id}/"
    why = not_a_model(model_id, keys, suite_version, suites)
    if why and not ever_ingested(lake, model_id):
        return f"{why} (docs/STORAGE.md)"
    return None


def _source_of(images: pa.Table, model_id: str) -> str | None:
    """Where a model's ingested images came from: the store prefix of their object URIs."""
    marker = f"/{MODELS_PREFIX}{model_id}/"
    for uri in images.column("object_uri").to_pylist():
        if uri and marker in uri:
            return uri[: uri.index(marker) + len(marker)]
    return None


def require_objects(store, lake: Lake, model_id: str, n_objects: int, not_model: str | None = None) -> None:
    """Refuse an ingest that found no object for ``model_id`` (raises; returns when it found some).
    ``not_model``: why the folder, which holds only other suites' images, is not a model of this
    one (:func:`not_a_model`), said instead of a spelling suggestion.

    Nothing has been written when this runs, so a refusal changes nothing.
    """
    if n_objects:
        return
    searched = f"{store.uri.rstrip('/')}/{MODELS_PREFIX}{model_id}/"
    images = lake.read("images", [model_id])
    held = [s for s in images.column("state").to_pylist() if s != "missing"]
    if held:
        came_from = _source_of(images, model_id)
        raise StoreMismatch(
            f"refusing to ingest {model_id!r}: no objects under {searched}, but the lake holds {len(held)} "
            f"ingested images of it" + (f" from {came_from}" if came_from else "")
            + "; check --source / IMAGEBENCH_STORE (nothing was changed). If its images were removed on "
            f"purpose: imagebench models retire {model_id} --reason '...'"
        )
    if not_model:
        raise NotAModel(f"{not_model}; nothing was ingested (docs/STORAGE.md)")
    try:
        candidates = store.list_models()
    except Exception:  # noqa: BLE001 - the listing above worked; the suggestion is a courtesy
        candidates = []
    if model_id in candidates:  # the folder is there (a local directory) with nothing in it
        raise ModelNotFound(f"no model {model_id!r}: {searched} holds no object (nothing was changed)")
    known = set(candidates) | set(lake.models("model_scores")) | set(lake.models("images"))
    raise ModelNotFound(f"no model {model_id!r}: no objects under {searched}; {_suggestion(model_id, sorted(known))}")


def check_model_folder(store, lake: Lake, model_id: str, suite_version: str, reference_dir: Path) -> None:
    """What an ingest of ``model_id`` would refuse first, from one listing (the command line checks
    it before Prefect starts): no object of the suite at all (:func:`require_objects`), said as
    :func:`not_a_model` when the folder holds only other suites' images."""
    from tasks.scores.suite import prompt_ids_by_suite

    suites = prompt_ids_by_suite(reference_dir)
    own = suites.get(suite_version, frozenset())
    others = frozenset().union(*(ids for v, ids in suites.items() if v != suite_version)) - own
    keys = [o.key for o in store.list_model_objects(model_id)]
    n = sum(1 for k in keys if prompt_id_of_key(k) not in others)  # what ingest keeps (tasks.store.ingest)
    require_objects(store, lake, model_id, n, not_model=not_a_model(model_id, keys, suite_version, suites) if keys else None)


def require_known(settings: Settings, model_id: str) -> None:
    """For read commands (`breakdown`, `compare`): the model has rows in the lake."""
    validate_model_id(model_id)
    lake = Lake(settings.lake_dir)
    if any((lake.partition_path(t, model_id)).is_file() for t in ("images", "model_scores", "hps_scores", "verdicts")):
        return
    known = set()
    for t in ("images", "model_scores", "hps_scores"):
        known |= set(lake.models(t))
    raise ModelNotFound(
        f"no model {model_id!r} in the lake {settings.lake_dir}; "
        + (_suggestion(model_id, sorted(known)) if known else "nothing has been ingested or scored there yet")
    )


# ---- retirement ------------------------------------------------------------------------------


def events(lake: Lake, model_ids: Sequence[str] | None = None) -> list[dict]:
    """model_events rows, oldest first."""
    return sorted(lake.read("model_events", model_ids).to_pylist(), key=lambda r: (r["at"], r["event"]))


def retired_models(lake: Lake) -> dict[str, dict]:
    """model -> its retirement row, for models whose latest event is a retirement."""
    latest: dict[str, dict] = {}
    for row in events(lake):
        latest[row["model_id"]] = row
    return {m: r for m, r in latest.items() if r["event"] == "retired"}


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (containers): the host still says something
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _append_event(lake: Lake, model_id: str, event: str, reason: str, actor: str | None) -> dict:
    reason = (reason or "").strip()
    if not reason:
        raise ModelStateError(f"{event} {model_id}: --reason is required (the record says why)")
    row = {"model_id": model_id, "event": event, "reason": reason, "actor": (actor or "").strip() or default_actor(),
           "at": datetime.now(timezone.utc)}
    # (model, event, at) never repeats: an upsert on it only ever appends.
    lake.replace_rows("model_events", model_id, pa.Table.from_pylist([row], schema=MODEL_EVENTS),
                      match_on=["model_id", "event", "at"])
    return row


def _known_anywhere(settings: Settings, lake: Lake, model_id: str, store_models: Sequence[str] | None) -> bool:
    for t in ("images", "model_scores", "hps_scores", "verdicts"):
        if lake.partition_path(t, model_id).is_file():
            return True
    return store_models is not None and model_id in store_models


def retire(settings: Settings, model_id: str, reason: str, actor: str | None = None,
           store_models: Sequence[str] | None = None) -> dict:
    """Hide a model from the leaderboard and the nightly (its rows stay in the lake)."""
    validate_model_id(model_id)
    lake = Lake(settings.lake_dir)
    current = retired_models(lake).get(model_id)
    if current:
        raise ModelStateError(
            f"{model_id!r} is already retired (since {current['at']:%Y-%m-%d %H:%M} UTC by {current['actor']}: "
            f"{current['reason']}); nothing recorded"
        )
    if not _known_anywhere(settings, lake, model_id, store_models):
        known = set(store_models or [])
        for t in ("images", "model_scores"):
            known |= set(lake.models(t))
        raise ModelNotFound(f"no model {model_id!r} in the lake or the store; {_suggestion(model_id, sorted(known))}")
    return _append_event(lake, model_id, "retired", reason, actor)


def unretire(settings: Settings, model_id: str, reason: str, actor: str | None = None) -> dict:
    """Undo a retirement: the model is back on the leaderboard and in the nightly."""
    validate_model_id(model_id)
    lake = Lake(settings.lake_dir)
    if model_id not in retired_models(lake):
        raise ModelStateError(f"{model_id!r} is not retired; nothing recorded")
    return _append_event(lake, model_id, "unretired", reason, actor)


# ---- listing ---------------------------------------------------------------------------------

LIST_COLUMNS = (
    "model_id", "state", "skipped_reason", "in_store", "images_ok", "images_quarantined", "images_missing", "scored", "complete",
    "eps", "capability", "scored_at", "retired", "retired_at", "retired_by", "retired_reason", "uncalibrated",
)


def is_complete(row: dict) -> bool:
    """The one definition of `complete` (docs/LAKE.md): every prompt of the suite has an ok image
    and every EPS-eligible prompt a mu. Judge coverage is separate: `provisional`."""
    return bool(row["complete"]) and row["images_quarantined"] == 0 and row["images_missing"] == 0


def list_models(settings: Settings, store_models: Sequence[str] | None,
                folder_keys: Callable[[str], Sequence[str]] | None = None) -> list[dict]:
    """One row per model found in the store (``store_models``; None: store not listed), the lake's
    images or results, or the retirement record. ``state``: retired, scored (a result under the
    suite and reference in force), ingested, new (in the store only), not a model (a store folder
    the nightly skips: ``skipped_reason`` is its line, :func:`nightly_skip`) or unknown.
    ``folder_keys``: a store folder's object keys (the store's ``list_model_objects``), asked only
    of folders with no image ever ingested; None: no folder is checked."""
    from tasks.scores.suite import prompt_ids_by_suite

    lake = Lake(settings.lake_dir)
    images = lake.read("images")
    counts: dict[str, Counter] = defaultdict(Counter)
    for m, st in zip(images.column("model_id").to_pylist(), images.column("state").to_pylist()):
        counts[m][st] += 1
    results: dict[str, dict] = {}
    for r in lake.read("model_scores").to_pylist():
        if (r["suite_version"], r["reference_version"]) != (settings.suite_version, settings.reference_version):
            continue
        if r["model_id"] not in results or (r["scored_at"], r["run_id"]) > (results[r["model_id"]]["scored_at"], results[r["model_id"]]["run_id"]):
            results[r["model_id"]] = r
    retired = retired_models(lake)
    ids = set(counts) | set(results) | set(retired) | {m for m in store_models or [] if _valid(m)}
    suites = None
    rows = []
    for m in sorted(ids):
        c, res, ret = counts.get(m, Counter()), results.get(m), retired.get(m)
        skipped = None
        if folder_keys is not None and not ret and m in (store_models or ()) and not (c["ok"] or c["quarantined"]):
            suites = suites if suites is not None else prompt_ids_by_suite(settings.reference_dir)
            skipped = nightly_skip(lake, m, folder_keys(m), settings.suite_version, suites)
        state = ("retired" if ret else "not a model" if skipped else "scored" if res else "ingested" if c
                 else "new" if store_models is not None and m in store_models else "unknown")
        rows.append({
            "model_id": m,
            "state": state,
            "skipped_reason": skipped,
            "in_store": None if store_models is None else m in store_models,
            "images_ok": c["ok"], "images_quarantined": c["quarantined"], "images_missing": c["missing"],
            "scored": res is not None,
            "complete": is_complete(res) if res else None,
            "eps": res["eps"] if res else None,
            "capability": res["capability"] if res else None,
            "scored_at": res["scored_at"] if res else None,
            "retired": ret is not None,
            "retired_at": ret["at"] if ret else None,
            "retired_by": ret["actor"] if ret else None,
            "retired_reason": ret["reason"] if ret else None,
            "uncalibrated": bool(res["uncalibrated"]) if res else None,  # EPS from demo weights
        })
    return rows


def _valid(model_id: str) -> bool:
    try:
        validate_model_id(model_id)
    except ValueError:
        return False
    return True


# ---- quarantine ------------------------------------------------------------------------------


def quarantine_lines(settings: Settings, model_ids: Iterable[str], examples: int = 3) -> list[str]:
    """One line per (model, reason) of the models' current quarantine: count and a few objects
    with their detail (what a user needs to fix the upload)."""
    lake = Lake(settings.lake_dir)
    out = []
    for m in sorted(set(model_ids)):
        rows = lake.read("quarantine", [m]).to_pylist()
        by_reason: dict[str, list[dict]] = defaultdict(list)
        for r in sorted(rows, key=lambda r: r["object_uri"]):
            by_reason[r["reason"]].append(r)
        for reason, items in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = "; ".join(r["detail"] for r in items[:examples]) + ("; ..." if len(items) > examples else "")
            out.append(f"{m}: {len(items)} quarantined ({reason}): {shown}")
    return out


# ---- catalog ---------------------------------------------------------------------------------


def catalog_format(path: Path) -> str | None:
    """The catalog's format tag, or None when it is missing or unreadable."""
    import duckdb

    if not path.is_file():
        return None
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    try:
        return str(con.execute("SELECT format FROM catalog_info").fetchall()[0][0])
    except (duckdb.Error, IndexError):
        return None
    finally:
        con.close()


def ensure_catalog(settings: Settings) -> tuple[Path, bool]:
    """The catalog, built from the lake (and the pinned suite) when it is missing or of an older
    format: the suite's `prompts` and every view exist before anything is scored. Returns
    ``(path, rebuilt)``."""
    from tasks.lake.tables import CATALOG_FORMAT
    from tasks.runs.pinned import load_pinned_suite
    from tasks.runs.units_aggregate import refresh

    path = settings.catalog_path
    found = catalog_format(path)
    if found == CATALOG_FORMAT:
        return path, False
    try:
        refresh(settings, load_pinned_suite(settings))
    except OSError:
        if found is None:
            raise
        return path, False  # an older catalog on a workspace this user cannot write: still readable
    return path, True
