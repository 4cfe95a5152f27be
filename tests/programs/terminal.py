"""A program run as a person runs it: in a pseudo-terminal of a given size, its output rendered
by a terminal emulator (pyte), so a test reads the screen a person would see."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pyte


def run_in_a_terminal(
    args: list[str], cwd, *, columns: int = 80, rows: int = 60, env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, list[str], str]:
    """(exit status, the screen's non-blank lines after the run, the raw output) of
    `python ARGS` (e.g. ["-m", "pax_eqx.train", ...])."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    full_env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows), **(env or {}))
    process = subprocess.Popen([sys.executable, *args], stdout=terminal, stderr=terminal, env=full_env, cwd=cwd)
    os.close(terminal)
    screen = pyte.Screen(columns, rows)
    stream, raw = pyte.ByteStream(screen), b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
        stream.feed(chunk)
    os.close(controller)
    code = process.wait(timeout=timeout)
    return code, [line.rstrip() for line in screen.display if line.strip()], raw.decode(errors="replace")
