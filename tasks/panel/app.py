"""The panel shell: what every judging web app shares, whatever its protocol (FastAPI on uvicorn,
pages rendered on the server, a little JS). It imports no protocol: the Beauty Index
(tasks/beauty/panel.py) and VAB's expert panel (tasks/vab/panel.py) each build their app on a
:class:`PanelShell` over their store (a ``tasks.panel.store.SqlStore``) and add their own pages.

Links and sessions: a judge's link ``/j/<token>`` (the admin's ``/admin/<token>``) is used once per
visit to set an HttpOnly session cookie, then redirects to a token-free page
(:meth:`PanelShell.sign_in`); uvicorn's access log is off and our own request log prints
``/j/<redacted>``, so no token reaches a log. Tokens and cookies are stored as sha256
(tasks/panel/store.py). ``SameSite=Lax`` so that a link clicked in webmail (a cross-site
navigation) gets in (``Strict`` drops the cookie on the redirect that follows); a protocol chooses
its cookie per role, ``Secure`` and how long a session lasts.

Blind: pages and headers carry no tool or prompt; images are served from ``/img/<opaque id>`` as
the blinded JPEG (tasks/panel/blind.py), only from the judge's own queue
(:meth:`PanelShell.image`). Answers: an answer's POST is read by :meth:`PanelShell.answer_form`
(session, size, form fields), the same for every protocol. Every response carries the same
security headers (CSP, no-store, no referrer, no framing); every page the same frame (:func:`_page`).
"""

from __future__ import annotations

import html
import logging
import re
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from tasks.panel.blind import BLIND_EXTENSION, BLIND_MEDIA_TYPE
from tasks.panel.limits import BodyLimit, BodyLimitMiddleware, BodyRules, ServerLimits, raise_open_files_limit
from tasks.panel.store import PanelError, StudyClosed

log = logging.getLogger("imagebench.panel")

COOKIE = "ib_session"  # the VAB expert panel's (tasks/vab/panel.py)
COOKIES = {"judge": "ib_judge", "admin": "ib_admin"}  # the Beauty Index's, one per role: a judge link never logs the admin out
MAX_POSITION = 2**31 - 1  # the store's INTEGER column; anything outside is a 400, never a 500
MAX_FORM_BYTES = 4096  # every request body but the paths a protocol lists in ``body_limits`` (tasks/panel/limits.py)
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_SECRET_PATH = re.compile(r"^/(j|admin)/[^/]+")

CSP = ("default-src 'none'; img-src 'self'; media-src 'self' blob:; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def redact_path(path: str) -> str:
    """``/j/<token>`` -> ``/j/<redacted>`` (what our request log prints)."""
    return _SECRET_PATH.sub(lambda m: f"/{m.group(1)}/<redacted>", path)


def parse_position(text: str | None) -> int | None:
    """A queue position from a form or query value: a decimal in [0, MAX_POSITION], else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    n = int(text)
    return n if n <= MAX_POSITION else None


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><link rel="stylesheet" href="/static/panel.css"></head>
<body><main>{body}</main></body></html>"""
    return HTMLResponse(doc, status_code=status)


def _message(title: str, text: str, status: int) -> HTMLResponse:
    return _page(title, f'<h1>{html.escape(title)}</h1><p id="message">{html.escape(text)}</p>', status)


PANEL_ENDED = ("The panel has ended", "This panel has ended: it takes no more answers. Thank you for taking part.")


def refusal(exc: PanelError) -> HTMLResponse:
    """The page of a store's refusal: "Nothing to do" for a 409 (already answered, queue done),
    else "Not recorded", with the refusal's own status. A closed study's page says only that the
    panel has ended (issue 27 item 8): a judge is not shown the study's id."""
    if isinstance(exc, StudyClosed):
        return _message(*PANEL_ENDED, exc.status)
    return _message("Not recorded" if exc.status != 409 else "Nothing to do", str(exc), exc.status)


# The panels' stylesheet (/static/panel.css): the page frame, the progress bar, one image with its
# question and buttons; VAB's expert panel adds its grid and viewer (tasks/vab/panel.py).
CSS = """body{font-family:system-ui,sans-serif;margin:0;background:#f4f4f4;color:#222}
main{max-width:1100px;margin:0 auto;padding:1rem}
.bar{height:10px;background:#ddd;border-radius:5px;overflow:hidden}.bar>div{height:100%;background:#3a7}
#progress{margin:.3rem 0}
/* The image leaves room for the question, the buttons and the memo controls: all of it fits a
   1280x757 window without scrolling (tests/panel/test_browser.py). */
img#stimulus{display:block;max-width:100%;max-height:min(70vh,calc(100vh - 15rem));margin:.5rem auto;background:#808080}
.question{font-size:1.3rem;text-align:center;margin:.4rem 0}
form#answer-form{display:flex;gap:2rem;justify-content:center}
form#answer-form button{font-size:1.3rem;padding:.5rem 2.5rem}
#memo{text-align:center;margin-top:.6rem;color:#555}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}"""


class PanelShell:
    """One study's app frame over its ``store``: the FastAPI app (no docs pages; the store disposed
    at shutdown; security headers and the redacted request log on every response; a store's
    refusal raised outside a handler's own try, e.g. a busy database at the session lookup, is
    ``on_refusal``'s page with its status, not a 500) and the sessions, answer forms and blinded
    images every protocol serves the same way.

    ``cookies``: the cookie of each role; ``session_s``: how long a session lasts (None: until the
    study closes; the cookie is then a browser-session cookie); ``secure``: the cookies are
    ``Secure`` (the panel's public URL is https); ``replace_sessions``: a link opened again ends the
    older sessions of its role and label; ``body_limits``: the paths whose request bodies may be
    larger than ``MAX_FORM_BYTES`` (a memo upload), each refused beyond its own limit the same way
    (:class:`tasks.panel.limits.BodyLimitMiddleware`; the rules are ``app.state.body_rules``)."""

    def __init__(self, store, *, cookies: dict[str, str], session_s: float | None = None, secure: bool = False,
                 replace_sessions: bool = False, on_refusal: Callable[[PanelError], Response] = refusal,
                 body_limits: dict[str, BodyLimit] | None = None):
        self.store, self.cookies, self.session_s, self.secure = store, cookies, session_s, secure
        self.replace_sessions = replace_sessions

        @asynccontextmanager
        async def lifespan(_app):
            yield
            store.dispose()

        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
        app.state.store = store
        # Added before the headers-and-log middleware below, so inside it: a refusal by size or time
        # carries the same security headers and gets its log line.
        app.state.body_rules = BodyRules(BodyLimit(MAX_FORM_BYTES), dict(body_limits or {}))
        app.add_middleware(BodyLimitMiddleware, rules=app.state.body_rules, refuse=_body_refusal)

        @app.middleware("http")
        async def _headers_and_log(request: Request, call_next):
            t0 = time.monotonic()
            response = await call_next(request)
            response.headers["Cache-Control"] = "no-store"
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["Content-Security-Policy"] = CSP
            log.info("%s %s %s %.0fms", request.method, redact_path(request.url.path), response.status_code,
                     (time.monotonic() - t0) * 1000)
            return response

        @app.exception_handler(PanelError)
        async def _refused(_request: Request, exc: PanelError) -> Response:
            return on_refusal(exc)

        self.app = app

    async def label(self, request: Request, role: str) -> str | None:
        """The label of the request's session in ``role`` ("" for a session without one, the
        admin's), or None: no cookie, an unknown or expired session, another role."""
        got = await run_in_threadpool(self.store.session, request.cookies.get(self.cookies[role]), self.session_s)
        if got is None or got[0] != role:
            return None
        return got[1] or ""

    async def sign_in(self, role: str, label: str | None, to: str) -> Response:
        """A new session of ``role`` for ``label`` (a link just checked): its cookie set on the
        redirect to the token-free page ``to``."""
        secret = await run_in_threadpool(self.store.new_session, role, label, self.replace_sessions)
        resp = RedirectResponse(to, status_code=303)
        resp.set_cookie(self.cookies[role], secret, max_age=None if self.session_s is None else int(self.session_s),
                        httponly=True, samesite="lax", secure=self.secure, path="/")
        return resp

    async def answer_form(self, request: Request, role: str) -> tuple[str, dict[str, str]] | Response:
        """An answer's POST: (label, the form's fields, first value of each), or the page that
        refuses it: no session (401). A body over ``MAX_FORM_BYTES`` never gets here: the body
        limit answered 413 before reading it (tasks/panel/limits.py)."""
        label = await self.label(request, role)
        if label is None:
            return _message("Open your link", "Your session has ended: open the link you were sent.", 401)
        body = await request.body()
        return label, {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    async def image(self, request: Request, role: str, image_id: str, images_dir: Path,
                    may_see: Callable[[str, str], bool]) -> Response:
        """The blinded JPEG ``image_id`` from ``images_dir``, for a session of ``role`` whose
        ``may_see(label, image_id)`` (run in a thread: the store's check) allows it; else a 404."""
        label = await self.label(request, role)
        if label is None or not _ID_RE.fullmatch(image_id) or not await run_in_threadpool(may_see, label, image_id):
            return Response("not found", status_code=404, media_type="text/plain")
        data = await run_in_threadpool((images_dir / f"{image_id}.{BLIND_EXTENSION}").read_bytes)
        return Response(data, media_type=BLIND_MEDIA_TYPE)


def _body_refusal(status: int, text: str, limit: BodyLimit) -> Response:
    """A body refused by size (413) or time (408): JSON for a path the page calls with fetch, else a page."""
    if limit.json:
        return JSONResponse({"error": text}, status_code=status)
    return _message("Not recorded", f"{text}: nothing was saved", status)


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8765, configure_logging: bool = True,
                limits: ServerLimits = ServerLimits()):
    """A uvicorn server for ``app``: our redacted request log instead of uvicorn's access log
    (``configure_logging=False`` leaves the process's logging alone, e.g. in tests); h11 with a
    deadline for every request's headers, bounded headers and keep-alive (``limits``,
    tasks/panel/limits.py); the process's open-files limit raised, so that idle connections cannot
    use up the descriptors a judge's connection needs. No ``limit_concurrency``: past it uvicorn
    answers every new request 503, so a flood of idle connections would turn judges away; the
    header deadline ends those connections instead, and the reverse proxy caps them in front."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    raise_open_files_limit()
    config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level="info", lifespan="on",
                            server_header=False, proxy_headers=False, http=limits.protocol(),
                            timeout_keep_alive=limits.keep_alive_s,
                            h11_max_incomplete_event_size=limits.max_header_bytes,
                            timeout_graceful_shutdown=limits.graceful_shutdown_s,
                            log_config=LOGGING_CONFIG if configure_logging else None)
    return uvicorn.Server(config)
