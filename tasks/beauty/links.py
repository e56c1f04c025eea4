"""Sending judges their links (issue 27 item 6): a private file a mail merge reads, and mail.

``study open`` (and ``study relink`` for one judge) writes every judge's link to a CSV file,
``judge,group,link`` (a header, one row per judge; the admin link is never in it), through
imagebench's one CSV writer (tasks/store/spreadsheet.py), mode 0600 whatever the umask, replaced
whole (a temp file in the same folder, then a rename). Default: ``studies/<id>/links.csv`` in the
private workspace; ``--links-file`` puts it elsewhere (a folder the lab's mail merge reads).
``relink`` rewrites that judge's row and keeps the others.

Mail (``--send-mail``): one message per judge, to the address the lab's own address file gives
for the label (``judge,email``, read here and never stored: study.yaml names no one), from a
template (a ``Subject:`` line, a blank line, the body; ``$judge``, ``$group``, ``$link``,
``$study``, ``$title`` are replaced; ``$link`` must be in the body). SMTP with STARTTLS (default,
port 587), implicit TLS (``ssl``, 465) or none (25; loopback only when a password is sent). The
certificate is verified against the system's trust store (``SSL_CERT_FILE`` names another). The
SMTP login comes from the environment, never the command line: ``IMAGEBENCH_SMTP_USER`` and
``IMAGEBENCH_SMTP_PASSWORD`` (both, or neither: no login). Every judge's mail is tried; the ones
that failed are named (the links are in the file: send them with ``study send-links``).
"""

from __future__ import annotations

import csv
import ipaddress
import os
import re
import smtplib
import socket
import ssl
import string
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from datetime import UTC, datetime
from pathlib import Path

from tasks.store.spreadsheet import write_csv

LINKS_FILE = "links.csv"
LINKS_HEADER = ("judge", "group", "link")
ADDRESSES_HEADER = ("judge", "email")
SMTP_USER_ENV = "IMAGEBENCH_SMTP_USER"
SMTP_PASSWORD_ENV = "IMAGEBENCH_SMTP_PASSWORD"
SECURITY_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
PLACEHOLDERS = ("judge", "group", "link", "study", "title")
_EMAIL_RE = re.compile(r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+\.[^@\s<>,;\"]+$")

DEFAULT_TEMPLATE = """Subject: Your link to the panel: $title

Hello,

Thank you for joining the panel. Your personal link is:

$link

Open it in your browser (on a phone too): one image at a time, one question, Yes or No. You can stop
and come back later with the same link; it resumes where you stopped. Please do not forward it: it
is yours alone.
"""


class LinksError(ValueError):
    """A links file, address file, template or mail setting that cannot be used (one line)."""


@dataclass(frozen=True)
class JudgeLink:
    judge: str
    group: str
    link: str


# ---- the links file -----------------------------------------------------------------------------


def check_links_target(path: Path) -> None:
    """Refuse, before any link exists, a links file that could not be written: its folder missing,
    a folder in its place, or a file there that is not a links file (it would be replaced)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise LinksError(f"{path}: folder {path.parent} does not exist (the judges' links would be lost)")
    if path.is_dir():
        raise LinksError(f"{path} is a folder: give a file name for the judges' links")
    if path.exists() or path.is_symlink():
        try:
            read_links(path)
        except (LinksError, OSError) as exc:
            raise LinksError(f"{path} exists and is not a links file (judge,group,link): it would be replaced; "
                             f"choose another name ({exc})") from None


def write_links(path: Path, links: Sequence[JudgeLink]) -> None:
    """The links file, replaced whole: mode 0600 from its creation (a temp file in the same
    folder), every cell through the one CSV writer, fsynced, then renamed onto ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            write_csv(fh, LINKS_HEADER, [(x.judge, x.group, x.link) for x in links])
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_links(path: Path) -> list[JudgeLink]:
    """The rows of a links file (as a mail merge reads it: the csv module)."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or tuple(rows[0]) != LINKS_HEADER:
        raise LinksError(f"{path}: header is not {','.join(LINKS_HEADER)}")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != 3:
            raise LinksError(f"{path}:{n}: expected 3 cells (judge,group,link), got {len(row)}")
        out.append(JudgeLink(*row))
    return out


def replace_link(path: Path, link: JudgeLink) -> None:
    """``link`` in the links file at ``path`` (its judge's row replaced, the others kept; a new
    file with that one row when there is none yet)."""
    path = Path(path)
    rows = read_links(path) if path.exists() else []
    kept = [x for x in rows if x.judge != link.judge]
    at = next((i for i, x in enumerate(rows) if x.judge == link.judge), len(kept))
    write_links(path, kept[:at] + [link] + kept[at:])


# ---- mail ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MailTemplate:
    subject: string.Template
    body: string.Template


@dataclass(frozen=True)
class MailSettings:
    host: str
    sender: str
    template: MailTemplate
    security: str = "starttls"  # starttls | ssl | none
    port: int | None = None  # default: SECURITY_PORTS[security]
    timeout_s: float = 30.0

    @property
    def smtp_port(self) -> int:
        return self.port or SECURITY_PORTS[self.security]


@dataclass
class SendReport:
    sent: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def parse_template(text: str, where: str = "template") -> MailTemplate:
    """A template's text: ``Subject: ...``, a blank line, the body; only the known placeholders,
    and ``$link`` in the body (a mail without the link is no use)."""
    head, sep, body = text.replace("\r\n", "\n").partition("\n\n")
    if not sep or not head.startswith("Subject:") or "\n" in head:
        raise LinksError(f"{where}: must begin with one 'Subject: ...' line, then a blank line, then the body")
    subject, body_t = string.Template(head[len("Subject:"):].strip()), string.Template(body)
    for part, t in (("subject", subject), ("body", body_t)):
        if not t.is_valid():
            raise LinksError(f"{where}: the {part} has a '$' that is not a placeholder (write $$ for a dollar sign)")
        unknown = sorted(set(t.get_identifiers()) - set(PLACEHOLDERS))
        if unknown:
            raise LinksError(f"{where}: unknown placeholder(s) {', '.join('$' + u for u in unknown)} in the {part} "
                             f"(known: {', '.join('$' + p for p in PLACEHOLDERS)})")
    if "link" not in body_t.get_identifiers():
        raise LinksError(f"{where}: the body must contain $link (the judge's own link)")
    return MailTemplate(subject, body_t)


def load_template(path: Path | None) -> MailTemplate:
    if path is None:
        return parse_template(DEFAULT_TEMPLATE, "the default template")
    try:
        return parse_template(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise LinksError(f"{path}: cannot read the mail template ({exc})") from None


def check_address(text: str, where: str) -> str:
    if not _EMAIL_RE.fullmatch(text):
        raise LinksError(f"{where}: {text!r} is not an e-mail address")
    return text


def read_addresses(path: Path, labels: Sequence[str]) -> dict[str, str]:
    """The lab's address file (``judge,email``, the judges' labels) for ``labels``: every label
    must have one valid address; a label it does not know, or one named twice, is refused."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise LinksError(f"{path}: cannot read the address file ({exc})") from None
    if not rows or tuple(c.strip().lower() for c in rows[0]) != ADDRESSES_HEADER:
        raise LinksError(f"{path}: the first line must be the header {','.join(ADDRESSES_HEADER)}")
    out: dict[str, str] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != 2:
            raise LinksError(f"{path}:{n}: expected judge,email")
        label, address = row[0].strip(), row[1].strip()
        if label in out:
            raise LinksError(f"{path}:{n}: judge {label!r} is named twice")
        out[label] = check_address(address, f"{path}:{n}")
    missing = [x for x in labels if x not in out]
    if missing:
        raise LinksError(f"{path}: no address for judge(s) {', '.join(missing)}")
    return {x: out[x] for x in labels}


def compose(template: MailTemplate, link: JudgeLink, sender: str, to: str, study_id: str, title: str) -> EmailMessage:
    values = {"judge": link.judge, "group": link.group, "link": link.link, "study": study_id, "title": title or study_id}
    msg = EmailMessage()
    msg["From"], msg["To"] = sender, to
    msg["Subject"] = template.subject.substitute(values)
    msg["Date"] = format_datetime(datetime.now(UTC))
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2])
    msg.set_content(template.body.substitute(values))
    return msg


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def smtp_login() -> tuple[str, str] | None:
    """(user, password) from IMAGEBENCH_SMTP_USER / IMAGEBENCH_SMTP_PASSWORD, or None (no login)."""
    user, password = os.environ.get(SMTP_USER_ENV), os.environ.get(SMTP_PASSWORD_ENV)
    if bool(user) != bool(password):
        raise LinksError(f"set both {SMTP_USER_ENV} and {SMTP_PASSWORD_ENV} for the SMTP login, or neither")
    return (user, password) if user else None


def check_mail(mail: MailSettings) -> None:
    """Refuse, before anything is sent (or opened), what cannot work or would leak the password."""
    if mail.security not in SECURITY_PORTS:
        raise LinksError(f"--smtp-security {mail.security!r}: starttls, ssl or none")
    check_address(mail.sender, "--from")
    if smtp_login() is not None and mail.security == "none" and not _loopback(mail.host):
        raise LinksError(f"SMTP login to {mail.host} without TLS would send the password in clear: use "
                         "--smtp-security starttls or ssl")


def send_links(mail: MailSettings, links: Sequence[JudgeLink], addresses: dict[str, str], study_id: str,
               title: str) -> SendReport:
    """One message per judge of ``links`` to their address, over one SMTP connection; each judge
    that could not be sent to is in the report with why (nothing raised: the rest are still tried)."""
    check_mail(mail)
    report = SendReport()
    login = smtp_login()
    context = ssl.create_default_context()
    try:
        if mail.security == "ssl":
            server: smtplib.SMTP = smtplib.SMTP_SSL(mail.host, mail.smtp_port, timeout=mail.timeout_s, context=context)
        else:
            server = smtplib.SMTP(mail.host, mail.smtp_port, timeout=mail.timeout_s)
        with server:
            if mail.security == "starttls":
                server.starttls(context=context)
            if login is not None:
                server.login(*login)
            for x in links:
                try:
                    server.send_message(compose(mail.template, x, mail.sender, addresses[x.judge], study_id, title))
                    report.sent.append(x.judge)
                except smtplib.SMTPRecipientsRefused as exc:
                    report.failed[x.judge] = f"refused by the server: {_one_line(exc)}"
                except (smtplib.SMTPDataError, smtplib.SMTPSenderRefused) as exc:
                    report.failed[x.judge] = _one_line(exc)
    except (smtplib.SMTPException, OSError, socket.timeout, ssl.SSLError) as exc:
        why = f"{mail.host}:{mail.smtp_port}: {_one_line(exc)}"
        for x in links:
            if x.judge not in report.sent:
                report.failed.setdefault(x.judge, why)
    return report


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ---- what the commands put together -----------------------------------------------------------


def default_links_path(settings, study_id: str) -> Path:
    from tasks.beauty.study import study_dir

    return study_dir(settings, study_id) / LINKS_FILE


def judge_links(definition, tokens: dict[str, str], base_url: str) -> list[JudgeLink]:
    """The links of the judges in ``tokens`` (label -> token), in study.yaml's order."""
    base = base_url.rstrip("/")
    return [JudgeLink(j.label, j.group, f"{base}/j/{tokens[j.label]}") for j in definition.judges if j.label in tokens]


def prepare_mail(labels: Sequence[str], *, addresses: Path | None, host: str | None, sender: str | None,
                 security: str = "starttls", port: int | None = None, template: Path | None = None
                 ) -> tuple[MailSettings, dict[str, str]]:
    """The mail settings and every judge's address, checked before any link exists (``--send-mail``
    of open, relink and send-links): a missing option, address, template placeholder or a login
    that would go in clear is one line here, and nothing is opened or sent."""
    missing = [opt for opt, v in (("--addresses FILE", addresses), ("--smtp-host HOST", host), ("--from ADDRESS", sender))
               if not v]
    if missing:
        raise LinksError(f"--send-mail needs {', '.join(missing)}")
    mail = MailSettings(host=host, sender=sender, template=load_template(template), security=security, port=port)
    check_mail(mail)
    return mail, read_addresses(addresses, labels)
