"""The train program's lines fitted to the terminal: wrapped at word boundaries, never mid-word.

A terminal wraps a line wider than itself wherever the edge falls, mid-word: at 80 columns the
closing block's commands broke inside their paths. `print_fitted` (the train program's `log`)
wraps a line wider than the terminal (`shutil.get_terminal_size`, 80 where it cannot tell)
between words, the continuation indented under the line's text:

    eval: loss 1.6936, accuracy 0.4977, bits_per_byte 2.4435, exact_match 0.0000,
          batches 151-200
      decode       python -m pax_eqx.decode --job-log-dir /home/me/runs/shakespeare \\
                     --prompt "ROMEO:"

A `ShellCommand` line continues with a backslash and never breaks inside a quoted word, so the
command still pastes as one. Piped output (a file, CI, `| grep`) is written as it is: one
logical line each, for the programs and tests that read it (its lines are written to fit 80
columns where their content allows: the banner, the progress lines, the closing block), and
DIR/train.log keeps the unwrapped lines too (run_record.tee_to_log hands it each line as it is).
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap

_LABEL = re.compile(r"^\s*\S+(?: \S+)?\s{2,}(?=\S)")  # "  files        ...": a column of labels
_FIELD = re.compile(r"^\s*[a-z_]+: (?=\S)")  # "eval: loss ...", "warning: ..."
_SHELL_WORD = re.compile(r"""(?:[^\s"']+|"[^"]*"|'[^']*')+""")  # a word; quotes keep their spaces


class ShellCommand(str):
    """A line whose text (after its label) is a shell command: `fit` breaks it between the
    shell's words only, with a trailing backslash, so it still pastes as one command."""


def terminal_width() -> int | None:
    """The terminal's width when stdout is one (COLUMNS, else the terminal's own, else 80)."""
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        if not (isatty and isatty()):
            return None
    except ValueError:  # a closed stdout
        return None
    return shutil.get_terminal_size((80, 24)).columns


def print_fitted(line: str) -> None:
    """`print(line)`, on a terminal as the lines `fit` makes of it."""
    width = terminal_width()
    for part in [line] if width is None else fit(line, width):
        print(part)


def fit(line: str, width: int) -> list[str]:
    """`line` as lines no wider than `width` where its words allow (a word wider than the room
    stays whole), each continuation indented under the text: after a label column or a
    `name: ` field, else two spaces in."""
    if "\n" in line:
        return [part for piece in line.split("\n") for part in fit(type(line)(piece), width)]
    if len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    label = _LABEL.match(line) or _FIELD.match(line)
    hang = label.end() if label and label.end() <= width // 2 else lead + 2
    if isinstance(line, ShellCommand):
        return _fit_command(line, width, hang)
    return textwrap.wrap(line, width, subsequent_indent=" " * hang, break_long_words=False, break_on_hyphens=False)


def _fit_command(line: str, width: int, hang: int) -> list[str]:
    """Shell words filled up to `width` less the room for " \\", continued two spaces further in."""
    label = _LABEL.match(line)
    head = line[: label.end()] if label else " " * (len(line) - len(line.lstrip(" ")))
    lines, current = [], head
    for word in _SHELL_WORD.findall(line[len(head) :]):
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            lines.append(current + " \\")
            current = " " * (hang + 2) + word
        else:
            current += ("" if current.endswith(" ") or not current.strip() else " ") + word
    return [*lines, current]
