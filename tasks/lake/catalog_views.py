"""SQL of the catalog's views over the ImageBench results: the `leaderboard` view's columns and
`capability_items`, from which every published Capability is recomputed in one line of SQL
(issue 26 item 3; docs/LAKE.md, "Capability in plain SQL").

Plain strings, no imports: tasks/lake/tables.py builds the catalog with them, and `sql` /
`leaderboard` import that module (they answer in about a second).

The words, one meaning everywhere (docs/STATISTICS.md section 1):

- **decided**: the prompt counts for Capability: PASS or FAIL, a missing or quarantined image
  included (a FAIL by rule);
- **judged**: a judge decided it: an ok image with a PASS or FAIL verdict (decided minus the images
  that never came);
- **undecided**: ERROR, UNPARSABLE or no verdict (not judged yet): counted nowhere;
- **coverage** = decided / prompts (below 1: provisional).
"""

from __future__ import annotations

# Columns of the leaderboard view, in order (after the computed rank columns): the latest
# model_scores row's columns, except those computed in LEADERBOARD_EXPRESSIONS.
LEADERBOARD_COLUMNS = (
    "model_id",
    "overall",
    "overall_lo",
    "overall_hi",
    "capability",
    "capability_lo",
    "capability_hi",
    "eps",
    "eps_lo",
    "eps_hi",
    "coverage",
    "provisional",
    "judged",
    "decided",
    "prompts",
    "verdicts_pass",
    "verdicts_fail",
    "verdicts_undecided",
    "eps_prompts_scored",
    "eps_prompts_eligible",
    "eps_prompts_lost",
    "complete",
    "uncalibrated",
    "images_ok",
    "images_quarantined",
    "images_missing",
    "scorer_name",
    "scorer_id",
    "suite_version",
    "reference_version",
    "reference_sha256",
    "run_id",
    "scored_at",
)

# Leaderboard columns computed from the model_scores row `l`. Every missing or quarantined image is
# one FAIL of the row's verdicts_fail (tasks/scores/stats.py effective_verdicts), so the prompts a
# judge decided are the decided ones less those images.
LEADERBOARD_EXPRESSIONS = {
    # `complete` recomputed from the image counts, so rows written before that definition
    # (docs/LAKE.md, "complete") read the same as new ones.
    "complete": "(l.complete AND l.images_quarantined = 0 AND l.images_missing = 0)",
    "coverage": "l.judge_coverage",
    "decided": "(l.verdicts_pass + l.verdicts_fail)",
    "judged": "(l.verdicts_pass + l.verdicts_fail - l.images_quarantined - l.images_missing)",
    "prompts": "(l.verdicts_pass + l.verdicts_fail + l.verdicts_undecided)",
}

# One row per (model of the leaderboard, prompt of the suite in force): what its Capability counted.
# The same rules as tasks/runs/units_aggregate.py (_prepare_model, _latest_verdicts_in):
# - the image state is the model's `images` row (no row: missing); for a reference whose scores
#   were imported (hps_scores.source = 'import') there are no images of ours: a prompt is ok when
#   the model has a score or a verdict for it, else missing;
# - the verdict is the newest `verdicts` row for the prompt's current image (a row without an image
#   hash, as import-verdicts writes, counts for whatever image is current);
# - outcome: FAIL for a missing or quarantined image whatever the verdict; else the verdict, or
#   NOT_JUDGED when there is none.
CAPABILITY_ITEMS_SQL = """
CREATE VIEW capability_items AS
WITH models AS MATERIALIZED (
    SELECT model_id, scorer_id,
           scorer_id IN (SELECT DISTINCT scorer_id FROM hps_scores WHERE source = 'import') AS imported
    FROM leaderboard
),
grid AS (
    SELECT m.model_id, m.scorer_id, m.imported, p.prompt_id, p.category, p.subcategory, p.tag, p.difficulty,
           p.eps_eligible
    FROM models m CROSS JOIN prompts p
),
current_images AS (
    SELECT model_id, prompt_id, state, reason, image_sha256 FROM images
    WHERE model_id IN (SELECT model_id FROM models WHERE NOT imported)
    QUALIFY row_number() OVER (PARTITION BY model_id, prompt_id ORDER BY ingested_at DESC, image_sha256) = 1
),
placed AS (
    SELECT g.*, i.state AS image_state, i.reason AS image_reason, i.image_sha256
    FROM grid g LEFT JOIN current_images i ON i.model_id = g.model_id AND i.prompt_id = g.prompt_id
),
latest AS (
    SELECT v.model_id, v.prompt_id, v.verdict, v.reason, v.judge, v.source
    FROM verdicts v JOIN placed p ON p.model_id = v.model_id AND p.prompt_id = v.prompt_id
    WHERE v.image_sha256 IS NULL OR v.image_sha256 = p.image_sha256
    QUALIFY row_number() OVER (PARTITION BY v.model_id, v.prompt_id ORDER BY v.decided_at DESC, v.verdict, v.judge) = 1
),
scored AS (
    SELECT DISTINCT h.model_id, h.prompt_id FROM hps_scores h JOIN models m ON m.model_id = h.model_id
    WHERE m.imported AND h.scorer_id = m.scorer_id
),
stated AS (
    SELECT p.*, l.verdict, l.reason AS verdict_reason, l.judge, l.source AS verdict_source,
        CASE WHEN NOT p.imported THEN coalesce(p.image_state, 'missing')
             WHEN s.prompt_id IS NOT NULL OR l.verdict IS NOT NULL THEN 'ok'
             ELSE 'missing' END AS state
    FROM placed p
    LEFT JOIN latest l ON l.model_id = p.model_id AND l.prompt_id = p.prompt_id
    LEFT JOIN scored s ON s.model_id = p.model_id AND s.prompt_id = p.prompt_id
)
SELECT model_id, prompt_id, category, subcategory, tag, difficulty, eps_eligible,
    state AS image_state,
    CASE WHEN state = 'quarantined' THEN image_reason END AS quarantine_reason,
    verdict, judge, verdict_source,
    CASE WHEN state <> 'ok' THEN 'FAIL' ELSE coalesce(verdict, 'NOT_JUDGED') END AS outcome,
    CASE WHEN state <> 'ok' THEN state || ' image'
         WHEN verdict IN ('PASS', 'FAIL') THEN 'judge'
         WHEN verdict IS NOT NULL THEN coalesce(verdict_reason, lower(verdict))
         ELSE 'no verdict yet' END AS why,
    (state <> 'ok' OR coalesce(verdict IN ('PASS', 'FAIL'), false)) AS decided,
    (state = 'ok' AND coalesce(verdict IN ('PASS', 'FAIL'), false)) AS judged
FROM stated
ORDER BY model_id, prompt_id
"""
