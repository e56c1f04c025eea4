"""The VAB protocols of the panel app: (a) pick the best and (3+ images) the worst of a set with the
domain's rubric shown; (b) score each image of a set 0-10 with one decimal.

Every expert does the ``rank`` block (all tasks) then the ``score`` block (all tasks), each block
in its own task order and each item in its own candidate order: ``random.Random(sha256(
"<seed>:<label>:<block>[:<task>]"))`` of the study's recorded seed, so every expert's queue is
reproducible and different. Ranking first: the direct choice is not anchored by the expert's own
earlier numbers (the scores-vs-ranking study compares the two).

Built on the panel shell like the Beauty Index app (tasks/panel/app.py: pages, CSP, redacted log,
cookies from one-time links, blinded images under opaque ids, the answer's form); reference labels
and task ids never reach a page. A VAB study lives in ``$IMAGEBENCH_HOME/vab_studies/<id>/`` (images/, panel.sqlite).
"""

from __future__ import annotations

import hashlib
import html
import random
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from schemas.vab import RUBRIC_AVOID, RUBRICS, SET_NAME_RE, VabTask
from tasks.panel.answer_js import SEND_ANSWER_JS
from tasks.panel.app import COOKIE, CSS, PANEL_ENDED, PanelShell, _message, _page, refusal
from tasks.panel.blind import BLIND_EXTENSION, blind_image, opaque_id
from tasks.panel.store import PanelError, StudyClosed, sha256_hex
from tasks.vab.store import PROTOCOLS, VabPanelStore

# The experts' rubric per domain: schemas.vab.RUBRICS (the paper's criteria; our VLM prompt uses the same).
RUBRIC_COMMON_AVOID = RUBRIC_AVOID

VAB_CSS = CSS + """
.grid{display:flex;flex-wrap:wrap;gap:1rem;justify-content:center}.cand{background:#fff;padding:.5rem;border-radius:6px;text-align:center}
.cand img{display:block;max-width:320px;max-height:320px;background:#888}.rubric{background:#fff;padding:.5rem 1rem;border-left:4px solid #3a7}
.cand label{margin:0 .5rem}form#answer-form{display:block}#submit{font-size:1.2rem;padding:.5rem 2rem;margin:1rem auto;display:block}
button.zoom{all:unset;cursor:zoom-in;display:block}button.zoom:focus-visible{outline:3px solid #3a7;outline-offset:2px}
#viewer{position:fixed;inset:0;z-index:10;background:#111;display:flex;flex-direction:column;align-items:center;justify-content:center;cursor:zoom-out}
#viewer[hidden]{display:none}#viewer img{display:block;max-width:100vw;max-height:calc(100vh - 2.5rem);width:auto;height:auto}
#viewer p{color:#ddd;margin:.4rem;font-size:.95rem}body.viewing{overflow:hidden}"""

# One answer per page; kept until the server has it and sent again by itself after a 503, 502, 504
# or a lost connection, as the Beauty Index page does (the panel shell's sender, tasks/panel/answer_js.py).
VAB_JS = SEND_ANSWER_JS + """(function(){
var form=document.getElementById('answer-form'); if(!form) return; var sent=false, msg=document.getElementById('check');
form.addEventListener('submit',function(e){
  e.preventDefault(); if(sent) return;
  var b=form.querySelector('input[name=best]:checked'), w=form.querySelector('input[name=worst]:checked');
  if(b&&w&&b.value===w.value){ msg.textContent='The best and the worst must be different images.'; return; }
  sent=true; msg.textContent=''; document.getElementById('submit').disabled=true;
  panelSendAnswer(form,new URLSearchParams(new FormData(form)).toString(),'/expert'); });
})();
(function(){
// One image at full size (click it, or press its number), then back (Esc, Enter, click); arrows for the others.
var viewer=document.getElementById('viewer'); if(!viewer) return;
var big=document.getElementById('viewer-img'), cap=document.getElementById('viewer-caption');
var zooms=Array.prototype.slice.call(document.querySelectorAll('button.zoom')), current=-1;
function show(i){ current=i; big.src=zooms[i].querySelector('img').src; big.alt='image '+(i+1)+' full screen';
  cap.textContent='Image '+(i+1)+' of '+zooms.length+'. Esc, Enter or click: back; arrow keys: the other images.';
  viewer.hidden=false; document.body.classList.add('viewing'); viewer.focus(); }
function hide(){ var was=current; current=-1; viewer.hidden=true; big.removeAttribute('src');
  document.body.classList.remove('viewing'); if(zooms[was]) zooms[was].focus(); }
zooms.forEach(function(z,i){ z.addEventListener('click',function(){ show(i); }); });
viewer.addEventListener('click',hide);
document.addEventListener('keydown',function(e){
  if(e.altKey||e.ctrlKey||e.metaKey) return;
  if(current>=0){
    if(e.key==='Escape'||e.key==='Enter'||e.key===' '){ e.preventDefault(); hide(); }
    else if(e.key==='ArrowRight'){ e.preventDefault(); show((current+1)%zooms.length); }
    else if(e.key==='ArrowLeft'){ e.preventDefault(); show((current+zooms.length-1)%zooms.length); }
    return; }
  var t=e.target; if(t&&((t.tagName==='INPUT'&&t.type!=='radio')||t.tagName==='TEXTAREA')) return;  // typing a score
  var k=parseInt(e.key,10); if(k>=1&&k<=zooms.length&&String(k)===e.key){ e.preventDefault(); show(k-1); }
});
})();"""


_LABEL_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def study_dir(settings, study_id: str) -> Path:
    if not isinstance(study_id, str) or not SET_NAME_RE.fullmatch(study_id):
        raise PanelError(f"invalid VAB study id {study_id!r}: must match {SET_NAME_RE.pattern}")
    return Path(settings.home) / "vab_studies" / study_id


def open_store(settings, study_id: str, *, create: bool = False, missing_ok: bool = False) -> VabPanelStore | None:
    """The study's panel store, checked against the database it was opened in (tasks/panel/db.py).
    ``missing_ok``: None when there is none (nothing created); ``create`` only for ``open``."""
    d, db = study_dir(settings, study_id), getattr(settings, "panel_database", None)
    if missing_ok:
        return VabPanelStore.find(d, study_id, db, create=create)
    return VabPanelStore.open(d, study_id, database=db, create=create)


def _rng(seed: int, *parts: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()[:8], "big"))


def expert_queue(seed: int, label: str, tasks: Sequence[tuple[str, int]], protocols: Sequence[str] = PROTOCOLS) -> list[dict]:
    """An expert's items: per protocol block, the tasks shuffled, each task's candidates shuffled."""
    items = []
    for block in protocols:
        order = sorted(tasks)
        _rng(seed, label, block).shuffle(order)
        for task_id, n in order:
            shown = list(range(1, n + 1))
            _rng(seed, label, block, task_id).shuffle(shown)
            items.append({"protocol": block, "task_id": task_id, "shown_order": shown})
    return items


@dataclass
class OpenedVab:
    study_id: str
    admin_token: str
    tokens: dict[str, str]
    study_dir: Path


def open_vab_study(settings, study_id: str, sets: str, tasks: Sequence[VabTask], experts: Sequence[str],
                   read_image: Callable[[VabTask, int], bytes], protocols: Sequence[str] = PROTOCOLS,
                   seed: int | None = None) -> OpenedVab:
    """Blind every image, draw every expert's queue, create the study (all or nothing).
    ``read_image(task, i)`` gives the bytes of the task's i-th stored image (0-based)."""
    d = study_dir(settings, study_id)
    if not tasks:
        raise PanelError(f"VAB study {study_id}: no tasks")
    if len(set(experts)) != len(experts) or not experts or any(not _LABEL_RE.fullmatch(e) for e in experts):
        raise PanelError(f"VAB study {study_id}: expert labels must be distinct words, got {list(experts)}")
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not protocols:
        raise PanelError(f"VAB study {study_id}: protocols must be among {PROTOCOLS}, got {list(protocols)}")
    ids = [t.task_id for t in tasks]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise PanelError(f"VAB study {study_id}: task id used twice: {dup[0]}")
    found = open_store(settings, study_id, missing_ok=True)  # another database than the study's: refused here
    if found is not None:
        try:
            if found.exists():
                raise PanelError(f"VAB study {study_id} is already open")
        finally:
            found.dispose()
    store = open_store(settings, study_id, create=True)
    try:
        store.record_in(d)  # the study's database, recorded before anything of it is written
        (d / "images").mkdir(parents=True, exist_ok=True)
        image_rows = []
        for t in tasks:
            for i in range(len(t.images)):
                try:
                    data = read_image(t, i)
                    blinded = blind_image(data)
                except Exception as exc:  # noqa: BLE001 - named and re-raised; nothing of this open is kept
                    for r in image_rows:
                        (d / "images" / f"{r['image_id']}.{BLIND_EXTENSION}").unlink(missing_ok=True)
                    raise PanelError(f"task {t.task_id!r}: image {i + 1} ({t.images[i]}) cannot be shown: {exc}") from exc
                iid = opaque_id()
                (d / "images" / f"{iid}.{BLIND_EXTENSION}").write_bytes(blinded.data)
                image_rows.append({"image_id": iid, "task_id": t.task_id, "stored_position": i + 1,
                                   "source_sha256": hashlib.sha256(data).hexdigest()})
        seed = secrets.randbits(62) if seed is None else int(seed)
        tokens = {e: secrets.token_urlsafe(32) for e in experts}
        admin = secrets.token_urlsafe(32)
        shape = [(t.task_id, len(t.images)) for t in tasks]
        store.create_study(sets=sets, order_seed=seed, admin_token_sha256=sha256_hex(admin), opened_at=datetime.now(UTC),
                           task_rows=[{"task_id": t.task_id, "domain": t.domain, "n_images": len(t.images)} for t in tasks],
                           image_rows=image_rows,
                           expert_rows=[{"label": e, "token_sha256": sha256_hex(tok)} for e, tok in tokens.items()],
                           queues={e: expert_queue(seed, e, shape, protocols) for e in experts})
    finally:
        store.dispose()
    return OpenedVab(study_id, admin, tokens, d)


def parse_score(text: str | None, slot: int) -> float:
    """A 0-10 score with at most one decimal (``7``, ``7.5``; a comma is accepted as the decimal mark)."""
    t = (text or "").strip().replace(",", ".")
    try:
        x = float(t)
    except ValueError:
        raise PanelError(f"image {slot}: score {text!r} is not a number") from None
    if not 0 <= x <= 10 or ("." in t and len(t.split(".")[1]) > 1):
        raise PanelError(f"image {slot}: score {text!r} must be between 0 and 10 with at most one decimal")
    return round(x, 1)


def _rubric(domain: str) -> str:
    items = "".join(f"<li>{html.escape(c)}</li>" for c in RUBRICS.get(domain, RUBRICS["fine_art"]))
    return (f'<div class="rubric" id="rubric"><b>Judge by:</b><ul>{items}</ul>'
            f'<p>{html.escape(RUBRIC_COMMON_AVOID)}</p></div>')


def _refused(title: str, exc: PanelError) -> Response:
    """A store's refusal as a page titled ``title``. A closed study's page says only that the panel
    has ended, as the Beauty Index's does (issue 27 item 8): an expert is not shown the study's id."""
    if isinstance(exc, StudyClosed):
        return _message(*PANEL_ENDED, exc.status)
    return _message(title, str(exc), exc.status)


def create_vab_app(settings, study_id: str):
    """The ASGI app of one open VAB expert study."""
    d = study_dir(settings, study_id)
    store = open_store(settings, study_id)
    if not store.exists():
        store.dispose()
        raise PanelError(f"VAB study {study_id} is not open (imagebench vab panel open {study_id} ...)")

    # One cookie for both roles, lasting the browser session. Lax, not Strict (the shell): experts
    # open their link from webmail, and Strict drops the cookie on the redirect of a navigation
    # that started on another site (docs/BEAUTY.md, "Sessions").
    shell = PanelShell(store, cookies={"expert": COOKIE, "admin": COOKIE},
                       on_refusal=lambda exc: _refused("Not recorded", exc))
    app = shell.app

    @app.get("/static/panel.css")
    async def css():
        return Response(VAB_CSS, media_type="text/css")

    @app.get("/static/vab.js")
    async def js():
        return Response(VAB_JS, media_type="text/javascript")

    @app.get("/j/{token}")
    async def expert_link(token: str):
        label = await run_in_threadpool(store.expert_for_token, token) if len(token) <= 128 else None
        if label is None:
            return _message("Link not valid", "This link is not valid. Ask the study's organiser for yours.", 404)
        return await shell.sign_in("expert", label, "/expert")

    @app.get("/expert")
    async def expert_page(request: Request):
        label = await shell.label(request, "expert")
        if label is None:
            return _message("Open your link", "Open the link you were sent to start or resume.", 401)
        try:
            item = await run_in_threadpool(store.next_item, label)
        except PanelError as exc:
            return _refused("Nothing to do", exc)
        if item is None:
            return _message("Thank you", "You have answered every set. You can close this page.", 200)
        n = len(item.image_ids)
        cands = []
        for slot, iid in enumerate(item.image_ids, start=1):
            if item.protocol == "rank":
                ctl = f'<label><input type="radio" name="best" value="{slot}" id="best-{slot}" required> best</label>'
                if n >= 3:
                    ctl += f'<label><input type="radio" name="worst" value="{slot}" id="worst-{slot}" required> worst</label>'
            else:
                ctl = (f'<label>score <input type="number" name="s{slot}" id="score-{slot}" min="0" max="10" step="0.1" '
                       f'required inputmode="decimal"></label>')
            cands.append(f'<div class="cand"><p>Image {slot}</p><button type="button" class="zoom" id="zoom-{slot}" '
                         f'title="View full screen (or press {slot})" aria-label="view image {slot} full screen">'
                         f'<img src="/img/{iid}" alt="image {slot}"></button>{ctl}</div>')
        if item.protocol == "rank":
            question = "Pick the best image" + (" and the worst image" if n >= 3 else "") + " of this set."
        else:
            question = "Score each image from 0 to 10 (one decimal allowed)."
        ids = " ".join(item.image_ids)
        body = (f'<p id="progress" data-protocol="{item.protocol}">Set {item.position + 1} of {item.total}</p>{_rubric(item.domain)}'
                f'<p class="question" id="question">{html.escape(question)}</p>'
                f'<form method="post" action="/answer" id="answer-form"><input type="hidden" name="position" value="{item.position}">'
                f'<input type="hidden" name="protocol" value="{item.protocol}"><input type="hidden" name="images" value="{ids}">'
                f'<div class="grid">{"".join(cands)}</div><p id="check"></p>'
                f'<button type="submit" id="submit">Next</button></form>'
                f'<p class="hint" id="zoom-hint">Click an image, or press its number, to see it full screen; Esc to come back.</p>'
                f'<div id="viewer" hidden role="dialog" aria-modal="true" aria-label="one image, full screen" tabindex="-1">'
                f'<img id="viewer-img" alt=""><p id="viewer-caption"></p></div><script src="/static/vab.js"></script>')
        return _page("Visual aesthetic panel", body)

    @app.get("/img/{image_id}")
    async def image(image_id: str, request: Request):
        return await shell.image(request, "expert", image_id, d / "images", store.image_in_queue)

    @app.post("/answer")
    async def answer(request: Request):
        got = await shell.answer_form(request, "expert")
        if isinstance(got, Response):
            return got
        label, form = got
        try:
            position = int(form.get("position", ""))
            protocol = form.get("protocol")
            ids = form.get("images", "").split()
            n = len(ids)
            if protocol not in PROTOCOLS or not 2 <= n <= 6:
                raise PanelError("the form is not a VAB answer (protocol, images)")
            kw: dict = {}
            if protocol == "rank":
                best, worst = form.get("best"), form.get("worst")
                if best not in {str(i) for i in range(1, n + 1)}:
                    raise PanelError(f"pick the best image (1..{n})")
                if n >= 3 and (worst not in {str(i) for i in range(1, n + 1)} or worst == best):
                    raise PanelError(f"pick the worst image (1..{n}), different from the best")
                if n == 2 and worst:
                    raise PanelError("a set of two images has no worst to pick")
                kw = {"best_shown": int(best), "worst_shown": int(worst) if n >= 3 else None}
            else:
                kw = {"scores_shown": [parse_score(form.get(f"s{i}"), i) for i in range(1, n + 1)]}
            await run_in_threadpool(lambda: store.record_answer(label, position, ids, protocol=protocol, **kw))
        except ValueError:
            return _message("Not recorded", "position must be a number", 400)
        except PanelError as exc:
            return refusal(exc)
        return RedirectResponse("/expert", status_code=303)

    @app.get("/admin/{token}")
    async def admin_link(token: str):
        if len(token) > 128 or not await run_in_threadpool(store.is_admin_token, token):
            return _message("Link not valid", "This link is not valid.", 404)
        return await shell.sign_in("admin", None, "/admin")

    @app.get("/admin")
    async def admin_page(request: Request):
        if await shell.label(request, "admin") is None:
            return _message("Open your admin link", "Open the admin link shown at study open.", 401)
        row, prog = await run_in_threadpool(lambda: (store.study_row(), store.progress()))
        esc = html.escape
        rows = "".join(f'<tr data-expert="{esc(p["label"])}"><td>{esc(p["label"])}</td><td class="answered">{p["answered"]}</td>'
                       f'<td>{p["total"]}</td></tr>' for p in prog)
        body = (f'<h1>VAB study {esc(study_id)}</h1><p id="state">State: <b>{esc(row["state"])}</b>; sets {esc(row["sets"])}</p>'
                f'<table id="experts"><tr><th>expert</th><th>answered</th><th>of</th></tr>{rows}</table>')
        return _page(f"Admin: {study_id}", body)

    return app


# ---- after the panel: analysis and export ----------------------------------------------------------
def analyze_vab_study(settings, study_id: str) -> dict:
    """Consensus, agreement, leave-one-expert-out accuracy and the scores-vs-ranking study."""
    from dataclasses import asdict

    from tasks.vab import people

    store = open_store(settings, study_id)
    try:
        if not store.exists():
            raise PanelError(f"VAB study {study_id} is not open")
        rows, n_images = store.answer_rows(), store.n_images()
    finally:
        store.dispose()
    rank = [r for r in rows if r["protocol"] == "rank"]
    score = [r for r in rows if r["protocol"] == "score"]
    return {"study_id": study_id, "experts": len({r["expert"] for r in rows}), "tasks": len(n_images),
            "consensus": [asdict(c) for c in people.consensus_labels(rank, n_images).values()],
            "agreement_best": people.agreement(rank, "best"), "agreement_worst": people.agreement(rank, "worst"),
            "leave_one_expert_out": people.leave_one_expert_out(rank, n_images),
            "scores_vs_ranking": people.scores_vs_ranking(rank, score, n_images)}


def trials_table(settings, study_id: str):
    """The experts' direct answers as ``vab_trials`` rows (judge = exported expert id, judge_kind
    "human", trial 0: each expert sees each task once, in their own permutation)."""
    import pyarrow as pa

    from schemas.vab import VAB_TRIALS

    store = open_store(settings, study_id)
    try:
        sets = store.study_row()["sets"]
        rows = [r for r in store.answer_rows() if r["protocol"] == "rank"]
    finally:
        store.dispose()
    same = [r for r in rows if r["worst"] is not None and r["best"] == r["worst"]]
    if same:  # the page and the server refuse it; a store edited by hand must not slip one through
        raise PanelError(f"study {study_id}: {len(same)} answer(s) name the same image best and worst "
                         f"(expert {same[0]['expert']}, task {same[0]['task_id']}): not exported")
    out = [{"sets": sets, "judge": r["expert"], "judge_kind": "human",
            "judge_identity": f'{{"study": "{study_id}", "protocol": "rank"}}', "task_id": r["task_id"], "trial": 0,
            "prompt_type": "best_worst", "order": r["order"], "best_shown": r["best_shown"], "worst_shown": r["worst_shown"], "best": r["best"],
            "worst": r["worst"], "state": "ok", "detail": None, "decided_at": r["answered_at"]} for r in rows]
    return sets, pa.Table.from_pylist(out, schema=VAB_TRIALS)


def export_trials(settings, study_id: str) -> dict[str, int]:
    """Write each expert's rows into the lake's ``vab_trials`` (that expert's rows replaced, other
    judges' kept), so experts are scored like any judge. Returns rows per expert."""
    import pyarrow.compute as pc

    from tasks.lake.tables import Lake
    from tasks.vab.tables import replace_judge_trials

    sets, table = trials_table(settings, study_id)
    lake = Lake(settings.lake_dir)
    counts = {}
    for judge in sorted(set(table.column("judge").to_pylist())):
        part = table.filter(pc.equal(table.column("judge"), judge))
        replace_judge_trials(lake, sets, judge, part)
        counts[judge] = part.num_rows
    return counts
