"""What a study's pre-registration may publish, and whether the answers came after it.

- The order secret: each judge's image order is ``random.Random(sha256("<secret>:<label>"))``.
  Format /1 pre-registrations published that secret (an integer seed), so a guessed label
  regenerated a judge's order and matched it to the answers (issue 16, item 4). Since format /2
  the secret is 32 random bytes kept in ``studies/<id>/order-secret`` (0600, never exported or
  logged); the pre-registration publishes only its sha256 (a commitment: a lab can later prove
  which secret drew the orders, no one can recompute them before).
- ``public_preregistration``: the bytes a bundle may carry (a /1 file is re-written without its
  seed, naming the original's sha256).
- ``preregistration_status``: a plan only counts as pre-registered when it was written before
  every answer (issue 16, item 6).

Pure functions and small file helpers; no torch, Prefect or GX.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from schemas.study import PreRegistration
from tasks.store.durable import create_new

ORDER_SECRET_FILE = "order-secret"


def commitment(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_order_secret(study_dir: Path) -> str:
    """A new order secret written once (0600). An existing one (an open that crashed before its
    pre-registration was written) is reused."""
    path = Path(study_dir) / ORDER_SECRET_FILE
    secret = secrets.token_hex(32)
    if not create_new(path, secret + "\n"):
        return read_order_secret(study_dir)
    return secret


def read_order_secret(study_dir: Path) -> str:
    path = Path(study_dir) / ORDER_SECRET_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the study's order secret is missing (restore it from a backup)")
    secret = path.read_text().strip()
    if len(secret) < 32:
        raise ValueError(f"{path}: order secret shorter than 32 characters (corrupt?)")
    return secret


def order_key(prereg: PreRegistration, study_dir: Path) -> int | str:
    """What the per-judge orders are drawn from: the private secret (format /2, checked against
    its published commitment) or the published seed of a study opened before /2."""
    if prereg.order_commitment is not None:
        secret = read_order_secret(study_dir)
        if commitment(secret) != prereg.order_commitment:
            raise ValueError(f"{Path(study_dir) / ORDER_SECRET_FILE} does not match the pre-registered commitment "
                             f"{prereg.order_commitment[:12]}...: the orders cannot be trusted")
        return secret
    if prereg.order_seed is None:
        raise ValueError(f"study {prereg.study_id}: its pre-registration records no order source (a redacted copy?)")
    return prereg.order_seed


def public_preregistration(data: bytes) -> tuple[bytes, str | None]:
    """The pre-registration a bundle may publish, and a note when it had to be changed: a /2 file
    unchanged; a /1 file without its order seed, with the original's sha256."""
    prereg = PreRegistration.model_validate_json(data)
    if prereg.order_seed is None:
        return data, None
    original = hashlib.sha256(data).hexdigest()
    redacted = prereg.model_copy(update={"order_seed": None, "redacted_from_sha256": original})
    note = (f"preregistration.json is a copy of the original (sha256 {original}) without its order seed: the study was "
            "opened before imagebench kept that seed private, and with it a guessed label would regenerate a judge's order")
    return redacted.to_json_bytes(), note


def _utc(ts) -> datetime:
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.astimezone(timezone.utc)


@dataclass(frozen=True)
class PreregStatus:
    preregistered: bool
    note: str | None  # None when pre-registered; else why not, for every output of the study
    early_answers: int = 0


def plan_time(prereg: PreRegistration | None) -> datetime | None:
    """When the plan was pinned (``created_at``, aware UTC), or None when there is no plan to compare
    answers with (never opened)."""
    if prereg is None or prereg.created_at == "not pre-registered":
        return None
    return _utc(prereg.created_at)


NEVER_OPENED = "not pre-registered: the study was never opened, so its plan was not pinned before the answers"


def preregistration_status(prereg: PreRegistration | None, answer_times: list) -> PreregStatus:
    """Pre-registered only when the plan exists and was written before every answer was given
    (``answer_times``: each answer's shown_at, the earlier of its two times). Times at or after
    the plan's ``created_at`` count as after it: a bundle's times are floored to the minute, so a
    floored time at or after the plan proves the real one is too."""
    created = plan_time(prereg)
    if created is None:
        return PreregStatus(False, NEVER_OPENED)
    early = sum(1 for t in answer_times if t is not None and _utc(t) < created)
    if early:
        return PreregStatus(False, f"not pre-registered: {early} of {len(answer_times)} answers predate the "
                                   f"pre-registration ({prereg.created_at}), so the plan was written after data existed", early)
    return PreregStatus(True, None)


def status_of(prereg: PreRegistration | None, answers) -> PreregStatus:
    """``preregistration_status`` of an answers table (STUDY_ANSWERS or a bundle's answers)."""
    times = answers.column("shown_at").to_pylist() if answers is not None and answers.num_rows else []
    return preregistration_status(prereg, times)


# ---- deviations from the pre-registration (issue 27 item 5) ------------------------------------
# The plan says the results are looked at after the close. A lab that looks before (the admin
# page's "look anyway", `study peek`) gives a reason; the panel store records it with the time and
# the number of answers then (tasks/beauty/store.py, insert-only), and the bundle publishes every
# such record beside the pre-registration it deviates from: deviations.json and the datasheet.

PEEK = "results viewed before the close"
REASON_MIN, REASON_MAX = 20, 1000
DEVIATIONS_FILE = "deviations.json"
DEVIATIONS_FORMAT = "imagebench-deviations/1"


def reason_problem(reason: str) -> str | None:
    """Why ``reason`` cannot be recorded (None: it can): it is published with the study, so it says
    something (at least REASON_MIN characters), is not a page long, and is plain text."""
    from schemas.study import text_problem

    text = reason.strip()
    if len(text) < REASON_MIN:
        return f"give a reason of at least {REASON_MIN} characters: it is published with the study as a deviation"
    if len(text) > REASON_MAX:
        return f"the reason is {len(text)} characters; at most {REASON_MAX}"
    return text_problem(text)


def deviation_sentence(d: dict) -> str:
    """One deviation as a sentence (the admin page, `study status`, the datasheet)."""
    at = d["at"].astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{at}: {d['kind']} ({d['by']}, {d['answers']} answers recorded then); reason: {d['reason']}"


def deviations_document(deviations: list[dict], preregistration_sha256: str | None) -> bytes:
    """The bundle's deviations.json: every recorded deviation of the study, oldest first."""
    import json

    doc = {"format": DEVIATIONS_FORMAT, "preregistration_sha256": preregistration_sha256,
           "deviations": [{"at": d["at"].astimezone(timezone.utc).isoformat(), "kind": d["kind"], "reason": d["reason"],
                           "answers_recorded": d["answers"], "by": d["by"]} for d in deviations]}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def parse_deviations(data: bytes, where: str, preregistration_sha256: str | None) -> list[dict]:
    """A bundle's deviations.json (what :func:`deviations_document` wrote) back as deviations, as
    the panel store gives them (at, kind, reason, answers, by), so that a study imported from the
    bundle publishes them again. ``ValueError`` naming ``where`` and the first fault: not that
    format, a record of another pre-registration (``preregistration_sha256`` given: the bundle's),
    or a deviation whose fields are missing or unpublishable."""
    import json

    from schemas.study import text_problem

    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != DEVIATIONS_FORMAT or not isinstance(doc.get("deviations"), list):
        raise ValueError(f"{where}: not a deviations record (format {DEVIATIONS_FORMAT} with a list of deviations)")
    if preregistration_sha256 is not None and doc.get("preregistration_sha256") != preregistration_sha256:
        raise ValueError(f"{where}: of another pre-registration (sha256 {str(doc.get('preregistration_sha256'))[:64]}, "
                         f"the bundle's is {preregistration_sha256})")
    out = []
    for n, d in enumerate(doc["deviations"], 1):
        fields = ("at", "kind", "reason", "by")
        ok = isinstance(d, dict) and all(isinstance(d.get(k), str) and 0 < len(d[k]) <= REASON_MAX for k in fields) \
            and type(d.get("answers_recorded")) is int and d["answers_recorded"] >= 0
        try:
            at = datetime.fromisoformat(d["at"]) if ok else None
        except ValueError:
            at = None
        problem = next((p for p in (text_problem(d[k]) for k in fields[1:]) if p), None) if ok else None
        if at is None or at.tzinfo is None or problem:
            raise ValueError(f"{where}: deviation {n} is not a deviation (at with a UTC offset, kind, reason, "
                             f"answers_recorded, by){': ' + problem if problem else ''}")
        out.append({"at": at.astimezone(timezone.utc), "kind": d["kind"], "reason": d["reason"],
                    "answers": d["answers_recorded"], "by": d["by"]})
    return sorted(out, key=lambda d: d["at"])
