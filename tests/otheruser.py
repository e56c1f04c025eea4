"""A second, unprivileged local account, for the shared-server tests (issue 24).

Labs run imagebench on machines where other people have accounts. The attacks these tests try are
the ones such a person can make: over loopback (bind a port first, answer it, connect) and through
the file system (read, open, lock what imagebench left readable). They run as a real second user,
created by the ``other_user`` fixture (tests/conftest.py) when the tests run as root, as CI does,
and removed after; as a normal user the tests that need one are skipped, saying why.

The attacker runs Debian's own ``/usr/bin/python3`` with the standard library only (the project's
interpreter may live under a home the other account cannot enter), with umask 022 and an
environment of its own: nothing of ours is inherited.

Workspaces under attack must sit where the other account can reach them, as a lab's would
(``/srv/bench``, a home with 0755): pytest's ``tmp_path`` lies under a 0700 folder, which would
make every file attack fail for the wrong reason. ``reachable_dir`` makes such a folder.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ATTACKER_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class OtherUser:
    """The second account: run code as it."""

    name: str
    uid: int
    gid: int

    def environment(self, **extra: str) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra)
        return env

    def popen(self, code: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        """``/usr/bin/python3 -c CODE ARGS...`` as this user, umask 022, in /tmp."""
        return subprocess.Popen(  # noqa: S603 - the test's own code, as the test's own user
            [ATTACKER_PYTHON, "-c", textwrap.dedent(code), *args],
            user=self.uid, group=self.gid, extra_groups=[], umask=0o022, cwd="/tmp",
            env=env if env is not None else self.environment(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
        )

    def run(self, code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = self.popen(code, *args, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the other user's code ran past {timeout} s; stderr: {err[-2000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def can_read(self, path: Path) -> bool:
        """Whether this user can open ``path`` for reading (the kernel decides, not a mode check)."""
        result = self.run("import sys\ntry:\n    open(sys.argv[1], 'rb').read(1)\nexcept OSError:\n    sys.exit(3)\n",
                          str(path))
        return result.returncode == 0


def create_other_user() -> OtherUser | None:
    """A new unprivileged account (no home, no login shell); None when this process is not root."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return None
    name = f"ibother{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", "--user-group", name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return OtherUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def remove_other_user(user: OtherUser) -> None:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(["pkill", "-KILL", "-u", str(user.uid)], capture_output=True, timeout=10)
    subprocess.run(["userdel", user.name], capture_output=True, timeout=30)
    with contextlib.suppress(KeyError, subprocess.SubprocessError):
        grp.getgrnam(user.name)
        subprocess.run(["groupdel", user.name], capture_output=True, timeout=30)


@contextlib.contextmanager
def reachable_dir(prefix: str = "ib-shared-") -> Iterator[Path]:
    """A folder under /tmp that every local account can enter (0755), as a lab's workspace parent
    would be; removed after."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask for the block (commands started inside inherit it)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
