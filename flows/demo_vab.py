"""`make demo`'s small VAB run, the flow-running part: the demo sets (tasks.vab.demo_sets: graded
degradations with a known best and worst) imported as collection ``demo-graded``, judged by the
sharpness scorer and imagebench's HPSv3 (the demo's weights: UNCALIBRATED unless real ones are
configured) through the `vab-run` flow, then HPSv3 audited against the sets' labels. Then the
audit on sets *built from the lake* (``demo-suite``, tasks.vab.demo_sets.write_suite_labels), HPSv3
audited per category. Running the demo again re-imports nothing (same pinned content) and asks
nothing (answers cached by judge identity)."""

from __future__ import annotations

from typing import Any


def run_demo_vab(settings: Any, console: Any) -> dict:
    from flows.vab import vab_run_flow
    from tasks.lake.tables import Lake
    from tasks.vab.audit import audit, own_judges, write_audit
    from tasks.vab.demo_sets import DEMO_JUDGES, DEMO_SETS, SUITE_SETS, write_demo_sets, write_suite_labels
    from tasks.vab.sets import build_from_lake, import_manifest, load_sets
    from tasks.vab.tables import read_partition

    manifest = write_demo_sets(settings.home / "vab" / "demo-sets")
    import_manifest(settings, manifest, DEMO_SETS)
    summary = vab_run_flow(DEMO_SETS, DEMO_JUDGES, n_resamples=500)
    _, notes = own_judges(settings)
    tasks = load_sets(settings, DEMO_SETS)
    rows = audit(tasks, read_partition(Lake(settings.lake_dir), "vab_trials", DEMO_SETS), ["hpsv3"], n_resamples=500)
    write_audit(settings, DEMO_SETS, rows, notes)
    # the audit proper: imagebench's HPSv3 on sets built from the suite's images, per category
    build_from_lake(settings, write_suite_labels(settings, settings.home / "vab" / "demo-suite-labels.csv"), SUITE_SETS)
    suite_run = vab_run_flow(SUITE_SETS, ["hpsv3"], n_resamples=500)
    suite_tasks = load_sets(settings, SUITE_SETS)
    write_audit(settings, SUITE_SETS, audit(suite_tasks, read_partition(Lake(settings.lake_dir), "vab_trials", SUITE_SETS),
                                            ["hpsv3"], n_resamples=500), notes)
    line = ", ".join(f"{j} {m['strict_both']:.0f}%" + (" (UNCALIBRATED demo weights)" if m.get("uncalibrated") else "")
                     for j, m in summary["judges"].items())
    console.print(f"VAB demo run on {DEMO_SETS} ({summary['tasks']} sets of graded degradations), strict best-and-worst: "
                  f"{line}. `imagebench vab leaderboard --sets {DEMO_SETS}`, its page report/vab/{DEMO_SETS}.html",
                  highlight=False)
    console.print(f"VAB audit of HPSv3 on {suite_run['tasks']} sets built from the suite (one prompt per category): "
                  f"`imagebench vab audit --sets {SUITE_SETS} --no-rerun`, report/vab/{SUITE_SETS}.html", highlight=False)
    return summary
