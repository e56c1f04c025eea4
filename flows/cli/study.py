"""`imagebench study ...`: a Beauty Index study's life (docs/BEAUTY.md): init, open, status, close.

A typer sub-app added by flows/cli/__init__.py (ARCHITECTURE.md section 7: one file per area), with
the publishing commands (analyze, leaderboard, hypotheses, import-answers, export, import-bundle)
below. The logic lives in tasks/beauty/; nothing heavy is imported here (no torch, Prefect or GX).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    CliError, OutputFormat, catalog_or_exit, cli_settings, err, prepare_prefect, publish_outside, render, user_errors,
)

study_app = typer.Typer(help="Beauty Index studies: init, open (blind + pre-register + links), status, close.",
                        no_args_is_help=True)

DEFAULT_URL = "http://127.0.0.1:8765"


@study_app.command("init")
def study_init(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    tools: Annotated[Optional[str], typer.Option(help="comma-separated tool ids (default: every tool in the store's beauty/beauty-index-v1/<tool>/)")] = None,
    host_tool: Annotated[Optional[str], typer.Option(help="the host lab's own tool (hypothesis H5)")] = None,
) -> None:
    """Write $IMAGEBENCH_HOME/studies/STUDY/study.yaml (the published panel shape) to edit before `open`."""
    with user_errors():
        from tasks.beauty.study import init_study

        path = init_study(cli_settings(), study_id, [t.strip() for t in tools.split(",") if t.strip()] if tools else None,
                          host_tool)
        err.print(f"[green]wrote {path}[/]: edit the judges (anonymous labels), groups and tools, then "
                  f"`imagebench study open {study_id}`", highlight=False, soft_wrap=True)


# Sending the links (issue 27 item 6): a private links file a mail merge reads, and SMTP. The SMTP
# login comes from IMAGEBENCH_SMTP_USER / IMAGEBENCH_SMTP_PASSWORD, never the command line.
LinksFileOpt = Annotated[Optional[Path], typer.Option(
    "--links-file", help="where the judges' links go: CSV judge,group,link, mode 0600, for a mail merge "
                         "(default: $IMAGEBENCH_HOME/studies/STUDY/links.csv)")]
SendMailOpt = Annotated[bool, typer.Option("--send-mail", help="also mail each judge their link (needs --addresses, "
                                           "--smtp-host, --from; login from IMAGEBENCH_SMTP_USER/_PASSWORD)")]
AddressesOpt = Annotated[Optional[Path], typer.Option(
    "--addresses", help="the lab's CSV judge,email (labels of study.yaml); read, never stored")]
SmtpHostOpt = Annotated[Optional[str], typer.Option("--smtp-host", help="the SMTP server")]
SmtpPortOpt = Annotated[Optional[int], typer.Option("--smtp-port", help="default: 587 (starttls), 465 (ssl), 25 (none)")]
SmtpSecurityOpt = Annotated[str, typer.Option("--smtp-security", help="starttls (default), ssl or none")]
FromOpt = Annotated[Optional[str], typer.Option("--from", help="the sender's address")]
TemplateOpt = Annotated[Optional[Path], typer.Option(
    "--template", help="the mail: a 'Subject:' line, a blank line, the body; $judge $group $link $study $title")]


def _mail_plan(send_mail: bool, labels, addresses, smtp_host, smtp_port, smtp_security, sender, template):
    """(mail settings, addresses) for --send-mail, checked before anything is opened; else None."""
    if not send_mail:
        if any(v is not None for v in (addresses, smtp_host, smtp_port, sender, template)):
            raise CliError("--addresses, --smtp-*, --from and --template go with --send-mail")
        return None
    from tasks.beauty.links import prepare_mail

    return prepare_mail(labels, addresses=addresses, host=smtp_host, sender=sender, security=smtp_security,
                        port=smtp_port, template=template)


def _mail_links(plan, links, study_id: str, title: str, links_file: Path) -> None:
    """Send each of ``links`` (``plan`` from :func:`_mail_plan`); name every judge not reached."""
    from tasks.beauty.links import send_links

    mail, addresses = plan
    report = send_links(mail, links, addresses, study_id, title)
    if report.sent:
        err.print(f"[green]mailed {len(report.sent)} of {len(links)} judge link(s)[/] through {mail.host}:{mail.smtp_port}",
                  highlight=False)
    if report.failed:
        detail = "; ".join(f"{label}: {why}" for label, why in report.failed.items())
        raise CliError(f"{len(report.failed)} link(s) not mailed ({detail}); they are in {links_file}: send them with a "
                       f"mail merge, or imagebench study send-links {study_id} --judge LABEL ... --send-mail ...")


@study_app.command("open")
def study_open(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    url: Annotated[Optional[str], typer.Option(help=f"the panel's public base URL, for the printed links (default: the panel_url setting, else {DEFAULT_URL})")] = None,
    links_file: LinksFileOpt = None,
    send_mail: SendMailOpt = False,
    addresses: AddressesOpt = None,
    smtp_host: SmtpHostOpt = None,
    smtp_port: SmtpPortOpt = None,
    smtp_security: SmtpSecurityOpt = "starttls",
    sender: FromOpt = None,
    template: TemplateOpt = None,
) -> None:
    """Ingest and blind every tool's images, write the pre-registration once, draw each judge's
    order, write the judges' links to a private file a mail merge reads (and mail them with
    --send-mail) and print them with the admin's link (shown once: only their hashes are kept)."""
    with user_errors():
        from tasks.beauty.links import check_links_target, default_links_path, judge_links, write_links
        from tasks.beauty.study import load_study, open_study

        from tasks.beauty.study import remember_panel_url

        settings = cli_settings()
        definition, _, _ = load_study(settings, study_id)
        target = links_file or default_links_path(settings, study_id)
        check_links_target(target)  # before any link exists: a link that cannot be written is lost
        plan = _mail_plan(send_mail, [j.label for j in definition.judges], addresses, smtp_host, smtp_port,
                          smtp_security, sender, template)
        opened = open_study(settings, study_id)
        base = (url or settings.panel_url or DEFAULT_URL).rstrip("/")
        remember_panel_url(settings, study_id, base)  # `panel serve` and `relink` use it (https: Secure cookies)
        for line in opened.image_places + opened.blinding_report:
            err.print(line, highlight=False, soft_wrap=True, markup=False)
        err.print(f"[green]study {study_id} open[/]: {opened.n_images} blinded images, pre-registration "
                  f"{opened.study_dir / 'preregistration.json'} (judge orders drawn from a private secret, "
                  f"sha256 {opened.preregistration.order_commitment}). "
                  "Links below are shown ONCE (only their sha256 is stored): send each judge theirs.",
                  highlight=False, soft_wrap=True)
        for label, token in opened.judge_tokens.items():
            typer.echo(f"judge {label}: {base}/j/{token}")
        typer.echo(f"admin: {base}/admin/{opened.admin_token}")
        links = judge_links(definition, opened.judge_tokens, base)
        write_links(target, links)
        err.print(f"[green]judge links written to {target}[/] (judge,group,link; mode 0600; no admin link): "
                  "a mail merge reads it", highlight=False, soft_wrap=True)
        if plan is not None:
            _mail_links(plan, links, study_id, definition.title, target)


@study_app.command("status")
def study_status_cmd(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The study's state and each judge's progress."""
    with user_errors():
        from tasks.beauty.study import study_status

        st = study_status(cli_settings(), study_id)
        err.print(f"study {study_id}: {st['state']}; {st['answers']} of {st.get('expected', 0)} answers; "
                  f"{st['images']} images; pre-registration sha256 {st['preregistration_sha256']}",
                  highlight=False, soft_wrap=True)
        from tasks.beauty.admin import judge_state
        from tasks.beauty.prereg import deviation_sentence
        from tasks.panel.store import now_us

        now = now_us()
        cols = ("judge", "group", "answered", "total", "last_answer_at", "state", "median_download_s")
        render(cols, [[j["label"], j["group"], j["answered"], j["total"], j["last_answer_at"],
                       judge_state(j, now) if "last_activity_us" in j else None, j.get("median_download_s")]
                      for j in st["judges"]], fmt, title=f"study {study_id}")
        devs = st.get("deviations") or []
        if devs:  # issue 27 item 5: every look before the close, as the bundle will publish it
            err.print(f"[bold yellow]{len(devs)} deviation{'s' if len(devs) != 1 else ''} from the pre-registration:[/]",
                      highlight=False)
            for d in devs:
                err.print(f"  {deviation_sentence(d)}", highlight=False, soft_wrap=True, markup=False)


@study_app.command("peek")
def study_peek(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    reason: Annotated[Optional[str], typer.Option("--reason", help="why the results are looked at before the close "
                                                  "(required; published with the study as a deviation)")] = None,
) -> None:
    """Look at the results of an open study before its close: recorded first, with the reason, as
    a deviation from the pre-registration (listed by `study status`, published in the bundle)."""
    with user_errors():
        from tasks.beauty.prereg import deviation_sentence
        from tasks.beauty.study import peek_results

        if reason is None:
            raise CliError("study peek needs --reason TEXT: a look before the close is a deviation from the "
                           "pre-registration, recorded and published with its reason")
        dev, pairs = peek_results(cli_settings(), study_id, reason)
        err.print(f"[bold yellow]recorded as a deviation from the pre-registration:[/] {deviation_sentence(dev)}",
                  highlight=False, soft_wrap=True)
        render(("tool", "prompt", "answers", "yes", "pct_yes"),
               [[p["tool"], p["prompt_id"], p["answers"], p["yes"],
                 round(100.0 * p["yes"] / p["answers"], 1) if p["answers"] else None] for p in pairs],
               OutputFormat.table, title=f"study {study_id}: results before the close")


@study_app.command("close")
def study_close(study_id: Annotated[str, typer.Argument(metavar="STUDY")]) -> None:
    """Close the study: the panel accepts no answer or memo after this."""
    with user_errors():
        from tasks.beauty.study import close_study

        closed = close_study(cli_settings(), study_id)
        err.print(f"study {study_id} {'closed' if closed else 'was already closed'}", highlight=False)


@study_app.command("relink")
def study_relink(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    judge: Annotated[str, typer.Option("--judge", help="the judge's label (study.yaml) whose link was lost")],
    url: Annotated[Optional[str], typer.Option(help="the panel's public base URL (default: the panel_url setting, else the URL given at open)")] = None,
    links_file: LinksFileOpt = None,
    send_mail: SendMailOpt = False,
    addresses: AddressesOpt = None,
    smtp_host: SmtpHostOpt = None,
    smtp_port: SmtpPortOpt = None,
    smtp_security: SmtpSecurityOpt = "starttls",
    sender: FromOpt = None,
    template: TemplateOpt = None,
) -> None:
    """Issue a new link for one judge (shown once); the old link and the judge's sessions stop
    working. The judge's row of the links file is replaced (--send-mail mails it to them)."""
    with user_errors():
        from tasks.beauty.links import check_links_target, default_links_path, judge_links, replace_link
        from tasks.beauty.study import load_study, panel_url_of, relink_judge

        settings = cli_settings()
        definition, _, _ = load_study(settings, study_id)
        target = links_file or default_links_path(settings, study_id)
        check_links_target(target)
        plan = _mail_plan(send_mail, [judge], addresses, smtp_host, smtp_port, smtp_security, sender, template)
        token = relink_judge(settings, study_id, judge)
        base = (url or panel_url_of(settings, study_id) or DEFAULT_URL).rstrip("/")
        err.print(f"[green]new link for judge {judge}[/] (shown ONCE; the old link no longer works):", highlight=False)
        typer.echo(f"judge {judge}: {base}/j/{token}")
        links = judge_links(definition, {judge: token}, base)
        replace_link(target, links[0])
        err.print(f"[green]{target}[/]: judge {judge}'s row replaced (mode 0600)", highlight=False, soft_wrap=True)
        if plan is not None:
            _mail_links(plan, links, study_id, definition.title, target)


@study_app.command("send-links")
def study_send_links(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    judge: Annotated[Optional[list[str]], typer.Option("--judge", help="only this judge (repeatable; default: every row)")] = None,
    links_file: LinksFileOpt = None,
    addresses: AddressesOpt = None,
    smtp_host: SmtpHostOpt = None,
    smtp_port: SmtpPortOpt = None,
    smtp_security: SmtpSecurityOpt = "starttls",
    sender: FromOpt = None,
    template: TemplateOpt = None,
) -> None:
    """Mail the judges their links from the links file written by open and relink (e.g. those a
    first --send-mail could not reach)."""
    with user_errors():
        from tasks.beauty.links import default_links_path, read_links
        from tasks.beauty.study import load_study

        settings = cli_settings()
        definition, _, _ = load_study(settings, study_id)
        source = links_file or default_links_path(settings, study_id)
        if not source.is_file():
            raise CliError(f"{source}: no links file (study open and relink write it)")
        rows = read_links(source)
        unknown = sorted(set(judge or ()) - {x.judge for x in rows})
        if unknown:
            raise CliError(f"{source} has no row for judge(s) {', '.join(unknown)}")
        rows = [x for x in rows if not judge or x.judge in judge]
        plan = _mail_plan(True, [x.judge for x in rows], addresses, smtp_host, smtp_port, smtp_security, sender, template)
        _mail_links(plan, rows, study_id, definition.title, source)


# ---- publishing a study: analyze, leaderboard, import-answers, export, import-bundle ----------------
# `leaderboard` reads the DuckDB catalog only: no torch, Prefect or Great Expectations (tests/flows/test_cli.py
# checks it); `analyze` runs the Prefect flow `study-analyze` in this process.

LEADERBOARD_JSON_COLUMNS = ("rank", "tool", "beauty_index", "beauty_index_lo", "beauty_index_hi", "answers", "simulated",
                            "preregistered", "flagged_answers", "beauty_index_unflagged", "beauty_index_unflagged_lo",
                            "beauty_index_unflagged_hi")
DIGITS = 1  # the table prints the Beauty Index and its interval to one decimal: so do CSV and JSON


def _simulated_banner() -> None:
    from tasks.beauty.publish import SIMULATED_BANNER  # light: pyarrow only

    err.print(f"[bold yellow]{SIMULATED_BANNER}[/]", highlight=False, soft_wrap=True)


def study_analyze(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    mixed_resamples: Annotated[Optional[int], typer.Option(
        "--mixed-resamples", min=1, help="bootstrap refits of H3's mixed model (default 100; each takes ~0.3 s)")] = None,
) -> None:
    """Read the study's answers (panel app, or imported), compute % yes per (tool, prompt), the
    Beauty Index per tool and panel group with bootstrap intervals, the pixel metrics and H1-H5,
    validate them and write them to the lake (views study_* in `imagebench sql`). Ends with the
    leaderboard and the hypotheses' verdicts."""
    with user_errors():
        settings = cli_settings()
        from tasks.beauty.study import load_study

        load_study(settings, study)  # a missing or tampered study is named before Prefect starts
        prepare_prefect(settings)
        from flows.beauty import study_analyze_flow

        summary = study_analyze_flow(study, mixed_resamples=mixed_resamples)
        err.print(f"[green]study {study} analysed[/]: {summary['answers']} answers from {summary['judges']} judges "
                  f"({summary['source']}), {summary['tools']} tools", highlight=False, soft_wrap=True)
        for note in summary["notes"]:
            err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
    study_leaderboard(study, OutputFormat.table)
    study_hypotheses(study, OutputFormat.table)


def _prereg_status(settings, catalog, study: str):
    """Whether the study's plan predates every answer (tasks.beauty.prereg), from its folder and
    the catalog's answers: no torch, Prefect or GX."""
    from datetime import datetime, timezone

    from tasks.beauty.prereg import NEVER_OPENED, PreregStatus, preregistration_status
    from tasks.beauty.study import StudyError, load_study
    from tasks.lake.tables import query

    try:
        _, prereg, _ = load_study(settings, study)
    except (StudyError, OSError, ValueError) as exc:
        return PreregStatus(False, f"pre-registration not checked: {exc}")
    if prereg is None:
        return PreregStatus(False, NEVER_OPENED)
    created = datetime.fromisoformat(prereg.created_at.replace("Z", "+00:00"))
    created_us = int((created - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds() * 1_000_000)
    _, ((early, total),) = query(catalog, "SELECT count(*) FILTER (WHERE epoch_us(shown_at) < "
                                          f"{created_us}), count(*) FROM study_answers WHERE study_id = '{study}'")
    # Only the counts matter: preregistration_status compares times, so give it stand-ins.
    return preregistration_status(prereg, [datetime(1970, 1, 1, tzinfo=timezone.utc)] * early + [created] * (total - early))


def study_leaderboard(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The study's Beauty Index per tool (0-100, 95% interval, answers), best first."""
    with user_errors(log=False):
        from schemas.study import STUDY_ID_RE

        if not STUDY_ID_RE.fullmatch(study):
            raise CliError(f"--study {study!r}: a study id matches {STUDY_ID_RE.pattern}")
        settings = cli_settings()
        from tasks.lake.tables import query

        catalog = catalog_or_exit(settings)
        status = _prereg_status(settings, catalog, study)
        flags = " || ".join(["CASE WHEN simulated THEN 'SIMULATED ' ELSE '' END"] +
                            ([] if status.preregistered else ["'not pre-registered'"]))
        if fmt is OutputFormat.table:
            select = (f"\"rank\", tool, printf('%.{DIGITS}f [%.{DIGITS}f, %.{DIGITS}f]', beauty_index, beauty_index_lo, "
                      f"beauty_index_hi) AS beauty_index, answers, flagged_answers AS flagged, CASE WHEN "
                      f"beauty_index_unflagged IS NULL THEN '–' ELSE printf('%.{DIGITS}f [%.{DIGITS}f, %.{DIGITS}f]', "
                      "beauty_index_unflagged, beauty_index_unflagged_lo, beauty_index_unflagged_hi) END AS without_flagged, "
                      f"trim({flags}) AS flags")
        else:
            rounded = {c for c in LEADERBOARD_JSON_COLUMNS if c.startswith("beauty_index")}
            select = ", ".join(f'round("{c}", {DIGITS}) AS "{c}"' if c in rounded else
                               (f"{status.preregistered} AS preregistered" if c == "preregistered" else f'"{c}"')
                               for c in LEADERBOARD_JSON_COLUMNS)
        columns, rows = query(catalog, f"SELECT {select}, simulated AS _sim FROM study_leaderboard WHERE study_id = '{study}'")
        if not rows:
            raise CliError(f"study {study} has no Beauty Index yet: imagebench study analyze --study {study}")
        simulated = any(r[-1] for r in rows)
        columns, rows = columns[:-1], [r[:-1] for r in rows]
        if fmt is OutputFormat.table and not any(r[columns.index("flagged")] for r in rows):
            # Quality control (issue 16 item 9): the index without flagged answers only when some are.
            keep = [i for i, c in enumerate(columns) if c not in ("flagged", "without_flagged")]
            columns, rows = [columns[i] for i in keep], [tuple(r[i] for i in keep) for r in rows]
        render(columns, rows, fmt, title=f"Beauty Index: study {study}")
        if simulated:
            _simulated_banner()
        if status.note:
            err.print(f"[bold yellow]{status.note}[/]", highlight=False, soft_wrap=True)


def study_hypotheses(study: str, fmt: OutputFormat = OutputFormat.table) -> None:
    """The pre-registered hypotheses' verdicts (Holm-adjusted p), with why a hypothesis was not tested."""
    with user_errors(log=False):
        from tasks.lake.tables import query

        columns, rows = query(catalog_or_exit(cli_settings()),
                              "SELECT hypothesis, verdict, round(p_holm, 4) AS p_holm, "
                              "CASE WHEN verdict = 'not tested' THEN detail ELSE coalesce(headline, '') END AS why "
                              f"FROM study_hypotheses WHERE study_id = '{study}' ORDER BY hypothesis")
        render(columns, rows, fmt, title=f"Hypotheses: study {study}")


def study_import_answers(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="CSV: judge,group,tool,prompt_id,answer,shown_at,answered_at")],
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
) -> None:
    """Answers of a panel run elsewhere: validated whole (a bad row names its line and nothing is
    recorded), stored under salted judge ids; then `study analyze` as for the panel app."""
    with user_errors():
        from tasks.beauty.imports import import_answers

        n, judges = import_answers(cli_settings(), study, file)
        err.print(f"[green]imported {n} answers from {judges} judges[/] into study {study}: "
                  f"next, imagebench study analyze --study {study}", highlight=False, soft_wrap=True)


def study_export(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    out: Annotated[Optional[Path], typer.Option("--out", help="bundle folder (default: $IMAGEBENCH_HOME/exports/STUDY)")] = None,
    times: Annotated[str, typer.Option("--times", help="resolution of the published answer times: minute, hour, day "
                                                       "or none (only: after the pre-registration or not)")] = "minute",
    drop_partial_judges: Annotated[bool, typer.Option(
        "--drop-partial-judges", help="withhold the answers of judges who did not answer their whole queue "
                                      "(their answer count singles them out)")] = False,
    merge_groups: Annotated[Optional[list[str]], typer.Option(
        "--merge-groups", metavar="A+B", help="publish these panel groups as one (repeatable)")] = None,
) -> None:
    """The open-data bundle (CC-BY 4.0): anonymised answers (Parquet + CSV), the analysis, the
    datasheet, the pre-registration, the memos their judges agreed to publish and SHA256SUMS.
    Refused, with the figures and these options, while a judge would be unique on what it
    publishes (group, answer count, first and last time); the options chosen are recorded in it."""
    with user_errors():
        settings = cli_settings()
        from tasks.beauty.export import export_study
        from tasks.beauty.privacy import PublicationChoices, parse_merge

        choices = PublicationChoices(times=times, drop_partial_judges=drop_partial_judges,
                                     merge_groups=tuple(parse_merge(m) for m in merge_groups or ()))
        path = export_study(settings, study, out or settings.home / "exports" / study, choices)
        publish_outside(settings, path)
        err.print(f"[green]bundle written:[/] {path} (check it with: cd {path} && sha256sum -c SHA256SUMS)",
                  highlight=False, soft_wrap=True)


def study_import_bundle(
    bundle: Annotated[Path, typer.Argument(metavar="DIR", help="a bundle folder written by `imagebench study export` (any lab)")],
    as_id: Annotated[Optional[str], typer.Option("--as", help="study id here (default: the bundle's own)")] = None,
) -> None:
    """Another lab's open-data bundle as a study of this workspace: SHA256SUMS verified and the
    pre-registration shown to predate every answer (refused otherwise); then `study analyze`."""
    with user_errors():
        from tasks.beauty.bundles import import_bundle

        study, n, judges = import_bundle(cli_settings(), bundle, as_id)
        err.print(f"[green]imported bundle {bundle}[/] as study {study}: {n} answers from {judges} judges, "
                  f"SHA256SUMS verified, pre-registered before every answer; next, imagebench study analyze --study {study}",
                  highlight=False, soft_wrap=True)


study_app.command("analyze")(study_analyze)
study_app.command("leaderboard")(study_leaderboard)
study_app.command("import-answers")(study_import_answers)
study_app.command("export")(study_export)
study_app.command("import-bundle")(study_import_bundle)
