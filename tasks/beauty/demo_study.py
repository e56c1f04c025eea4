"""`make demo`'s Beauty Index study: four demo tools, the published panel shape, SIMULATED answers.

The study's images (the demo photos, degraded as each demo model does, for the 10 prompts of
``beauty-index-v1``) go to the demo's store at the Beauty Index's place,
``beauty/beauty-index-v1/<tool>/`` (docs/STORAGE.md), beside the demo models' ``models/<model>/``:
the two suites share no prompt, so a tool that is also a model has images of its own for each. A
demo workspace of before issue 26 item 2 kept them in a store of their own, ``<home>/study-objects``,
under ``models/``: its study, already opened, never reads them again. The study is opened for real (ingest, blinding, pre-registration,
per-judge orders), then filled with SIMULATED answers (tasks/beauty/simulate.py), analysed by the
`study-analyze` flow (flows/demo_beauty.py) and given its page in the report. A second run changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from schemas.study import PUBLISHED_GROUP_SIZES, AnalysisSettings, JudgeSpec, StudyDefinition

DEMO_STUDY_ID = "demo-beauty"
DEMO_STUDY_TOOLS = ("demo-pristine", "demo-jpeg-q10", "demo-blur-r3", "demo-noise-s40")
# Fewer resamples than a real study's default (2000): the demo shows the pipeline in seconds.
DEMO_ANALYSIS = AnalysisSettings(bootstrap_resamples=200, permutations=500)
DEMO_MIXED_RESAMPLES = 10  # H3's mixed-model refits (a real study: the analysis default)


def demo_definition() -> StudyDefinition:
    judges = [JudgeSpec(label=f"{g}-{i:02d}", group=g) for g, n in PUBLISHED_GROUP_SIZES.items() for i in range(1, n + 1)]
    return StudyDefinition(
        study_id=DEMO_STUDY_ID, title="Beauty Index demo study (SIMULATED answers)", tools=list(DEMO_STUDY_TOOLS),
        host_tool="demo-blur-r3", praised_for_aesthetics=["demo-pristine"], judges=judges, memo=False,
        analysis=DEMO_ANALYSIS, simulated=True,
    )


def fill_demo_study(settings, console) -> bool:
    """Open the demo study and fill it with SIMULATED answers (each step once). Returns False when
    an earlier run already analysed it (nothing done), True when the answers are ready for the
    `study-analyze` flow (flows/demo_beauty.py runs it)."""
    from tasks.beauty.simulate import record_simulated_answers
    from tasks.beauty.study import STUDY_FILE, open_study, study_dir
    from tasks.beauty.suite import load_beauty_suite
    from tasks.beauty.tables import read_study_partition
    from tasks.store.demo import DEMO_PHOTOS, CONTENDERS, create_local_root, load_photo, render_model
    from tasks.lake.tables import Lake
    from tasks.scores.reference import pin_suite

    lake = Lake(settings.lake_dir)
    if read_study_partition(lake, "study_index", DEMO_STUDY_ID).num_rows:
        console.print(f"demo study {DEMO_STUDY_ID}: already analysed (SIMULATED answers)")
        return False
    shipped = Path(__file__).resolve().parents[2] / "reference"
    suite_file = settings.reference_dir / "suite-beauty-index-v1.jsonl"
    if not suite_file.exists():
        suite_file.write_bytes((shipped / suite_file.name).read_bytes())
    pin_suite(settings.reference_dir, suite_file)
    suite = load_beauty_suite(settings.reference_dir)

    from tasks.runs.units_ingest import open_configured_store
    from tasks.store.storage import MODELS_PREFIX, beauty_root

    store = open_configured_store(settings)
    create_local_root(store)  # no "does not exist: treating it as empty" on a first demo
    place = beauty_root(suite.version)
    have = set(store.list_models(place))
    photos = [load_photo(name) for name in DEMO_PHOTOS]
    for model in (m for m in CONTENDERS if m.model_id in DEMO_STUDY_TOOLS and m.model_id not in have):
        for key, data in render_model(model, [(p.prompt_id, p.prompt) for p in suite.prompts], photos).items():
            store.write(place + key.removeprefix(MODELS_PREFIX), data)  # render_model names models/<id>/<prompt>

    d = study_dir(settings, DEMO_STUDY_ID)
    if not (d / STUDY_FILE).exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / STUDY_FILE).write_text("# make demo's study: every answer is SIMULATED (docs/BEAUTY.md)\n"
                                    + yaml.safe_dump(demo_definition().model_dump(mode="json"), sort_keys=False))
    from tasks.beauty.sources import has_panel_store, load_study_context

    if not has_panel_store(load_study_context(settings, DEMO_STUDY_ID)):
        opened = open_study(settings, DEMO_STUDY_ID)  # the links are not shown: nobody judges a demo
        console.print(f"demo study {DEMO_STUDY_ID}: opened ({opened.n_images} blinded images, pre-registered)")
    n = record_simulated_answers(settings, DEMO_STUDY_ID)
    console.print(f"demo study {DEMO_STUDY_ID}: {n} [bold yellow]SIMULATED[/] answers recorded")
    return True
