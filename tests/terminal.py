"""Run a command on a pseudo-terminal, as a person's shell runs it: what it writes when stdout is
a terminal (Rich's widths, Prefect's notices) differs from what it writes into a pipe."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest


def on_a_terminal(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 240,
                  size: tuple[int, int] | None = None) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal (``size`` = columns, rows) as stdin, stdout and stderr;
    its exit code and everything it wrote. Fails the test if it still runs after ``timeout`` s."""
    main, sub = pty.openpty()
    if size is not None:
        columns, rows = size
        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=sub, stdout=sub, stderr=sub, close_fds=True)
    os.close(sub)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: the terminal's other side is closed (the process ended)
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            pytest.fail(f"{cmd} still running after {timeout:.0f} s:\n{out.decode(errors='replace')}")
    finally:
        os.close(main)
    return proc.wait(60), out.decode("utf-8", errors="replace")
