"""Text that fits the terminal: lines broken at spaces, never inside a flag, a path or a name.

A terminal wraps a line wider than itself wherever the column runs out (`--train.num-st` /
`eps`); here the programs break their own lines first, at the terminal's width:

    help, listings, reports (stdout)   always at `columns()`: shutil's answer, 80 when unknown
                                       (argparse lays out its help the same way)
    error and warning lines (stderr)   at the width of the terminal stderr is, and only there: to
                                       a pipe or a file (a log, the tuner reading a trial's
                                       stderr, a test) an error stays one line, whole for grep

`textwrap` breaks a word that is wider than the line and splits at hyphens (`--dry-run-` /
`devices`); neither is done here: a word longer than the line (a long path) has a line of its own.
This module imports only the standard library: `entry` prints its error lines before anything
heavy is loaded.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Iterable
from typing import Any

FALLBACK = 80


def columns(stream: Any = None) -> int:
    """The width to lay text out for: $COLUMNS when set, else the width of the terminal `stream`
    is (stdout by default), else 80."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if stream is None:
        return shutil.get_terminal_size((FALLBACK, 24)).columns or FALLBACK
    try:
        return os.get_terminal_size(stream.fileno()).columns or FALLBACK
    except (AttributeError, OSError, ValueError):  # not a terminal, or no file descriptor (a test's capture)
        return FALLBACK


def is_terminal(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or an object without isatty
        return False


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """`text` as lines of at most `width` characters, broken at spaces only: `first` starts the
    first line (default: `indent`), `indent` the others."""
    lines = textwrap.wrap(
        text,
        max(width, len(indent) + 8),
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [(indent if first is None else first).rstrip()]


def fill(text: str, width: int, indent: str = "", first: str | None = None) -> str:
    """`wrap`, joined into one string."""
    return "\n".join(wrap(text, width, indent, first))


def fill_groups(groups: Iterable[str], width: int, first: str, indent: str, end: str = "") -> list[str]:
    """Groups of words (a flag and its value, `[--dry-run-devices N]`) laid out in lines of at most
    `width`, a group broken only where it is wider than a line by itself: `first` starts the first
    line, `indent` the others, and `end` closes every line but the last (` \\` for a shell command)."""

    def join(line: str, group: str) -> str:
        return line + group if not line or line.endswith(" ") else f"{line} {group}"

    lines: list[str] = []
    line, empty = first, True  # empty: no group on the line yet
    for group in groups:
        if len(join(line, group)) + len(end) > width and not empty:
            lines.append(line + end)
            line, empty = indent, True
        if len(join(line, group)) + len(end) <= width:
            line, empty = join(line, group), False
            continue
        parts = wrap(group, width - len(end), indent, first=join(line, ""))  # wider than a line by itself
        lines += [part + end for part in parts[:-1]]
        line, empty = parts[-1], False
    lines.append(line)
    return lines


def message_lines(prefix: str, message: str, stream: Any) -> str:
    """`prefix` + `message` ("error: ..."), broken at the width of the terminal `stream` is, each
    line after the first indented under the message; as it is when `stream` is not a terminal."""
    if not is_terminal(stream):
        return prefix + message
    width, indent = columns(stream), " " * len(prefix)
    paragraphs = message.split("\n")
    return "\n".join(fill(line, width, indent, first=prefix if i == 0 else indent) for i, line in enumerate(paragraphs))


def print_message(prefix: str, message: str, stream: Any = None) -> None:
    """Prints `message_lines` to `stream` (stderr by default)."""
    stream = sys.stderr if stream is None else stream
    print(message_lines(prefix, message, stream), file=stream)
