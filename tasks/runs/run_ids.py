"""Run ids and clocks shared by the units of work."""

from __future__ import annotations

import datetime as dt
import json
import uuid


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_run_id() -> str:
    return utcnow().strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]


def dump_json(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)
