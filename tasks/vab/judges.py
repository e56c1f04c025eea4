"""Judges under test on VAB tasks (issue 10 item 2): VLMs asked for the best and worst image of a
set, and scalar per-image scorers ranked by argmax / argmin.

Each judge sees one *trial*: the task's images in a shown order (tasks.vab.trials) and answers with
positions in that shown order (1-based). Mapping back to stored positions is the caller's.

- :class:`VlmSetJudge` goes through the existing judge backends (tasks/judges/): the configured
  endpoint, its key handling and redaction, its concurrency slot, image checks (sha256, side limit)
  and its typed errors. The question and the reading of the answer follow the prompt version
  (tasks.vab.prompts: ours, or the official toolkit's three prompt types); an unparsable answer is
  asked again (``unparsable_retries``), then recorded with state ``unparsable`` and the raw text's
  end in ``detail``: counted wrong, never dropped. The official prompt on an OpenAI-compatible
  endpoint goes out as eval.py sends it (tasks.vab.official_request: images, parameters, retries).
  Every answer's full text is kept (``response``).
- :class:`ScalarSetJudge` wraps any :class:`ImageScorer` (one score per image, higher = better):
  best = argmax, worst = argmin; a tie at the top or bottom is state ``tie`` (a failure, reported).
  Scorers here: :class:`SharpnessScorer` (variance of the Laplacian, dependency-free) and
  :class:`HPSv3ImageScorer` (imagebench's HPSv3 through tasks.hpsv3.scorer).
- :class:`AnswerCache` stores every settled answer under a key made of the judge's identity, the
  task and trial, the question asked and the images' sha256 in shown order: a rerun with the same
  judge sends nothing, and two trials are two answers even when shown in the same order.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.vab import PROMPT_COMBINED, TRIAL_SCHEME_OFFICIAL
from tasks.vab.prompts import (OFFICIAL_ATTEMPTS, OFFICIAL_PROMPT_VERSION, OFFICIAL_TEMPERATURE, PROMPT_VERSIONS,  # noqa: F401
                               VAB_PROMPT_VERSION, message_parts, parse_answer, parse_best_worst, prompt_sha256, question_for)

STATE_OK, STATE_UNPARSABLE, STATE_ERROR, STATE_TIE = "ok", "unparsable", "error", "tie"


# --- one trial -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialItem:
    """What a judge is shown in one trial: images in the shown order (paths and sha256)."""

    task_id: str
    trial: int
    order: tuple[int, ...]  # stored positions as shown (1-based)
    image_paths: tuple[str, ...]  # in the shown order
    image_sha256: tuple[str, ...]  # in the shown order
    domain: str = "photography"
    prompt_type: str = PROMPT_COMBINED  # schemas.vab.PROMPT_TYPES
    scheme: str = TRIAL_SCHEME_OFFICIAL  # the collection's trial scheme (part of the cache key)

    @property
    def n(self) -> int:
        return len(self.image_paths)


@dataclass(frozen=True)
class TrialAnswer:
    """A judge's answer in the shown order; None = no valid answer (see ``state``)."""

    best_shown: int | None
    worst_shown: int | None
    state: str  # ok | unparsable | error | tie
    detail: str | None = None
    response: str | None = None  # a VLM's full answer (the last one read), as eval.py keeps model_response


# --- cache ---------------------------------------------------------------------------------------
class AnswerCache:
    """Settled answers (ok, unparsable after retries, tie) on disk, one JSON file per key under
    ``root``; written atomically (temp file + rename) so parallel trials never see half a file."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.root = Path(root) if root is not None else None

    @staticmethod
    def key(identity: str, item: TrialItem) -> str:
        # One answer per trial: two trials shown in the same order (a 2-image task always has two)
        # are two samples, as in eval.py, never one answer read twice (issue 25 item 4). Answers
        # cached before the trial was in the key are not reused.
        parts: list = ["trial-v3", identity, item.task_id, item.trial, item.n, item.domain, list(item.image_sha256),
                       item.scheme, item.prompt_type]
        blob = json.dumps(parts, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> TrialAnswer | None:
        if self.root is None:
            return None
        try:
            return TrialAnswer(**json.loads(self._path(key).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, key: str, answer: TrialAnswer) -> None:
        if self.root is None or answer.state == STATE_ERROR:  # errors are not settled: retried next run
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(answer)}.tmp")
        tmp.write_text(json.dumps(asdict(answer)))
        tmp.replace(path)


# --- judges --------------------------------------------------------------------------------------
class SetJudge(Protocol):
    name: str
    kind: str  # "vlm" | "scalar"

    def identity(self) -> str:
        """Canonical JSON of what the answers depend on (model, endpoint, prompt, sampling / scorer)."""

    def judge(self, items: Sequence[TrialItem]) -> list[TrialAnswer]:
        """One answer per item, in order; never raises for one item's failure."""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class VlmSetJudge:
    """A configured judge endpoint (tasks/judges backends) asked for best/worst of a set."""

    kind = "vlm"

    def __init__(self, name: str, endpoint: Any, *, unparsable_retries: int | None = None, max_attempts: int | None = None,
                 prompt_version: str = VAB_PROMPT_VERSION, temperature: float | None = None, limits: Any = None) -> None:
        from tasks.judges.registry import create_judge

        if endpoint.backend not in ("openai", "transformers"):
            raise ValueError(f"judge '{name}': backend {endpoint.backend!r} cannot rank image sets (use an openai or transformers VLM)")
        if prompt_version not in PROMPT_VERSIONS:
            raise ValueError(f"unknown VAB prompt version {prompt_version!r}; versions: {', '.join(PROMPT_VERSIONS)}")
        self.name = name
        self.endpoint = endpoint
        self.backend = create_judge(name, endpoint)
        self.backend.bind_limits(limits)  # the endpoint's limits hold across batches (tasks/judges/limits.py)
        self.prompt_version = prompt_version
        official = prompt_version == OFFICIAL_PROMPT_VERSION
        # ours is greedy; the official prompt is sampled at eval.py's temperature unless told otherwise
        self.temperature = (OFFICIAL_TEMPERATURE if official else 0.0) if temperature is None else float(temperature)
        if unparsable_retries is None:
            unparsable_retries = OFFICIAL_ATTEMPTS - 1 if official else 1
        self.unparsable_retries = unparsable_retries
        self.max_attempts = max_attempts if max_attempts is not None else 1 + endpoint.max_retries
        self._down: str | None = None  # set when the judge itself is absent or misconfigured (as the router does)

    def sampling(self) -> dict[str, Any]:
        """What the answers were sampled with (a local transformers model decodes greedily); the
        official prompt's are eval.py's (tasks.vab.official_request.request_params)."""
        if self.endpoint.backend == "openai" and self.prompt_version == OFFICIAL_PROMPT_VERSION:
            from tasks.vab.official_request import request_params

            return request_params(self.endpoint.model, self.temperature)
        if self.endpoint.backend == "openai":
            return {**self.backend.sampling(), "temperature": self.temperature}
        return self.backend.sampling()

    def identity(self) -> str:
        return _canonical({
            "kind": "vlm", "judge": self.name, "model": self.endpoint.model, "backend": self.endpoint.backend,
            "endpoint": self.backend.endpoint_label, "prompt": self.prompt_version,
            "prompt_sha256": prompt_sha256(self.prompt_version), "sampling": self.sampling(),
        })

    # one request -------------------------------------------------------------------------------
    async def _ask_openai(self, item: TrialItem, parts: list) -> str:
        from tasks.judges.base import JudgeUnavailable, read_image
        from tasks.judges.openai_compat import redact

        j = self.backend
        reason = j.unavailable_reason()
        if reason:
            raise JudgeUnavailable(reason, retryable=False, judge_down=True)
        j._ensure_client()
        async with j.slot():  # the endpoint's in-flight slot, for the whole run: images are read inside it
            if self._down is not None:  # went down while this trial waited for the slot
                raise JudgeUnavailable(self._down, retryable=False)
            content: list[dict[str, Any]] = []
            for part in parts:
                if isinstance(part, str):
                    content.append({"type": "text", "text": part})
                    continue
                path, sha = item.image_paths[part], item.image_sha256[part]
                img = await asyncio.to_thread(read_image, Path(path), sha, self.name, self.endpoint.max_image_side)
                url = f"data:{img.mime};base64,{base64.b64encode(img.data).decode('ascii')}"
                content.append({"type": "image_url", "image_url": {"url": url}})
            payload = {
                "model": self.endpoint.model, "messages": [{"role": "user", "content": content}],
                "temperature": self.temperature, "max_tokens": self.endpoint.max_tokens, "seed": j.sampling().get("seed"),
            }
            resp, _latency = await j._send("/chat/completions", payload)
        j._check_status(resp)
        data, answer = j._read_completion(resp)
        j._check_model(data.get("model"))
        return redact(answer) or ""

    async def _ask_transformers(self, item: TrialItem, parts: list) -> str:
        from tasks.vab.local_vlm import ask_local_set

        return await asyncio.to_thread(ask_local_set, self.backend, item, parts)

    async def _ask_with_retries(self, item: TrialItem, parts: list) -> str:
        from tasks.judges.base import JudgeError, JudgeUnavailable

        ask = self._ask_openai if self.endpoint.backend == "openai" else self._ask_transformers
        for attempt in range(1, self.max_attempts + 1):
            if self._down is not None:  # no more requests to a judge that is down: every trial says why
                raise JudgeUnavailable(self._down, retryable=False)
            try:
                return await ask(item, parts)
            except JudgeError as exc:
                if getattr(exc, "judge_down", False):
                    self._down = str(exc)
                if not exc.retryable or attempt == self.max_attempts:
                    raise
                wait = getattr(exc, "retry_after_s", None) if isinstance(exc, JudgeUnavailable) else None
                await asyncio.sleep(min(30.0, wait if wait is not None else 0.5 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    async def ajudge_one(self, item: TrialItem) -> TrialAnswer:
        from tasks.judges.base import JudgeError

        parts = message_parts(self.prompt_version, item.prompt_type, item.n, item.domain)
        if self.prompt_version == OFFICIAL_PROMPT_VERSION and self.endpoint.backend == "openai":
            from tasks.vab import official_request  # eval.py's requests, retries and reading

            got = await official_request.ask(self, item, parts, self.temperature,
                                             lambda text: parse_answer(self.prompt_version, item.prompt_type, text, item.n))
            return TrialAnswer(*got)
        why = ""
        raw = ""
        for _ in range(1 + self.unparsable_retries):
            try:
                raw = await self._ask_with_retries(item, parts)
            except JudgeError as exc:
                return TrialAnswer(None, None, STATE_ERROR, f"{type(exc).__name__}: {exc}", raw or None)
            best, worst, why = parse_answer(self.prompt_version, item.prompt_type, raw, item.n)
            if why is None:
                return TrialAnswer(best, worst, STATE_OK, None, raw)
        return TrialAnswer(None, None, STATE_UNPARSABLE, f"{why}; answer ended: {raw.strip()[-200:]!r}", raw)

    def judge(self, items: Sequence[TrialItem]) -> list[TrialAnswer]:
        async def run() -> list[TrialAnswer]:
            try:
                return list(await asyncio.gather(*(self.ajudge_one(it) for it in items)))
            finally:
                await self.backend.aclose()

        return asyncio.run(run())


class ImageScorer(Protocol):
    """Any per-image scorer: one float per image path, higher = better."""

    scorer_id: str

    def identity(self) -> dict[str, Any]: ...

    def score_paths(self, paths: Sequence[str]) -> list[float]: ...


class SharpnessScorer:
    """Variance of the Laplacian of the grey image (resized to 256 px on the longer side): a classic
    focus measure. Blur lowers it; it knows nothing of aesthetics, which is the point of the demo
    sets (a known ordering a simple scorer must recover through the whole flow)."""

    scorer_id = "sharpness"
    SIDE = 256

    def identity(self) -> dict[str, Any]:
        return {"scorer": self.scorer_id, "measure": "var(laplacian(grey))", "side": self.SIDE, "version": 1}

    def score_paths(self, paths: Sequence[str]) -> list[float]:
        import numpy as np
        from PIL import Image

        out = []
        for p in paths:
            with Image.open(p) as im:
                g = im.convert("L")
                g.thumbnail((self.SIDE, self.SIDE))
                a = np.asarray(g, dtype=np.float64)
            lap = a[1:-1, :-2] + a[1:-1, 2:] + a[:-2, 1:-1] + a[2:, 1:-1] - 4 * a[1:-1, 1:-1]
            out.append(round(float(lap.var()), 6))  # rounded: equal images tie exactly, float noise does not decide
        return out


class HPSv3ImageScorer:
    """imagebench's HPSv3 (tasks.hpsv3.scorer), prompted with the task's domain (VAB has no prompt)."""

    scorer_id = "hpsv3"

    def __init__(self, base_model: str, checkpoint: str, *, uncalibrated: bool = False, prompt: str = "a beautiful image") -> None:
        self.base_model, self.checkpoint, self.uncalibrated, self.prompt = base_model, checkpoint, uncalibrated, prompt
        self._scorer: Any = None

    def identity(self) -> dict[str, Any]:
        from tasks.hpsv3.scorer import resolve_identity

        ident = resolve_identity(self.base_model, self.checkpoint, self.uncalibrated)
        return {"scorer": "hpsv3", "identity": ident.model_dump(mode="json"), "prompt": self.prompt}

    def score_paths(self, paths: Sequence[str]) -> list[float]:
        if self._scorer is None:
            self._scorer = _loaded_hpsv3(self.base_model, self.checkpoint, self.uncalibrated)
        out = self._scorer.score([str(p) for p in paths], [self.prompt] * len(paths))  # [N, 2]: mu, sigma
        return [round(float(mu), 6) for mu in out[:, 0]]


@functools.lru_cache(maxsize=1)
def _loaded_hpsv3(base_model: str, checkpoint: str, uncalibrated: bool) -> Any:
    """One loaded HPSv3 per process: every VAB run of a process (the demo runs two) reuses it."""
    from tasks.hpsv3.scorer import HPSv3Scorer

    return HPSv3Scorer.load(base_model, checkpoint, uncalibrated=uncalibrated)


def rank_scores(scores: Sequence[float], want_worst: bool) -> TrialAnswer:
    """best = argmax, worst = argmin (1-based, shown order); a tie for either is a failure."""
    top, bottom = max(scores), min(scores)
    tops = [i + 1 for i, s in enumerate(scores) if s == top]
    bottoms = [i + 1 for i, s in enumerate(scores) if s == bottom]
    detail = "scores " + " ".join(f"{s:g}" for s in scores)
    if len(tops) > 1 or (want_worst and len(bottoms) > 1):
        which = "best" if len(tops) > 1 else "worst"
        return TrialAnswer(None, None, STATE_TIE, f"tie for {which} at positions {tops if len(tops) > 1 else bottoms}; {detail}")
    return TrialAnswer(tops[0], bottoms[0] if want_worst else None, STATE_OK, detail)


class ScalarSetJudge:
    kind = "scalar"

    def __init__(self, scorer: ImageScorer, name: str | None = None) -> None:
        self.scorer = scorer
        self.name = name or scorer.scorer_id

    def identity(self) -> str:
        return _canonical({"kind": "scalar", "judge": self.name, **self.scorer.identity()})

    def judge(self, items: Sequence[TrialItem]) -> list[TrialAnswer]:
        # Same input check as the VLM judges: an image must be the one hashed at import.
        bad: dict[str, str] = {}
        for it in items:
            for p, sha in zip(it.image_paths, it.image_sha256, strict=True):
                if sha and p not in bad and _file_sha256(p) != sha:
                    bad[p] = f"image {p} does not have the recorded sha256 {sha[:12]}...: it changed since import"
        # Each distinct image is scored once; trials only reorder them.
        paths = sorted({p for it in items for p in it.image_paths} - set(bad))
        try:
            scores = dict(zip(paths, self.scorer.score_paths(paths), strict=True)) if paths else {}
        except Exception as exc:  # noqa: BLE001 - recorded per trial, the run goes on
            return [TrialAnswer(None, None, STATE_ERROR, f"{type(exc).__name__}: {exc}") for _ in items]
        out = []
        for it in items:
            why = next((bad[p] for p in it.image_paths if p in bad), None)
            out.append(TrialAnswer(None, None, STATE_ERROR, why) if why else rank_scores([scores[p] for p in it.image_paths], it.n >= 3))
        return out


@functools.lru_cache(maxsize=4096)
def _file_sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _file_sha256(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _file_sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def judge_with_cache(judge: SetJudge, items: Sequence[TrialItem], cache: AnswerCache) -> tuple[list[TrialAnswer], int]:
    """Answers for ``items`` (cached ones read, the rest asked and stored); returns (answers, cache hits)."""
    ident = judge.identity()
    keys = [AnswerCache.key(ident, it) for it in items]
    answers: list[TrialAnswer | None] = [cache.get(k) for k in keys]
    todo = [i for i, a in enumerate(answers) if a is None]
    if todo:
        for i, a in zip(todo, judge.judge([items[i] for i in todo]), strict=True):
            answers[i] = a
            cache.put(keys[i], a)
    return [a for a in answers if a is not None], len(items) - len(todo)
