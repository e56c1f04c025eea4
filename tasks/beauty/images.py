"""Where a study's tools' images are in the object store (issue 26 item 2).

The Beauty Index has its own place, beside the ImageBench models and never among them::

    beauty/<suite_version>/<tool>/<prompt_id>.<png|jpg|jpeg|webp>     (tasks.store.storage.beauty_root)

``models/`` is the nightly's: every folder there is scored as an ImageBench model, so a study's
tools put there broke it. A tool with nothing in its place whose ``models/<tool>/`` holds images for
this suite's prompts (the layout the README gave before) is still read from there, and ``study
open`` says so with where to move them: a study defined before the change opens as it would have.
The place matters only at ``open``: an opened study reads its blinded copies from its own folder
(the panel, the pixel metrics) and never the tools' images again, so studies opened from
``models/`` keep working whatever is moved. No image is shared with an ImageBench model of the
same name: the two suites have no prompt in common, so each has its own images.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tasks.scores.suite import Suite


@dataclass(frozen=True)
class ToolImages:
    tool: str
    root: str  # the folder the tool's folder is in: beauty/<suite>/, or models/ (the old place)
    rows: list[dict]  # schemas.lake.IMAGES rows, one per prompt of the suite (ok / quarantined / missing)

    @property
    def key_prefix(self) -> str:
        return f"{self.root}{self.tool}/"


def tool_root(store, tool: str, suite: Suite) -> str:
    """The folder holding ``tool``'s folder: the suite's Beauty place when the tool has any object
    there, else ``models/`` when ``models/<tool>/`` holds an image named for a prompt of this suite
    (the old place), else the Beauty place (where its images are missing)."""
    from tasks.store.storage import MODELS_PREFIX, beauty_root, prompt_id_of_key

    place = beauty_root(suite.version)
    if store.list_model_objects(tool, place):
        return place
    if any(prompt_id_of_key(o.key) in suite.by_id for o in store.list_model_objects(tool)):
        return MODELS_PREFIX
    return place


def ingest_tools(settings, suite: Suite, tools: list[str], now: datetime) -> dict[str, ToolImages]:
    """Every tool's images, from its place, through the usual ingest validation (images cached
    under ``$IMAGEBENCH_HOME/images``; nothing else written)."""
    from tasks.runs.units_ingest import open_configured_store
    from tasks.scores.suite import other_suite_prompt_ids
    from tasks.store.ingest import ingest_model

    store = open_configured_store(settings)
    others = other_suite_prompt_ids(settings.reference_dir, suite.version)
    out = {}
    for tool in tools:
        root = tool_root(store, tool, suite)
        result = ingest_model(store, tool, suite, Path(settings.home), now=now, other_suites=others, root=root)
        out[tool] = ToolImages(tool, root, result.images.to_pylist())
    return out


def place_lines(settings, suite_version: str, placed: dict[str, ToolImages]) -> list[str]:
    """What ``study open`` says about where it read the images: the Beauty place in one line, and
    one line per tool read from the old place, with where its images belong."""
    from tasks.runs.units_ingest import open_configured_store
    from tasks.store.storage import MODELS_PREFIX, beauty_root

    base, place = open_configured_store(settings).uri.rstrip("/"), beauty_root(suite_version)
    new = sorted(t for t, p in placed.items() if p.root != MODELS_PREFIX)
    lines = [f"images of {', '.join(new)}: {base}/{place}<tool>/"] if new else []
    for tool in sorted(set(placed) - set(new)):
        lines.append(f"images of {tool}: {base}/{MODELS_PREFIX}{tool}/, the old place; move them to {base}/{place}{tool}/ "
                     f"(docs/STORAGE.md: under {MODELS_PREFIX} the nightly skips them, not being a model)")
    return lines


def list_tools(settings, suite: Suite) -> tuple[str, list[str]]:
    """(where, tools): ``study init``'s default tools. Those in the store's Beauty place of the
    suite; when it has none, the folders of ``models/`` holding an image named for a prompt of
    the suite (the old place, read by :func:`tool_root` too), never every model of the store."""
    from tasks.runs.units_ingest import open_configured_store
    from tasks.store.storage import beauty_root, is_model_id, prompt_id_of_key

    store, place = open_configured_store(settings), beauty_root(suite.version)
    tools = store.list_models(place)
    if tools:
        return f"{store.uri.rstrip('/')}/{place}", tools
    old = [m for m in store.list_models() if is_model_id(m)
           and any(prompt_id_of_key(o.key) in suite.by_id for o in store.list_model_objects(m))]
    return f"{store.uri.rstrip('/')}/{place}", old
