"""The Beauty Index's admin page: progress while the panel runs, results after the close (issue 27
item 5).

The pre-registration says the results are looked at after the close; a page that shows % yes per
tool and prompt to whoever holds the admin link invites a peek. So while the study is open the
page shows progress only: how many judges finished, each judge's place in their queue, answers,
last answer, who is stuck (no sign of life for ``STUCK_AFTER_S``) and who is on a slow link
(median image download of at least ``SLOW_LINK_S`` as their browser measured it,
tasks/panel/timing.py); nothing per tool or prompt, no count of yes. A lab that insists on looking
types a reason: the look is recorded as a deviation (tasks/beauty/prereg.py, the store's
``panel_deviations``) and that one response shows the results; the next visit is blind again.
After ``study close`` the page shows the results and every deviation recorded.
"""

from __future__ import annotations

import html

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from tasks.beauty import store as beauty_store
from tasks.beauty.prereg import PEEK, REASON_MAX, REASON_MIN, deviation_sentence, reason_problem
from tasks.panel.app import PanelShell, _message, _page
from tasks.panel.store import StudyClosed

STUCK_AFTER_S = 30 * 60  # no answer and no image shown for this long while unfinished: stuck
SLOW_LINK_S = 2.0  # a judge whose images take this long to download (median) is on a slow link


def _pct(pair: dict) -> str:
    return f"{100.0 * pair['yes'] / pair['answers']:.0f}%" if pair["answers"] else ""


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: "45 min", "2 h 5 min", "3 d 4 h"."""
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def judge_state(judge: dict, now_us: int) -> str:
    """finished | not started | answering | stuck: no answer for <duration> (a judge of
    ``PanelStore.judge_progress``; ``now_us``: the server's clock)."""
    if judge["total"] and judge["answered"] >= judge["total"]:
        return "finished"
    if judge["last_activity_us"] is None:
        return "not started"
    idle_s = (now_us - judge["last_activity_us"]) / 1e6
    return f"stuck: no answer for {duration(idle_s)}" if idle_s >= STUCK_AFTER_S else "answering"


def slow_link(judge: dict) -> bool:
    return judge["median_download_s"] is not None and judge["median_download_s"] >= SLOW_LINK_S


def _progress(judges: list[dict], now_us: int) -> str:
    esc = html.escape
    rows = []
    for j in judges:
        finished = j["total"] and j["answered"] >= j["total"]
        at = "done" if finished else f"image {j['answered'] + 1} of {j['total']}"
        last = f"{j['last_answer_at']:%Y-%m-%d %H:%M:%S} UTC" if j["last_answer_at"] else ""
        dl = "" if j["median_download_s"] is None else f"{j['median_download_s']:.1f} s" + (" (slow link)" if slow_link(j) else "")
        rows.append(f'<tr data-judge="{esc(j["label"])}"><td>{esc(j["label"])}</td><td>{esc(j["group"])}</td>'
                    f'<td class="position">{at}</td><td class="answered">{j["answered"]}</td><td>{j["total"]}</td>'
                    f'<td class="last">{last}</td><td class="state">{esc(judge_state(j, now_us))}</td>'
                    f'<td class="download">{dl}</td></tr>')
    n_done = sum(1 for j in judges if j["total"] and j["answered"] >= j["total"])
    slow = [j for j in judges if slow_link(j)]
    slow_text = ("none" if not slow else ", ".join(f'{esc(j["label"])} ({j["median_download_s"]:.1f} s)' for j in slow))
    return (f'<p id="finished">{n_done} of {len(judges)} judges finished</p><h2>Judges</h2><table id="judges"><tr>'
            '<th>judge</th><th>group</th><th>now at</th><th>answered</th><th>of</th><th>last answer</th><th>state</th>'
            '<th>image download (median)</th></tr>' + "".join(rows) + '</table>'
            f'<p id="slow-links">Judges on slow links (median image download of {SLOW_LINK_S:g} s or more, as their '
            f'browser measured it; not counted as time on screen): {slow_text}</p>')


def _results(pairs: list[dict]) -> str:
    esc = html.escape
    rows = "".join(f'<tr data-pair="{esc(p["tool"])}/{esc(p["prompt_id"])}"><td>{esc(p["tool"])}</td>'
                   f'<td>{esc(p["prompt_id"])}</td><td class="answers">{p["answers"]}</td><td class="yes">{p["yes"]}</td>'
                   f'<td>{_pct(p)}</td></tr>' for p in pairs)
    return ('<h2>Answers per tool and prompt</h2><table id="pairs"><tr><th>tool</th><th>prompt</th><th>answers</th>'
            f'<th>yes</th><th>% yes</th></tr>{rows}</table>')


def _hidden(study_id: str) -> str:
    return (f'<h2>Results</h2><p id="results-hidden">The results stay hidden until the study is closed '
            f'(<code>imagebench study close {html.escape(study_id)}</code>), as the pre-registration says.</p>'
            '<form method="post" action="/admin/peek" id="peek-form"><p>Look before the close anyway: the look is '
            'recorded as a deviation from the pre-registration, with your reason and the time, and published with '
            'the study.</p><label>Reason (at least '
            f'{REASON_MIN} characters)<br><textarea name="reason" rows="3" cols="70" minlength="{REASON_MIN}" '
            f'maxlength="{REASON_MAX}" required></textarea></label><br>'
            '<button type="submit">Record the deviation and show the results</button></form>')


def _deviations(devs: list[dict]) -> str:
    if not devs:
        return ""
    items = "".join(f"<li>{html.escape(deviation_sentence(d))}</li>" for d in devs)
    return f'<h2>Deviations from the pre-registration</h2><ul id="deviations">{items}</ul>'


def add_admin_routes(app: FastAPI, shell: PanelShell, store, study_id: str, definition, prereg) -> None:
    """``/admin/<token>`` (signs the admin in), ``/admin`` (the page) and ``/admin/peek`` (a look
    before the close, recorded) on the study's app."""

    @app.get("/admin/{token}")
    async def admin_link(token: str) -> Response:
        if len(token) > 128 or not await run_in_threadpool(store.is_admin_token, token):
            return _message("Link not valid", "This link is not valid.", 404)
        return await shell.sign_in("admin", None, "/admin")

    def _view(peeked: dict | None = None) -> Response:
        row, judges, devs = store.study_row(), store.judge_progress(), store.deviations()
        is_open = row["state"] == "open"
        esc = html.escape
        total = sum(j["answered"] for j in judges)
        expected = sum(j["total"] for j in judges)
        sim = " (SIMULATED)" if definition.simulated else ""
        body = (f'<h1>Study {esc(study_id)}{sim}</h1><p id="state">State: <b>{esc(row["state"])}</b>; '
                f'<span id="answers-total">{total}</span> of {expected} answers; pre-registration '
                f'{esc(prereg.created_at)}</p>' + _progress(judges, beauty_store.now_us()))
        if peeked is not None:
            body += (f'<p id="deviation-recorded"><b>Recorded as a deviation from the pre-registration:</b> '
                     f'{esc(deviation_sentence(peeked))}. These results are shown once; the page is blind again '
                     'on the next visit.</p>')
        body += _results(store.pair_counts()) if (not is_open or peeked is not None) else _hidden(study_id)
        return _page(f"Admin: {study_id}", body + _deviations(devs))

    @app.get("/admin")
    async def admin_page(request: Request) -> Response:
        if await shell.label(request, "admin") is None:
            return _message("Open your admin link", "Open the admin link shown at study open.", 401)
        return await run_in_threadpool(_view)

    @app.post("/admin/peek")
    async def admin_peek(request: Request) -> Response:
        got = await shell.answer_form(request, "admin")
        if isinstance(got, Response):
            return got
        reason = got[1].get("reason", "")
        problem = reason_problem(reason)
        if problem:
            return _message("Nothing recorded, nothing shown", problem, 400)

        def _peek() -> Response:
            try:
                dev = store.record_deviation(PEEK, reason.strip(), "admin page")
            except StudyClosed:
                return RedirectResponse("/admin", status_code=303)  # closed meanwhile: the results are the page's
            return _view(dev)

        return await run_in_threadpool(_peek)
