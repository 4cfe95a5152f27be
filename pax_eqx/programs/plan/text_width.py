"""The plan's reports at the terminal's width: prose broken at spaces, commands continued with `\\`.

`--dry-run` and `--recommend` print to stdout. On a terminal they are laid out for its width
(`shutil.get_terminal_size()`, 80 columns when it does not say): a line is broken at spaces
only, never inside a flag, a mesh or a size; a command keeps each flag with its values on one
line and continues with ` \\`, so it still pastes into a shell. Piped, every line is whole, for
the script or `grep` that reads it (as the train run's own lines: docs/design.md, "What a person
sees"). The command line's `width.py` does the same for the parser's text; this room may not
import that one (the rooms of one floor import each other not at all).
"""

from __future__ import annotations

import shlex
import shutil
import sys
import textwrap


def terminal_width() -> int | None:
    """The columns of the terminal stdout is (80 when it does not say); None when stdout is not a
    terminal: the lines are printed whole."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):  # no stdout, or a closed one
        return None
    return shutil.get_terminal_size((80, 24)).columns or 80


UNBROKEN = "\u00a0"  # a space no line is broken at (textwrap breaks at ASCII whitespace only)


def unbroken(text: str) -> str:
    """`text` (a mesh `1 4 2 x 32 4 1`, a size `6.98 s`) kept on one line by `wrap`."""
    return text.replace(" ", UNBROKEN)


def wrap(text: str, width: int | None, indent: str = "") -> list[str]:
    """`text` in lines of at most `width` (None: one line), broken at spaces (not inside an
    `unbroken` part); lines after the first start with `indent`."""
    lines = [text] if width is None or len(text) <= width else textwrap.wrap(
        text, max(width, len(indent) + 8), subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    ) or [text]  # fmt: skip
    return [line.replace(UNBROKEN, " ") for line in lines]


def command_lines(label: str, words: list[str], width: int | None, indent: str = "    ") -> list[str]:
    """`label` (with its space) and the shell command `words`, in lines of at most `width` (None:
    one line): a flag and its values stay together, every line but the last ends with ` \\`."""
    groups: list[str] = []
    for word in map(shlex.quote, words):
        if groups and not word.startswith("-"):
            groups[-1] += " " + word
        else:
            groups.append(word)
    line = label + groups[0] if groups else label
    if width is None:
        return [" ".join([line, *groups[1:]])]
    lines = []
    for group in groups[1:]:
        if len(line) + 1 + len(group) + 2 > width and line.strip():
            lines.append(line + " \\")
            line = indent + group
        else:
            line = f"{line} {group}"
    return [*lines, line]
