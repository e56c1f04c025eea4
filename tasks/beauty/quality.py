"""Quality control of a study's answers (issue 16 item 9): pure functions over ``STUDY_ANSWERS``.

The panel server records, per answer, whether it had sent the image's bytes to the judge before
the answer (``image_loaded``) and the seconds from then to the answer (``seconds_on_screen``;
tasks/beauty/store.py). An answer is flagged (``qc_flag``) when its image was never loaded, or
when it came faster than the study's ``quality.min_seconds_on_screen``. Answers without that
evidence (imported, simulated: null) keep the flag they came with: a study bundle publishes each
answer's ``qc_flag`` (not its evidence), so an imported study flags what the home study flagged
(issue 27 item 3); simulated answers come with none. Flagged answers are kept; the analysis
computes the Beauty Index with and without them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

NOT_LOADED = "image not loaded"
QC_INDEX_COLUMNS = ("flagged_answers", "beauty_index_unflagged", "beauty_index_unflagged_lo", "beauty_index_unflagged_hi")


def too_fast(min_seconds: float) -> str:
    return f"faster than {min_seconds:g} s"


def flag_meanings(min_seconds: float) -> dict[str, str]:
    """Each flag an answer can carry, and what it means (the datasheet's legend; `study
    import-bundle` accepts these and no other)."""
    return {
        NOT_LOADED: "the image was not on the judge's screen before the answer: the panel server never sent its bytes, "
                    "or the judge's browser had not finished loading them",
        too_fast(min_seconds): f"answered less than {min_seconds:g} s (study.json quality.min_seconds_on_screen) "
                               "after the image appeared in the judge's browser (its load event, bounded by the "
                               "server's times; from when the server sent it where the page reported no times)",
    }


def qc_flag(image_loaded: bool | None, seconds_on_screen: float | None, min_seconds: float) -> str | None:
    """Why one answer is flagged, or None."""
    if image_loaded is None:
        return None  # no evidence either way (imported / simulated answers)
    if not image_loaded:
        return NOT_LOADED
    if seconds_on_screen is not None and seconds_on_screen < min_seconds:
        return too_fast(min_seconds)
    return None


def flag_answers(answers: pa.Table, min_seconds: float) -> pa.Table:
    """``answers`` with ``qc_flag`` filled from ``image_loaded`` and ``seconds_on_screen``; an
    answer without that evidence (null ``image_loaded``: imported) keeps the flag it came with."""
    loaded = answers.column("image_loaded").to_pylist()
    secs = answers.column("seconds_on_screen").to_pylist()
    given = answers.column("qc_flag").to_pylist()
    flags = pa.array([qc_flag(ld, s, min_seconds) if ld is not None else g for ld, s, g in zip(loaded, secs, given)],
                     pa.string())
    return answers.set_column(answers.schema.get_field_index("qc_flag"), answers.schema.field("qc_flag"), flags)


def flag_counts(answers: pa.Table) -> Counter:
    """How many answers carry each flag."""
    return Counter(f for f in answers.column("qc_flag").to_pylist() if f is not None)


def flag_note(answers: pa.Table) -> str | None:
    """The line every output of the analysis carries when answers were flagged."""
    counts = flag_counts(answers)
    if not counts:
        return None
    detail = ", ".join(f"{why}: {n}" for why, n in sorted(counts.items()))
    return (f"quality control: {sum(counts.values())} of {answers.num_rows} answers flagged ({detail}); "
            "the Beauty Index without them is beside it (beauty_index_unflagged)")


def with_unflagged_index(index: pa.Table, answers: pa.Table, compute: Callable[[pa.Table], pa.Table]) -> pa.Table:
    """``index`` (``STUDY_INDEX``) with the QC columns: per (tool, panel group) the number of
    flagged answers and the index recomputed by ``compute`` on the unflagged answers only (the same
    values when none is flagged; null where no unflagged answer is left)."""
    flagged = answers.filter(pc.invert(pc.is_null(answers.column("qc_flag"))))
    per_tool = Counter(flagged.column("tool").to_pylist())
    per_group = Counter(zip(flagged.column("tool").to_pylist(), flagged.column("panel_group").to_pylist()))
    rows = index.to_pylist()
    if flagged.num_rows == 0:
        without = {(r["tool"], r["panel_group"]): r for r in rows}
    elif flagged.num_rows == answers.num_rows:
        without = {}
    else:
        kept = answers.filter(pc.is_null(answers.column("qc_flag")))
        try:
            without = {(r["tool"], r["panel_group"]): r for r in compute(kept).to_pylist()}
        except ValueError:  # what is left cannot be analysed (e.g. a single tool): no index without them
            without = {}
    for r in rows:
        other = without.get((r["tool"], r["panel_group"]), {})
        r["flagged_answers"] = per_tool[r["tool"]] if r["panel_group"] == "all" else per_group[(r["tool"], r["panel_group"])]
        r["beauty_index_unflagged"] = other.get("beauty_index")
        r["beauty_index_unflagged_lo"] = other.get("beauty_index_lo")
        r["beauty_index_unflagged_hi"] = other.get("beauty_index_hi")
    return pa.Table.from_pylist(rows, schema=index.schema)
