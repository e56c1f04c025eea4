"""The Beauty Index judging web app: the protocol's pages and routes on the panel shell
(tasks/panel/app.py: links, sessions, cookies, blinded images, the page frame, the request log).

Cookies: one per role (a judge link does not log the admin out), ``Secure`` when the panel's
public URL is https, expiring after ``panel_session_days``; the same link opened again resumes
where the judge stopped (the store knows the next unanswered position) and replaces the older
session. One image at a time, Yes/No buttons and the Y/N keys, a progress bar, no way back.
Answers: POSTed with the position and image id they answer; recorded (durably) before the
redirect to the next image; a double click or a retried POST records one answer. Memo: recorded in
the browser (MediaRecorder, stopped at 10 s), uploaded only when the judge ticks consent, size- and
type-checked, stored in the object store under ``studies/<id>/memos/<opaque id>.<ext>`` and linked
to the answer; a second, separate box (unticked by default) records the judge's consent to
publishing the recording in the open-data bundle (``publish=1``, kept with its time).
"""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from schemas.study import MEMO_KEEP_CONSENT, MEMO_MAX_SECONDS, MEMO_PUBLISH_CONSENT
from tasks.panel.answer_js import SEND_ANSWER_JS
from tasks.panel.app import COOKIES, CSS, MAX_POSITION, PANEL_ENDED, PanelShell, _message, _page, parse_position, refusal
from tasks.panel.blind import opaque_id
from tasks.panel.limits import BodyLimit
from tasks.panel.memo_audio import MEMO_CONTAINERS, MemoRejected, check_memo
from tasks.panel.store import PanelError, StudyClosed
from tasks.panel.timing import parse_browser_timing
from tasks.beauty.admin import add_admin_routes
from tasks.beauty.store import PanelStore

MEMO_MAX_BYTES = 1_000_000  # 10 s of Opus is ~20-40 kB; anything near 1 MB is not a short memo
MEMO_TYPES = MEMO_CONTAINERS  # accepted memo types (tasks/panel/memo_audio.py decodes each upload)


JS = SEND_ANSWER_JS + """(function(){
var form=document.getElementById('answer-form'); if(!form) return;
var sent=false, pending=false;
// Time on screen (issue 27 item 4): the image is on screen from the browser's own load event, not
// from when the server began sending it (a slow link's download is no viewing). Milliseconds from
// this page's time origin, sent with the answer; the server bounds them by its own times.
var img=document.getElementById('stimulus');
function stamp(name,t){ var e=form.querySelector('input[name='+name+']'); if(e&&!e.value) e.value=t.toFixed(1); }
function loaded(t){ var r=performance.getEntriesByName(img.currentSrc||img.src,'resource')[0];
  if(r) stamp('t_request',r.startTime);
  stamp('t_loaded',t!==undefined?t:(r&&r.responseEnd>0?r.responseEnd:performance.now())); }
if(img){ if(img.complete&&img.naturalWidth>0) loaded(); else img.addEventListener('load',function(){ loaded(performance.now()); }); }
// One answer per page: a second click, key or submit is dropped. The answer is kept until the
// server has it and sent again by itself (the panel shell's sender, tasks/panel/answer_js.py).
form.addEventListener('submit',function(e){
  e.preventDefault(); if(sent||pending) return; sent=true; stamp('t_answer',performance.now());
  var body=new URLSearchParams(new FormData(form)); if(e.submitter&&e.submitter.name) body.append(e.submitter.name,e.submitter.value);
  Array.prototype.forEach.call(form.querySelectorAll('button'),function(b){ b.disabled=true; });
  panelSendAnswer(form,body.toString(),'/judge'); });
document.addEventListener('keydown',function(e){ if(e.ctrlKey||e.metaKey||e.altKey||e.repeat) return;
  var k=e.key.toLowerCase(); if(k!=='y'&&k!=='n') return; e.preventDefault();
  form.requestSubmit(document.getElementById(k==='y'?'yes':'no')); });
var rec=document.getElementById('rec'); if(!rec) return;
var state=document.getElementById('memo-state'), consent=document.getElementById('consent'), mr=null, timer=null;
var publish=document.getElementById('publish-consent');  // the separate consent to publishing the recording
var maxMs=parseInt(rec.dataset.maxSeconds,10)*1000, pos=form.querySelector('[name=position]').value;
rec.addEventListener('click',function(){
  if(mr&&mr.state==='recording'){ mr.stop(); return; }
  if(!consent.checked){ state.textContent='Tick the box to agree that your memo is kept, then record.'; return; }
  navigator.mediaDevices.getUserMedia({audio:true}).then(function(stream){
    var chunks=[]; mr=new MediaRecorder(stream);
    mr.ondataavailable=function(ev){ if(ev.data.size) chunks.push(ev.data); };
    mr.onstop=function(){ clearTimeout(timer); stream.getTracks().forEach(function(t){t.stop();});
      var type=(mr.mimeType||'audio/webm').split(';')[0]; var blob=new Blob(chunks,{type:type});
      pending=true; state.textContent='Saving memo...'; rec.textContent='Record memo';
      fetch('/memo?position='+encodeURIComponent(pos)+'&consent=1&publish='+(publish&&publish.checked?'1':'0'),{method:'POST',body:blob,headers:{'Content-Type':type},credentials:'same-origin'})
        .then(function(r){ return r.json().then(function(j){ if(!r.ok) throw new Error(j.error||r.status); return j; }); })
        .then(function(j){ document.getElementById('memo_id').value=j.memo_id; state.textContent='Memo saved.'; rec.disabled=true; })
        .catch(function(err){ state.textContent='Memo not saved: '+err.message; })
        .finally(function(){ pending=false; }); };
    mr.start(); rec.textContent='Stop'; state.textContent='Recording (up to '+(maxMs/1000)+' s)...';
    // Stop a little before the limit: a late timer or the encoder's last frame must not push a
    // full-length memo past the server's decoded-duration check (tasks/panel/memo_audio.py).
    timer=setTimeout(function(){ if(mr.state==='recording') mr.stop(); }, maxMs-300);
  }).catch(function(err){ state.textContent='No microphone: '+err.message; });
});
})();"""


def create_app(settings, study_id: str, public_url: str | None = None) -> FastAPI:
    """The ASGI app of one open study. ``public_url`` (default: the ``panel_url`` setting, else the
    URL given at ``study open``): the address judges reach; https makes the cookies ``Secure``."""
    from tasks.beauty.study import load_study, memo_key, open_panel_store, panel_url_of
    from tasks.runs.units_ingest import open_configured_store

    definition, prereg, d = load_study(settings, study_id)
    if prereg is None:
        raise PanelError(f"study {study_id} is not open yet (imagebench study open {study_id})")
    store: PanelStore = open_panel_store(settings, study_id)
    if not store.exists():
        raise PanelError(f"study {study_id} has no panel rows (imagebench study open {study_id})")
    images_dir = Path(d) / "images"
    public_url = public_url or panel_url_of(settings, study_id) or ""
    secure = public_url.lower().startswith("https://")
    session_s = float(getattr(settings, "panel_session_days", 28.0)) * 86400
    # A memo's body has its own limit, refused by size before it is read like every other body.
    shell = PanelShell(store, cookies=COOKIES, session_s=session_s, secure=secure, replace_sessions=True,
                       body_limits={"/memo": BodyLimit(MEMO_MAX_BYTES, json=True)})
    app = shell.app
    objects = open_configured_store(settings)

    # The memo step has two consent lines (issue 27 item 1): the image gives way by one more line,
    # so the page still fits a 1280x757 window without scrolling.
    page_css = CSS + ("img#stimulus{max-height:min(70vh,calc(100vh - 16.5rem))}" if definition.memo else "")

    @app.get("/static/panel.css")
    async def css() -> Response:
        return Response(page_css, media_type="text/css")

    @app.get("/static/judge.js")
    async def js() -> Response:
        return Response(JS, media_type="text/javascript")

    @app.get("/j/{token}")
    async def judge_link(token: str) -> Response:
        label = await run_in_threadpool(store.judge_for_token, token) if len(token) <= 128 else None
        if label is None:
            return _message("Link not valid", "This link is not valid. Ask the study's organiser for yours.", 404)
        return await shell.sign_in("judge", label, "/judge")

    @app.get("/judge")
    async def judge_page(request: Request) -> Response:
        label = await shell.label(request, "judge")
        if label is None:
            return _message("Open your link", "Open the link you were sent to start or resume.", 401)
        try:
            item = await run_in_threadpool(store.next_item, label)
        except PanelError as exc:
            return refusal(exc)
        if item is None:
            return _message("Thank you", "You have answered every image. You can close this page.", 200)
        pct = 100.0 * item.position / item.total
        memo = ""
        if definition.memo:
            # Two consents, ticked separately: keeping the memo, and (optional, unticked) publishing
            # the recording itself in the open data (issue 27 item 1; recorded with its time).
            memo = (f'<div id="memo"><label><input type="checkbox" id="consent"> {html.escape(MEMO_KEEP_CONSENT)} '
                    f'(optional, at most {MEMO_MAX_SECONDS} seconds: what was the feeling?)</label><br>'
                    f'<label><input type="checkbox" id="publish-consent"> {html.escape(MEMO_PUBLISH_CONSENT)} '
                    f'(optional)</label><br>'
                    f'<button type="button" id="rec" data-max-seconds="{MEMO_MAX_SECONDS}">Record memo</button> '
                    f'<span id="memo-state"></span></div>')
        body = f"""<div class="bar" role="progressbar" aria-valuemin="0" aria-valuemax="{item.total}" aria-valuenow="{item.position}">
<div style="width:{pct:.1f}%"></div></div><p id="progress">Image {item.position + 1} of {item.total}</p>
<img id="stimulus" src="/img/{item.image_id}" alt="image {item.position + 1}">
<p class="question">{html.escape(definition.question)}</p>
<form method="post" action="/answer" id="answer-form">
<input type="hidden" name="position" value="{item.position}"><input type="hidden" name="image_id" value="{item.image_id}">
<input type="hidden" name="memo_id" id="memo_id" value="">
<input type="hidden" name="t_request" value=""><input type="hidden" name="t_loaded" value=""><input type="hidden" name="t_answer" value="">
<button type="submit" name="answer" value="yes" id="yes">Yes (Y)</button>
<button type="submit" name="answer" value="no" id="no">No (N)</button></form>{memo}
<script src="/static/judge.js"></script>"""
        return _page("Did this make you feel something?", body)

    @app.get("/img/{image_id}")
    async def image(image_id: str, request: Request) -> Response:
        # Only an image of the judge's queue while the study is open; the store notes when it was sent (QC).
        return await shell.image(request, "judge", image_id, images_dir, store.serve_image)

    @app.post("/answer")
    async def answer(request: Request) -> Response:
        got = await shell.answer_form(request, "judge")
        if isinstance(got, Response):
            return got
        label, form = got
        position = parse_position(form.get("position"))
        if position is None:
            return _message("Not recorded", f"position must be a whole number from 0 to {MAX_POSITION}", 400)
        choice, image_id, memo_id = form.get("answer"), form.get("image_id", ""), form.get("memo_id") or None
        if choice not in ("yes", "no"):
            return _message("Not recorded", "answer must be yes or no", 400)
        timing = parse_browser_timing(form)  # the browser's own times: time on screen (issue 27 item 4)
        try:
            await run_in_threadpool(store.record_answer, label, position, image_id, choice == "yes", memo_id, timing)
        except PanelError as exc:
            return refusal(exc)
        return RedirectResponse("/judge", status_code=303)

    @app.post("/memo")
    async def memo(request: Request, position: str = "", consent: str = "0", publish: str = "0") -> Response:
        label = await shell.label(request, "judge")
        if label is None:
            return JSONResponse({"error": "no session"}, status_code=401)
        if not definition.memo:
            return JSONResponse({"error": "this study takes no memos"}, status_code=403)
        pos = parse_position(position)
        if pos is None:
            return JSONResponse({"error": f"position must be a whole number from 0 to {MAX_POSITION}"}, status_code=400)
        if consent != "1":
            return JSONResponse({"error": "a memo is kept only with the judge's consent"}, status_code=400)
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in MEMO_TYPES:
            return JSONResponse({"error": f"memo type {media_type or 'missing'} not accepted (audio only)"}, status_code=415)
        data = await request.body()  # at most MEMO_MAX_BYTES: the shell's body limit refused more (413) unread
        try:
            audio = await run_in_threadpool(check_memo, data, media_type, MEMO_MAX_SECONDS)
        except MemoRejected as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        ext = audio.extension
        memo_id = opaque_id()
        key = memo_key(study_id, memo_id, ext)

        def _save() -> None:
            row = store.study_row()
            if row is None or row["state"] != "open":
                from tasks.panel.store import StudyClosed

                raise StudyClosed(f"study {study_id} is closed: it accepts no memos")
            objects.write(key, data)
            store.record_memo(label, pos, memo_id, key, media_type, len(data), publish=publish == "1")

        try:
            await run_in_threadpool(_save)
        except PanelError as exc:  # a closed study: only that the panel has ended (issue 27 item 8)
            return JSONResponse({"error": PANEL_ENDED[1] if isinstance(exc, StudyClosed) else str(exc)}, status_code=exc.status)
        return JSONResponse({"memo_id": memo_id})

    # The admin's pages: progress while the study runs, results after the close (issue 27 item 5).
    add_admin_routes(app, shell, store, study_id, definition, prereg)
    return app
