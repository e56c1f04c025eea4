"""Contracts of the protocol-free panel shell (tasks/panel/), shared by every protocol that runs a
panel (the Beauty Index, VAB's expert panel). No I/O here (ARCHITECTURE.md section 2)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PANEL_STORE_RECORD_FILE = "panel-store.json"  # in the study's folder (Beauty and VAB), create-once


class PanelStoreRecord(BaseModel):
    """Which panel database a study lives in, written once by ``open`` (``panel-store.json`` in
    the study's folder, never exported). ``store_id`` is the random id that database received when
    it was created (its ``panel_store`` table); ``url`` is where it was, without any password, for
    messages only: a database moved to another host or path keeps its id and is still the study's."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str
    store_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    recorded_at: str
