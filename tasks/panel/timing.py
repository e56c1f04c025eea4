"""Time on screen from the judge's own browser, bounded by the server's times (issue 27 item 4).

The server alone knows when it began sending an image (``image_served_at``) and when the answer
arrived (``answered_at``). Counting time on screen from the first is counting the download as
viewing: a judge on a 64 kB/s link (9 s per image) who answers 1 s after the image appears looked
like a 10-second viewer. The page therefore sends, with each answer, three times read from the
browser's own clock (``performance.now()``, milliseconds from the page's time origin; no clock
needs to agree with the server's, only differences are used):

- ``t_request``: when the browser asked for the image (its Resource Timing entry's ``startTime``);
- ``t_loaded``: the image's ``load`` event (the picture is on screen from here); empty when the
  image had not loaded when the judge answered;
- ``t_answer``: when the judge answered.

Time on screen is ``t_answer - t_loaded`` and the download ``t_loaded - t_request``, each bounded
by the server's window ``answered_at - image_served_at`` (the picture cannot have been on screen
before the server began sending it, nor after the answer arrived), never below 0. What the
browser reports can only shorten the server's figure, never lengthen it. An answer without these
fields (a page without JavaScript) keeps the server's window, an upper bound; an answer whose
browser says the image had not loaded counts as not loaded. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

FIELDS = ("t_request", "t_loaded", "t_answer")  # the answer form's hidden fields, filled by the page's script
MAX_MS = 30 * 86400 * 1000.0  # a page open longer than a month is no measurement


@dataclass(frozen=True)
class BrowserTiming:
    """The three times a page sends with an answer (ms from the page's time origin)."""

    request_ms: float | None
    loaded_ms: float | None  # None: the image had not loaded when the judge answered
    answer_ms: float


@dataclass(frozen=True)
class ScreenTime:
    """What one answer's evidence says: whether the picture was on screen before it, for how long
    (µs) and how long its download took (µs; None when unknown), and whose clock said so."""

    loaded: bool
    on_screen_us: int | None
    download_us: int | None
    source: str  # "browser" | "server" (no browser timing: the server's window, an upper bound)


def _ms(text: str | None) -> float | None:
    if text is None or text == "" or len(text) > 24:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and 0 <= v <= MAX_MS else None


def parse_browser_timing(form: Mapping[str, str]) -> BrowserTiming | None:
    """The browser's times from an answer's form fields, or None when the page sent none (no
    script) or they contradict each other (a load after the answer, a request after the load:
    then the server's own times stand alone)."""
    answer = _ms(form.get("t_answer"))
    if answer is None:
        return None
    loaded, request = _ms(form.get("t_loaded")), _ms(form.get("t_request"))
    if form.get("t_loaded") and loaded is None:
        return None  # something was sent that is not a time: no evidence, not "not loaded"
    if loaded is not None and loaded > answer:
        return None
    if request is not None and (loaded is None or request > loaded):
        request = None
    return BrowserTiming(request, loaded, answer)


def screen_time(image_served_us: int | None, answered_us: int, timing: BrowserTiming | None) -> ScreenTime:
    """One answer's time on screen (module docstring): the browser's figures bounded by the
    server's window; the window itself without browser figures; not loaded when the server never
    sent the image before the answer, or the browser says it had not loaded."""
    if image_served_us is None or image_served_us > answered_us:
        return ScreenTime(False, None, None, "server" if timing is None else "browser")
    window = answered_us - image_served_us
    if timing is None:
        return ScreenTime(True, window, None, "server")
    if timing.loaded_ms is None:
        return ScreenTime(False, None, None, "browser")
    on_screen = min(window, max(0, round((timing.answer_ms - timing.loaded_ms) * 1000)))
    download = None
    if timing.request_ms is not None:
        download = min(window, max(0, round((timing.loaded_ms - timing.request_ms) * 1000)))
    return ScreenTime(True, on_screen, download, "browser")
