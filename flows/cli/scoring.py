"""`imagebench ingest|score|backfill|nightly|hpsv3|compare|breakdown|report|leaderboard|runs|sql|catalog|serve|demo`:
the scoring commands (ARCHITECTURE.md section 7), registered on the app by flows/cli/__init__.py.
`backfill` and `serve` are production mode too: a run of a deployment on a Prefect server.

Heavy packages (torch, transformers, Prefect, Great Expectations) are imported inside the
commands that need them, so `sql` and `leaderboard` answer in about a second.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    SCORING_PRELOAD, CliError, OutputFormat, catalog_or_exit, cli_settings, err, nightly_line, precheck, prepare_prefect,
    print_quarantine, print_rows, progress, publish_outside, render, render_fitted, scoring_preload, user_errors,
    warn_uncalibrated,
)
from schemas.settings import Settings


def ingest(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    source: Annotated[Optional[str], typer.Option(help="object store URI (s3://bucket/prefix or a directory)")] = None,
) -> None:
    """Validate and record one model's images (quarantining bad ones); no scoring."""
    with user_errors():
        settings = cli_settings()
        if source:
            settings = settings.model_copy(update={"store": source})
        from tasks.runs import pinned, units_aggregate, units_ingest

        suite = pinned.load_pinned_suite(settings)
        with progress():
            summary = units_ingest.ingest_and_publish(settings, suite, model)
        units_aggregate.refresh(settings, suite)
        print_rows([summary.__dict__], OutputFormat.table, f"ingest {model}")
        print_quarantine(settings, [model], err)


def score(
    model: Annotated[str, typer.Option("--model", "-m", help="model id to score now (also the backfill path)")],
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score one model now: ingest, HPSv3 and the routed judges side by side, EPS/Capability/Overall."""
    with user_errors():
        settings = cli_settings()
        precheck(settings, model, objects=scorer is None)
        prepare_prefect(settings, preload=scoring_preload(scorer is not None))
        from flows.pipeline import score_model_flow

        with progress():
            row = score_model_flow(model, scorer_name=scorer, rejudge=rejudge)
        print_rows([row], fmt, f"score {model}")
        print_quarantine(settings, [model], err)
        warn_uncalibrated(row["uncalibrated"], fmt)


def nightly(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score every model in the store not yet scored against the current suite, reference and
    scorer; for unchanged models, request only verdicts still missing."""
    with user_errors():
        settings = cli_settings()
        precheck(settings)
        prepare_prefect(settings, preload=SCORING_PRELOAD)
        from flows.pipeline import nightly_flow

        with progress():
            summary = nightly_flow(rejudge=rejudge)
        from flows.cli.common import nightly_line

        err.print(nightly_line(summary), highlight=False)
        for model_id, detail in summary["invalid"].items():  # no model of the suite: one line each, the run goes on
            from rich.markup import escape

            err.print(f"[yellow]skipped {escape(repr(model_id))}: {escape(detail)}[/]", highlight=False, soft_wrap=True)
        print_rows(summary["rows"], fmt, "nightly")
        print_quarantine(settings, summary["scored"] + summary["unchanged"], err)
        warn_uncalibrated(any(r["uncalibrated"] for r in summary["rows"]), fmt)


class Rotary(str, Enum):
    """HPSv3 rotary arithmetic (docs/HPSV3.md)."""

    official = "official"
    float32 = "float32"


def hpsv3(
    pairs: Annotated[Path, typer.Option(help="CSV with columns image,prompt (image paths relative to the CSV's folder)")],
    base_model: Annotated[Optional[str], typer.Option(help="HF id or local dir with config/tokenizer/processor")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="HPSv3.safetensors path or HF repo id")] = None,
    device: Annotated[str, typer.Option(help="auto|cpu|cuda")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto|float32|bfloat16")] = "auto",
    rotary: Annotated[
        Optional[Rotary],
        typer.Option(help="official (bf16-rounded, as trained) or float32; default: IMAGEBENCH_HPSV3_ROTARY, else official"),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.csv,
) -> None:
    """Ad-hoc HPSv3 scoring: one output row (mu, sigma) per input pair, in input order."""
    with user_errors():
        settings = cli_settings()
        from tasks.store.adhoc import read_pairs

        images, prompts = read_pairs(pairs)
        from tasks.hpsv3.scorer import HPSv3Scorer

        scorer = HPSv3Scorer.load(
            base_model or settings.hpsv3_base_model,
            checkpoint or settings.hpsv3_checkpoint,
            device=device,
            dtype=dtype,
            rotary=rotary.value if rotary is not None else settings.hpsv3_rotary,
            preprocess_workers=settings.hpsv3_preprocess_workers,
        )
        with progress():
            from tasks.runs import progress as hooks

            hooks.advance("hpsv3", len(images), 0)
            result = scorer.score(images, prompts, batch_size=batch_size, progress=lambda n: hooks.advance("hpsv3", len(images), n))
        rows = [
            [str(img), prompt, float(mu), float(sigma)]
            for img, prompt, (mu, sigma) in zip(images, prompts, result.tolist())
        ]
        render(["image", "prompt", "mu", "sigma"], rows, fmt, title="HPSv3")
        warn_uncalibrated(scorer.identity.uncalibrated, fmt)


AXES = ("overall", "capability", "eps")


def compare(
    model_a: Annotated[str, typer.Argument(metavar="A")],
    model_b: Annotated[str, typer.Argument(metavar="B")],
    axis: Annotated[str, typer.Option(help="overall, capability or eps")] = "overall",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Paired difference A - B with its 95% interval (from both leaderboard intervals) and P(A beats B)."""
    with user_errors():
        if axis not in AXES:
            raise CliError(f"--axis {axis!r}: choose one of {', '.join(AXES)}")
        from tasks.store.storage import validate_model_id

        for m in (model_a, model_b):  # before anything reads a path or a table named after them
            validate_model_id(m)
        settings = cli_settings()
        from tasks.runs.models import require_known

        for m in (model_a, model_b):
            require_known(settings, m)  # an unknown id: exit 1, nearest ids named
        from tasks.scores import stats
        from tasks.runs import pinned
        from tasks.lake.views import model_prompts, paired_vectors

        suite = pinned.load_pinned_suite(settings)
        reference = pinned.load_verified_reference(settings, suite, None)
        values = {}
        for m in (model_a, model_b):
            views = model_prompts(settings, suite, reference, m)
            if all(v.state == "missing" and v.mu is None for v in views):
                raise CliError(f"model {m!r} has no results under reference {reference.version}")
            values[m] = paired_vectors(views, suite, reference)
        eligible = [p.eps_eligible for p in suite.prompts]
        pick = {"capability": lambda v: v[0], "eps": lambda v: v[1], "overall": lambda v: v}[axis]
        result = stats.compare(
            pick(values[model_a]), pick(values[model_b]), axis=axis, eligible=eligible,
            n_resamples=settings.bootstrap_resamples,
        )
        render(
            ["a", "b", "axis", "difference", "ci_lo", "ci_hi", "p_a_beats_b", "n_resamples"],
            [[model_a, model_b, axis, result.diff, result.ci[0], result.ci[1], result.p_a_beats_b, result.n_resamples]],
            fmt,
            title=f"{model_a} vs {model_b} ({axis}, paired over prompts)",
        )
        warn_uncalibrated(axis != "capability" and reference.scorer.uncalibrated, fmt)  # EPS from demo weights


def breakdown(
    model: Annotated[str, typer.Option("--model", "-m", help="model id")],
    by: Annotated[str, typer.Option(help="category, subcategory, tag or difficulty")] = "category",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Capability (PASS / decided; a missing or quarantined image is a FAIL) and EPS of one model
    per category, subcategory, tag or difficulty; the table's last row is the model's total."""
    with user_errors():
        if by not in BREAKDOWN_GROUPS:
            raise CliError(f"--by {by!r}: choose {', '.join(BREAKDOWN_GROUPS[:-1])} or {BREAKDOWN_GROUPS[-1]}")
        from tasks.store.storage import validate_model_id

        validate_model_id(model)  # before anything reads a path or a table named after it
        settings = cli_settings()
        from tasks.runs.models import require_known

        require_known(settings, model)  # an unknown id: exit 1, nearest ids named
        columns, rows, total, uncalibrated = breakdown_rows(settings, model, by)
        # The total (= the leaderboard's Capability) as a row of the table; csv/json carry the groups.
        render(columns, rows + ([total] if fmt is OutputFormat.table else []), fmt, title=f"{model} by {by}")
        warn_uncalibrated(uncalibrated, fmt)


def report(
    out: Annotated[Path, typer.Option("--out", help="output folder for the static site")] = Path("report"),
) -> None:
    """Write the static site: the leaderboard (sortable table, Capability-vs-EPS scatter, heatmaps,
    model pages) when models were scored, every Beauty Index study, the pooled view and VAB pages."""
    with user_errors():
        settings = cli_settings()
        catalog_or_exit(settings)
        from tasks.report.site import build_site  # a workspace of studies only needs no EPS reference

        site = build_site(settings, out)
        publish_outside(settings, out)
        err.print(f"[green]report written:[/] {site.index}  ({site.models} models, {site.studies} studies, {site.vab} VAB "
                  f"collections; open it, or `python -m http.server -d {out}`)", highlight=False, soft_wrap=True)
        if site.leaderboard_note:
            err.print(f"[yellow]{site.leaderboard_note}[/]", highlight=False, soft_wrap=True)


LEADERBOARD_SORTS = ("overall", "capability", "eps", "rank", "model_id", "judged", "coverage", "eps_prompts_lost", "scored_at")


def leaderboard(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    sort: Annotated[str, typer.Option(help=f"one of {', '.join(LEADERBOARD_SORTS)}; rank: by best place")] = "overall",
    wide: Annotated[bool, typer.Option("--wide", help="every column of the table, at full width (without it the "
                                                      "table fits 100 columns)")] = False,
) -> None:
    """The leaderboard of the reference in force: Overall, Capability, EPS with 95% intervals,
    rank bands, prompts judged and flags (one row per model), best Overall first."""
    with user_errors(log=False):
        if sort not in LEADERBOARD_SORTS:
            raise CliError(f"--sort {sort!r}: choose one of {', '.join(LEADERBOARD_SORTS)}")
        settings = cli_settings()
        from tasks.lake.tables import query
        from tasks.scores.display import leaderboard_flags, leaderboard_layouts

        order = "ASC" if sort in ("model_id", "rank") else "DESC"
        # The default is the headline (Overall; EPS for a model not judged yet), as the arenas list
        # theirs, with the band beside it: a wide interval's best place (band 1-6) never puts a
        # model above a better-scored one (issue 26 item 5). `--sort rank` orders by best place.
        sort = f"lb.{sort} {order} NULLS LAST" + (", lb.overall DESC NULLS LAST, lb.eps DESC" if sort == "rank" else "")
        sort += ", lb.eps DESC NULLS LAST" if sort.startswith("lb.overall ") else ""
        columns, rows = query(catalog_or_exit(settings), f"SELECT * FROM leaderboard lb ORDER BY {sort}, lb.model_id")
        records = [dict(zip(columns, r)) for r in rows]
        if fmt is OutputFormat.table:
            # What a reader compares, in the one number style, one line per model (issue 26 item 7);
            # csv/json carry every column at full precision.
            render_fitted(leaderboard_layouts(records, wide), title="imagebench leaderboard", wide=wide)
        else:
            render(columns, rows, fmt, title="imagebench leaderboard")
        warn_uncalibrated(any(r["uncalibrated"] for r in records), fmt)
        if fmt is OutputFormat.table and any("incomplete" in leaderboard_flags(r) for r in records):
            err.print("[yellow]incomplete (complete = false): missing or quarantined images counted as losses[/]")


def runs(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="how many runs, newest first")] = 10,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The latest run records: what each run discovered, scored, found up to date, skipped and
    errored, and how long each stage took (every column with --format json|csv)."""
    with user_errors():
        settings = cli_settings()
        from flows.cli.common import runs_table
        from tasks.lake.tables import Lake
        from tasks.runs.state import settle_crashed

        settle_crashed(settings.home, settings.lake_dir)  # a running record whose process is gone: crashed
        table = Lake(settings.lake_dir).read_runs().sort_by([("started_at", "descending")]).slice(0, limit)
        if fmt is OutputFormat.table:
            records = table.to_pylist()
            names, rows = runs_table(records)
        else:
            names = table.column_names
            rows = [tuple(r[c] for c in names) for r in table.to_pylist()]
        render(names, rows, fmt, title="imagebench runs")
        if fmt is OutputFormat.table and any(r["status"] in ("failed", "crashed") for r in records):
            err.print("[red]failed or crashed runs: see their error (imagebench runs --format json)[/]")


def sql(
    query_text: Annotated[str, typer.Argument(metavar="QUERY", help="SQL over the catalog's views (read-only)")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Run a read-only SQL query on the DuckDB catalog."""
    with user_errors(log=False):
        settings = cli_settings()
        # tasks.lake.tables.query refuses anything but queries (EXPLAIN ANALYZE of a write included),
        # parsing on the read-only connection, which has no file access.
        from tasks.lake.tables import query

        columns, rows = query(catalog_or_exit(settings), query_text)
        render(columns, rows, fmt)


def catalog(
    full: Annotated[bool, typer.Option("--full", help="rebuild the compacted copy from every per-model file, not only what changed")] = False,
) -> None:
    """Rebuild the DuckDB catalog file from the lake."""
    with user_errors():
        settings = cli_settings()
        from tasks.runs import pinned, units_aggregate
        from tasks.lake.tables import refresh_catalog

        suite = pinned.load_pinned_suite(settings)
        if full:
            refresh_catalog(settings.lake_dir, settings.catalog_path, suite, settings.reference_version, full=True)
            path = settings.catalog_path
        else:
            path = units_aggregate.refresh(settings, suite)
        err.print(f"catalog written: {path}")


# ---- breakdown: one model's Capability and EPS per group (tasks/scores/breakdown.py) ------------

BREAKDOWN_GROUPS = ("category", "subcategory", "tag", "difficulty")
BREAKDOWN_COLUMNS = ("capability", "pass", "fail", "fail_no_image", "undecided", "decided", "judged", "prompts",
                     "coverage", "eps", "eps_prompts")


def breakdown_rows(settings: Settings, model: str, by: str) -> tuple[list[str], list[list], list, bool]:
    """(columns, one row per group, the total row, whether its EPS comes from uncalibrated demo
    weights). ``fail`` counts every FAIL the headline counts: those of a judge and the missing or
    quarantined images (``fail_no_image``, FAIL by rule)."""
    from tasks.runs import pinned
    from tasks.scores.breakdown import capability_by_group, group_eps
    from tasks.lake.views import model_prompts, paired_vectors

    suite = pinned.load_pinned_suite(settings)
    reference = pinned.load_verified_reference(settings, suite, None)
    views = model_prompts(settings, suite, reference, model)
    verdicts, contributions = paired_vectors(views, suite, reference)
    groups = [getattr(p, by) for p in suite.prompts]
    per_group, total = capability_by_group([v.state for v in views], verdicts, groups)
    scored = [v.mu is not None for v in views]

    def row(g, members: list[int]) -> list:
        elig = [i for i in members if suite.prompts[i].eps_eligible]
        eps = group_eps(contributions, scored, elig)  # None: no eligible prompt of the group scored
        return [g.group, g.capability, g.passed, g.failed, g.failed_no_image, g.undecided, g.decided, g.judged,
                g.prompts, g.coverage, eps, len(elig)]

    rows = [row(g, [i for i, x in enumerate(groups) if x == g.group]) for g in per_group]
    return [by, *BREAKDOWN_COLUMNS], rows, row(total, list(range(len(groups)))), bool(reference.scorer.uncalibrated)


def demo() -> None:
    """Seed demo models, build a demo reference, run the nightly flow, print the leaderboard."""
    with user_errors():
        from flows.demo import print_next_steps, run_demo

        run_demo(err, progress, nightly_line)
        leaderboard(fmt=OutputFormat.table, sort="overall")
        print_next_steps(err)  # the exact commands to paste: `make demo` cannot put .venv/bin on PATH


# ---- production mode: backfill and serve on a Prefect server (issue 15, item 8) ------------------
#
# `backfill` is a run of the `score-model/backfill` deployment on a Prefect server (PREFECT_API_URL,
# or the local server of `make serve`), else runs in this process. A model id the store has no
# objects for is refused before any flow run exists, with the message the in-process path gives: a
# typo never becomes a run that fails on the server 20 s later.

def backfill(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    suite_version: Annotated[Optional[str], typer.Option(help="prompt suite version (default: the configured one)")] = None,
    reference_version: Annotated[
        Optional[str], typer.Option(help="frozen EPS reference version (default: the configured one)")
    ] = None,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="on a server: wait for the run's end, print its scores")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="run in this process even when a server is configured")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Backfill one model: a run of deployment score-model/backfill on the Prefect server
    (production mode: PREFECT_API_URL set, or `make serve` running), else in this process."""
    with user_errors():
        from schemas.settings import VERSION_RE
        from tasks.store.storage import validate_model_id

        validate_model_id(model)
        for flag, value in (("--suite-version", suite_version), ("--reference-version", reference_version)):
            if value is not None and not VERSION_RE.fullmatch(value):
                raise CliError(f"{flag} {value!r} is not a valid version name (letters, digits, '.', '_', '-')")
        settings = cli_settings()
        prepare_prefect(settings)
        api_url, source = (None, "") if local else server_api_url(settings)
        parameters = {"model_id": model, "rejudge": rejudge}
        parameters.update({k: v for k, v in (("suite_version", suite_version), ("reference_version", reference_version),
                                             ("scorer_name", scorer)) if v is not None})
        if api_url:
            backfill_on_server(settings, api_url, source, parameters, wait, fmt)
            return
        why = "--local" if local else "embedded mode: no Prefect server configured (PREFECT_API_URL unset, `make serve` not running)"
        precheck(settings.model_copy(update={k: v for k, v in (
            ("suite_version", suite_version), ("reference_version", reference_version)) if v}),
            model, objects=scorer is None)
        err.print(f"{why}: running score-model in this process", highlight=False, soft_wrap=True)
        from flows.pipeline import score_model_flow

        with progress():
            row = score_model_flow(**parameters)
        print_rows([row], fmt, f"backfill {model}")
        print_quarantine(settings, [model], err)
        warn_uncalibrated(row["uncalibrated"], fmt)


def serve(
    local_server: Annotated[
        bool,
        typer.Option(
            "--local-server",
            help="first start a real Prefect server on 127.0.0.1 (port IMAGEBENCH_PREFECT_PORT, default 4200; "
            "home $IMAGEBENCH_HOME/prefect-server), serve against it, stop it on exit (`make serve`)",
        ),
    ] = False,
    port: Annotated[Optional[int], typer.Option(help="--local-server port (default IMAGEBENCH_PREFECT_PORT or 4200)")] = None,
    workers: Annotated[
        bool,
        typer.Option(
            "--workers",
            help="with --local-server: register prefect.yaml's deployments for its work pool (created if missing) "
            "instead of serving them from this process, and print how to start a worker (`imagebench deploy`)",
        ),
    ] = False,
) -> None:
    """Serve the nightly deployment (cron schedule) and backfills: on the configured Prefect API, or
    with --local-server on a local Prefect server started (and stopped) by this command."""
    with user_errors():
        settings = cli_settings()
        if workers and not local_server:
            raise CliError("--workers goes with --local-server; for a Prefect server of your own (PREFECT_API_URL), "
                           "`imagebench deploy` registers the deployments for its workers")
        if not local_server:
            prepare_prefect(settings, quiet=False)  # a server's console shows its runs' errors
            url = os.environ.get("PREFECT_API_URL")
            err.print(
                f"serving on the Prefect API at {url}" if url else
                "serving on the embedded Prefect API (no UI; `make serve` starts a real local server)",
                highlight=False, soft_wrap=True,
            )
            if not url:  # the flow runs it starts use its API, on the port it bound (flows/env.py)
                from flows.env import share_embedded_api

                share_embedded_api()
            from flows.deployments import serve_deployments

            serve_deployments()
            return
        _serve_with_local_server(settings, port, workers)


def _serve_with_local_server(settings: Settings, port: int | None, workers: bool = False) -> None:
    """`imagebench serve --local-server`: a real Prefect server child process, the deployments served
    against it from this process, both stopped on Ctrl-C / SIGTERM (the server last). With
    ``workers``, the deployments are prefect.yaml's, registered for its work pool (flows/production.py),
    and this process only keeps the server until it is stopped."""
    import signal
    import threading
    import time

    from flows.server import LocalServer, protect_clients, server_home

    port = port or settings.prefect_port
    server = LocalServer(host="127.0.0.1", port=port, home=server_home(settings.home).resolve())
    configured = os.environ.get("PREFECT_API_URL")
    if configured and configured.rstrip("/") != server.api_url:
        # Decision (docs/OPERATIONS.md): the explicit flag wins over the environment.
        err.print(
            f"[yellow]PREFECT_API_URL={configured} is set, but --local-server serves on the local server it "
            f"starts ({server.api_url}); run plain `imagebench serve` to serve on {configured}[/]",
            highlight=False, soft_wrap=True,
        )
    # Before the first `import prefect` of this process: the client, and every flow run the runner
    # starts, talk to this server and keep their state beside it.
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_HOME"] = str(server.home)
    protect_clients(server.home)  # its secret, for this process and the flow runs it starts
    prepare_prefect(settings, quiet=False)  # a server's console shows its runs' errors

    stopping, died = threading.Event(), threading.Event()

    def _terminate(signum, _frame):  # until Prefect's runner installs its own handler
        stopping.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        err.print(f"starting a Prefect server on {server.url} (home {server.home}, log {server.log_path}) ...",
                  highlight=False, soft_wrap=True)
        server.start(wait=False)
        # Imported while the server starts (its first start migrates its database).
        from prefect.runner import Runner
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.deployments import nightly_cron, nightly_timezone, serve_deployments

        server.wait_healthy()
        err.print(f"[green]Prefect server ready[/] in {server.started_in_s:.0f} s", highlight=False, soft_wrap=True)
        # Prefect pauses the served schedules on shutdown (the next `serve` resumes them).
        runner = None if workers else Runner(pause_on_shutdown=True)

        def _watch() -> None:  # a server that dies takes `serve` down with it, loudly and at once
            while not stopping.wait(2.0):
                if not server.running():
                    died.set()
                    if runner is not None:
                        runner.pause_on_shutdown = False  # nothing left to pause
                    err.print(f"[bold red]error:[/] the Prefect server exited ({server.process.returncode}); "
                              f"{server.log_path} ends with:", highlight=False, soft_wrap=True)
                    err.print(server.log_tail(), markup=False, highlight=False)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=_watch, name="imagebench-server-watch", daemon=True).start()
        from rich.markup import escape

        from flows.apiauth import AUTH_FILE
        from flows.production import Server, deploy_for_workers, ui_login_line, worker_commands

        target = Server(server.api_url, "the local server this command started", server.home / AUTH_FILE)
        if workers:
            pool = deploy_for_workers(settings, target, lambda line: err.print(escape(line), highlight=False,
                                                                               soft_wrap=True), check_served=False)
            runs = (f"  runs:      on the work pool {pool!r}: start a worker (another terminal, or each machine's checkout):\n"
                    + "".join(f"               {escape(line)}\n" for line in worker_commands(target, pool)))
        else:
            runs = f"  nightly:   nightly/nightly, cron '{nightly_cron()}' in {nightly_timezone()}\n"
        err.print(
            f"\n[bold]imagebench production mode[/]\n"
            f"  UI:        {server.ui_url}\n"
            f"  UI login:  {escape(ui_login_line(target.auth_file))}\n"
            f"  API:       {server.api_url}\n"
            f"{runs}"
            f"  backfill:  imagebench backfill --model M [--rejudge] [--wait]   (another terminal, same IMAGEBENCH_HOME)\n"
            f"             or the UI: {server.ui_url}/deployments -> score-model/backfill -> Run\n"
            f"  stop:      Ctrl-C (stops {'the server; stop the workers too' if workers else 'the deployments, then the server'})\n",
            highlight=False, soft_wrap=True,
        )
        if workers:
            while True:  # until Ctrl-C / SIGTERM (_terminate) or the server's death (_watch)
                time.sleep(3600)
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            serve_deployments(runner=runner)
    except KeyboardInterrupt:
        pass
    except Exception:
        if not died.is_set():
            raise
        # The runner's shutdown could not reach the dead server: already reported above.
    finally:
        stopping.set()
        signal.signal(signal.SIGTERM, previous)
        if server.process is not None:
            err.print(f"stopping the Prefect server on {server.url} ...", highlight=False, soft_wrap=True)
            server.stop()
            err.print("Prefect server stopped", highlight=False, soft_wrap=True)
    if died.is_set():
        raise typer.Exit(1)


# ---- backfill on a Prefect server -----------------------------------------------------------------

# "<flow name>/<deployment name>" of flows/deployments.py (not imported here: it loads the flows).
BACKFILL_DEPLOYMENT = "score-model/backfill"
BACKFILL_POLL_S = 2.0


def server_api_url(settings: Settings) -> tuple[str | None, str]:
    """The Prefect API a backfill goes to, and where that came from; (None, "") in embedded mode
    (flows/production.py ``find_server``: PREFECT_API_URL, else the local server of `make serve`)."""
    from rich.markup import escape

    from flows.production import find_server

    # A file whose port is not held by the `serve` that wrote it (killed with -9, the port then
    # anyone's) is removed, said in one line, and never sent a request (flows/server.py).
    server = find_server(settings, say=lambda line: err.print(f"[yellow]{escape(line)}[/]", highlight=False,
                                                               soft_wrap=True))
    return (server.api_url, server.source) if server else (None, "")


def _flow_run_url(flow_run) -> str | None:
    from prefect.utilities.urls import url_for

    try:
        return url_for(flow_run)
    except Exception:  # no UI URL known for this API
        return None


def _scores_of_run(settings: Settings, model: str, run_id: str, started) -> list[dict]:
    """The model_scores row the run wrote, when this machine sees the same lake."""
    from tasks.lake.tables import Lake

    try:
        rows = Lake(settings.lake_dir).read("model_scores", [model]).to_pylist()
    except Exception:
        return []
    mine = [r for r in rows if r.get("run_id") == run_id]
    if not mine and started is not None:
        mine = [r for r in rows if r["scored_at"] >= started]
    return sorted(mine, key=lambda r: r["scored_at"])[-1:]


def _run_artifacts(client, flow_run_id) -> list[str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    try:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    except Exception:
        return []
    return [str(a.data) for a in arts if a.type == "markdown" and a.data]


def backfill_on_server(
    settings: Settings, api_url: str, source: str, parameters: dict, wait: bool, fmt: OutputFormat
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    model = parameters["model_id"]
    hint = "start the server and the deployments first (`make serve`), or run in this process with --local"
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
        if problem is not None:
            raise CliError(f"cannot reach the Prefect API at {api_url} (from {source}): {problem}; {hint}")
        try:
            deployment = client.read_deployment_by_name(BACKFILL_DEPLOYMENT)
        except ObjectNotFound:
            raise CliError(
                f"no deployment {BACKFILL_DEPLOYMENT!r} on the Prefect server at {api_url}: {hint} "
                "(or register prefect.yaml's deployments for GPU workers: docs/OPERATIONS.md)"
            ) from None
        if "scorer_name" not in parameters:  # imported scores: nothing in the store to look for
            refuse_unknown_model(settings, model)  # before a run exists
        err.print(f"production mode: Prefect server at {api_url} (from {source})", highlight=False, soft_wrap=True)
        flow_run = run_deployment(BACKFILL_DEPLOYMENT, parameters=parameters, timeout=0, as_subflow=False,
                                  tags=["backfill"])
        url = _flow_run_url(flow_run)
        err.print(
            f"backfill of {model}: flow run {flow_run.name} ({flow_run.id}) of {BACKFILL_DEPLOYMENT} created"
            + (f"\n  {url}" if url else ""), highlight=False, soft_wrap=True,
        )
        status = getattr(deployment, "status", None)
        if status is not None and str(getattr(status, "value", status)).upper() == "NOT_READY":
            err.print(
                f"[yellow]nothing is polling {BACKFILL_DEPLOYMENT} right now (no `imagebench serve` or worker): "
                "the run waits, Scheduled, until one starts[/]"
            )
        if not wait:
            err.print(f"not waiting (--wait waits and prints the scores): prefect flow-run inspect {flow_run.id}",
                      highlight=False, soft_wrap=True)
            return
        import time

        from flows.production import LOCAL_SERVER_SOURCE
        from flows.server import recorded_server_problem

        local_server = source.startswith(LOCAL_SERVER_SOURCE)  # where find_server found it
        seen = None
        try:
            while True:
                # The local server of `make serve` may stop while we wait, and its port be taken by
                # someone else: checked again before each request that carries its secret.
                problem = recorded_server_problem(settings.home) if local_server else None
                if problem is not None:
                    raise CliError(f"stopped waiting for flow run {flow_run.id}: {problem}; nothing more was sent there")
                flow_run = client.read_flow_run(flow_run.id)
                state = flow_run.state
                if state is not None and state.name != seen:
                    seen = state.name
                    err.print(f"  {model}: {state.name}", highlight=False, soft_wrap=True)
                if state is not None and state.is_final():
                    break
                time.sleep(BACKFILL_POLL_S)
        except KeyboardInterrupt:
            err.print(f"[yellow]stopped waiting; flow run {flow_run.id} goes on on the server[/]" + (f": {url}" if url else ""))
            raise typer.Exit(130) from None
        if not state.is_completed():
            raise CliError(f"backfill of {model} ended {state.name}: {state.message or 'no message'}"
                           + (f" ({url})" if url else ""))
        rows = _scores_of_run(settings, model, str(flow_run.id), flow_run.start_time)
        if rows:
            print_rows(rows, fmt, f"backfill {model}")
            warn_uncalibrated(bool(rows[0].get("uncalibrated")), fmt)
        else:
            err.print(f"completed; the scores are in the lake of the machine that ran it (not {settings.lake_dir}):")
            for text in _run_artifacts(client, flow_run.id):
                err.print(text, markup=False, highlight=False, soft_wrap=True)


def refuse_unknown_model(settings: Settings, model: str) -> None:
    """What the in-process path refuses first (tasks.runs.models.require_objects: exit 1, the store and
    prefix searched, the nearest ids), checked from here before a run is created. A store this
    machine cannot list (a worker's bucket, other credentials) is said, and left to the run."""
    from tasks.lake.tables import Lake
    from tasks.runs.models import check_model_folder
    from tasks.store.storage import StoreError
    from tasks.runs.units_ingest import open_configured_store

    try:
        store = open_configured_store(settings)
        store.list_model_objects(model)
    except (StoreError, OSError) as exc:
        err.print(f"[yellow]store {settings.store_uri} cannot be listed from here ({type(exc).__name__}: "
                  f"{exc}): model {model!r} is checked where the run runs[/]", highlight=False, soft_wrap=True)
        return
    check_model_folder(store, Lake(settings.lake_dir), model, settings.suite_version, settings.reference_dir)
