"""Sending 20 links (issue 27 item 6): `study open` writes every judge's link to a private file a
mail merge reads (judge,group,link; 0600 under umask 022, unreadable by another local account)
and, with --send-mail, mails each judge their own link through a real SMTP server (aiosmtpd, on
loopback, STARTTLS with a certificate made here and a login from the environment); `study relink`
does the same for one judge; `study send-links` sends again from the file."""

from __future__ import annotations

import csv
import datetime as dt
import email
import email.policy
import ipaddress
import os
import re
import socket
from pathlib import Path

import pytest

from tests.otheruser import umask
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, make_settings, write_study, write_tool_images

JUDGES = [("ph-01", "photographers"), ("ph-02", "photographers"), ("aph-01", "aphantasia"), ("tbi-01", "tbi-survivors")]
ADDRESS = {label: f"{label}@judges.example.org" for label, _ in JUDGES}
USER, PASSWORD = "lab-mailer", "correct horse battery staple"
TEMPLATE = """Subject: $title: your link, $judge

Dear judge $judge ($group),

your link to study $study: $link

Costs $$0. Thank you.
"""


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the SMTP server's), made with cryptography."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Mailbox:
    """What the SMTP server received: (envelope sender, recipients, parsed message) per mail."""

    def __init__(self):
        self.mails: list[tuple[str, list[str], email.message.EmailMessage]] = []
        self.logins: list[tuple[str, bool]] = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.mails.append((envelope.mail_from, list(envelope.rcpt_tos), msg))
        return "250 Message accepted for delivery"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult, LoginPassword

        ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (USER.encode(), PASSWORD.encode())
        self.logins.append((auth_data.login.decode() if isinstance(auth_data, LoginPassword) else "?", ok))
        return AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp(tmp_path, monkeypatch):
    """A real SMTP server (aiosmtpd) on loopback that requires STARTTLS and a login; its
    certificate trusted through SSL_CERT_FILE, as a lab would name its own CA."""
    import ssl

    from aiosmtpd.controller import Controller

    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True,
                            authenticator=box.authenticate, auth_require_tls=True, ready_timeout=30)
    controller.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setenv("IMAGEBENCH_SMTP_USER", USER)
    monkeypatch.setenv("IMAGEBENCH_SMTP_PASSWORD", PASSWORD)
    try:
        yield box, port, cert
    finally:
        controller.stop()


def _cli(*args: str):
    from typer.testing import CliRunner

    from flows.cli import app

    with umask(0o022):  # a lab's usual umask: the links file must not rely on a strict one
        return CliRunner().invoke(app, list(args))


def _links_of(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^judge (\S+): (\S+)$", stdout, re.M))


def test_open_writes_a_private_links_file_and_mails_each_judge_their_own_link(tmp_path, monkeypatch, smtp, other_user,
                                                                               reachable_tmp):
    box, port, _ = smtp
    for key, value in {"IMAGEBENCH_HOME": str(tmp_path / "home"), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
                       "IMAGEBENCH_STORE": str(tmp_path / "home" / "objects")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("IMAGEBENCH_PANEL_DATABASE", raising=False)
    settings = make_settings(tmp_path / "home")
    for tool in TOOLS:
        write_tool_images(tmp_path / "home" / "objects", tool, beauty_prompt_ids())
    write_study(settings, "mailed", JUDGES, memo=False)
    study = tmp_path / "home" / "studies" / "mailed"
    addresses = tmp_path / "addresses.csv"
    addresses.write_text("judge,email\n" + "".join(f"{k},{v}\n" for k, v in ADDRESS.items()))
    template = tmp_path / "mail.txt"
    template.write_text(TEMPLATE)
    links_file = reachable_tmp / "panel-links.csv"  # where a mail merge reads it: a folder others can enter
    mail = ["--send-mail", "--addresses", str(addresses), "--smtp-host", "127.0.0.1", "--smtp-port", str(port),
            "--from", "panel@lab.example.org", "--template", str(template)]

    # Refused before anything opens: a judge without an address, a template without the link, a
    # links file that cannot be written (the links would be lost).
    short = tmp_path / "short.csv"
    short.write_text("judge,email\n" + "".join(f"{k},{v}\n" for k, v in list(ADDRESS.items())[:3]))
    no_link = tmp_path / "no-link.txt"
    no_link.write_text("Subject: hi\n\nno link here, $judge\n")
    for args, why in (
        (mail[:2] + [str(short)] + mail[3:], "no address for judge(s) tbi-01"),
        (mail[:-1] + [str(no_link)], "must contain $link"),
        (["--links-file", str(tmp_path / "missing" / "links.csv")], "does not exist"),
        (["--smtp-host", "127.0.0.1"], "go with --send-mail"),
    ):
        r = _cli("study", "open", "mailed", *args)
        assert r.exit_code == 1 and why in r.output, (args, r.output)
        assert not (study / "preregistration.json").exists() and not (study / "images").exists()
    assert box.mails == [] and box.logins == []

    r = _cli("study", "open", "mailed", "--url", "https://panel.lab.example.org", "--links-file", str(links_file), *mail)
    assert r.exit_code == 0, r.output
    assert "mailed 4 of 4 judge link(s)" in r.output and str(links_file) in r.output
    printed = _links_of(r.stdout)
    admin = re.search(r"^admin: (\S+)$", r.stdout, re.M).group(1)

    # The file: 0600 although the umask was 022, unreadable to another account in a folder it can
    # enter, and what a mail merge reads with the csv module: one row per judge.
    assert links_file.stat().st_mode & 0o777 == 0o600
    assert not other_user.can_read(links_file)
    with open(links_file, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [(x["judge"], x["group"], x["link"]) for x in rows] == [(label, group, printed[label]) for label, group in JUDGES]
    assert admin not in links_file.read_text() and "admin" not in links_file.read_text()

    # The mail: one per judge, to their address only, with their link and no one else's.
    assert box.logins == [(USER, True)]
    assert sorted(to for _, to, _ in box.mails) == sorted([a] for a in ADDRESS.values())
    for sender, (to,), msg in box.mails:
        label = next(k for k, v in ADDRESS.items() if v == to)
        body = msg.get_content()
        assert sender == "panel@lab.example.org" and msg["To"] == to
        assert msg["Subject"] == f"mailed: your link, {label}"  # $title: the study id when study.yaml has none
        assert printed[label] in body and f"Dear judge {label} ({dict(JUDGES)[label]})" in body and "Costs $0." in body
        others = [printed[k].rsplit("/", 1)[1] for k in printed if k != label] + [admin.rsplit("/", 1)[1]]
        assert not [t for t in others if t in msg.as_string()]
    assert PASSWORD not in r.output

    # relink: one judge, one new link, one mail; the file keeps everyone else's row.
    r = _cli("study", "relink", "mailed", "--judge", "aph-01", "--links-file", str(links_file), *mail)
    assert r.exit_code == 0, r.output
    new = _links_of(r.stdout)["aph-01"]
    assert new != printed["aph-01"] and len(box.mails) == 5
    _, to, msg = box.mails[-1]
    assert to == [ADDRESS["aph-01"]] and new in msg.get_content() and printed["aph-01"] not in msg.as_string()
    with open(links_file, newline="", encoding="utf-8") as fh:
        rows = {x["judge"]: x["link"] for x in csv.DictReader(fh)}
    assert rows == {**printed, "aph-01": new} and links_file.stat().st_mode & 0o777 == 0o600

    # A server whose certificate this machine does not trust gets nothing, the password least of all.
    monkeypatch.delenv("SSL_CERT_FILE")
    logins = len(box.logins)
    r = _cli("study", "send-links", "mailed", "--judge", "ph-01", "--links-file", str(links_file), *mail[1:])
    assert r.exit_code == 1 and "certificate verify failed" in r.output.replace("\n", " "), r.output
    assert len(box.mails) == 5 and len(box.logins) == logins
    monkeypatch.setenv("SSL_CERT_FILE", str(smtp[2]))

    # A login the server refuses: the judges not reached are named, nothing else is lost.
    monkeypatch.setenv("IMAGEBENCH_SMTP_PASSWORD", "wrong")
    send = ["study", "send-links", "mailed", "--judge", "ph-02", "--judge", "tbi-01", "--links-file", str(links_file),
            *mail[1:]]
    r = _cli(*send)
    assert r.exit_code == 1 and "2 link(s) not mailed" in r.output and "ph-02:" in r.output and "tbi-01:" in r.output
    assert len(box.mails) == 5 and box.logins[-1] == (USER, False)
    monkeypatch.setenv("IMAGEBENCH_SMTP_PASSWORD", PASSWORD)
    r = _cli(*send)
    assert r.exit_code == 0 and "mailed 2 of 2" in r.output, r.output
    assert sorted(to for _, to, _ in box.mails[5:]) == [[ADDRESS["ph-02"]], [ADDRESS["tbi-01"]]]
    assert printed["ph-02"] in box.mails[5][2].get_content() or printed["ph-02"] in box.mails[6][2].get_content()

    # The default place is the study folder, private like the rest of the workspace.
    r = _cli("study", "relink", "mailed", "--judge", "ph-01")
    assert r.exit_code == 0, r.output
    default = study / "links.csv"
    assert default.stat().st_mode & 0o777 == 0o600
    assert [x["judge"] for x in csv.DictReader(open(default, newline=""))] == ["ph-01"]
    assert os.environ["IMAGEBENCH_SMTP_PASSWORD"] not in default.read_text()


def test_a_login_would_not_go_in_clear(tmp_path, monkeypatch):
    from tasks.beauty.links import LinksError, prepare_mail

    addresses = tmp_path / "a.csv"
    addresses.write_text("judge,email\nj1,j1@x.example\n")
    monkeypatch.setenv("IMAGEBENCH_SMTP_USER", USER)
    monkeypatch.setenv("IMAGEBENCH_SMTP_PASSWORD", PASSWORD)
    with pytest.raises(LinksError, match="in clear"):
        prepare_mail(["j1"], addresses=addresses, host="smtp.example.org", sender="a@b.example", security="none")
    monkeypatch.delenv("IMAGEBENCH_SMTP_PASSWORD")
    with pytest.raises(LinksError, match="set both"):
        prepare_mail(["j1"], addresses=addresses, host="smtp.example.org", sender="a@b.example")
