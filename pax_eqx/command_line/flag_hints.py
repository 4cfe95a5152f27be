"""The nearest field flags of a misspelt one, where tyro suggests none; the section help to read.

tyro's "Perhaps you meant" compares whole flags, so `--lr` and decode's `--max-tokens` got no
suggestion. Here a flag is matched by its whole path, by its last part (`--max-tokens` ~
`--decode.max-new-tokens`) and by the initials of its last part (`--lr` = learning-rate). tyro's
"For full helptext, run PROG --help" becomes `PROG --help SECTION`, the section of the flag.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any

_UNRECOGNIZED = re.compile(r"Unrecognized options?: ([^-]*(?:--[^ ,]+[^-]*)+?)(?: -- |$)")
_FULL_HELPTEXT = re.compile(r"For full helptext, (?:run|see) (.+?) --help\b")


def with_nearest_flags(message: str, default: Any) -> str:
    """tyro's line, with the nearest field flags of each unrecognised one where tyro found none
    (`--lr`: --learner.learning-rate; `--max-tokens`: --decode.max-new-tokens)."""
    match = _UNRECOGNIZED.search(message)
    if match is None or "Perhaps you meant" in message:
        return message
    unknown = [w for w in re.split(r"[,\s]+", match.group(1)) if w.startswith("--")]
    flags = ["--" + path.replace("_", "-") for path in field_paths(default)]
    hints = [f"{flag}: did you mean {', '.join(near)}?" for flag in unknown if (near := nearest_flags(flag, flags))]
    if not hints:
        return message
    return message.replace(" -- For full helptext", " -- " + "; ".join(hints) + " -- For full helptext", 1)


def with_section_help(message: str, default: Any) -> str:
    """tyro's closing "For full helptext, run PROG --help" pointed at the section of the flag the
    line is about (`every train flag: PROG --help train`), whose help is a page, not 900 lines."""
    sections = {f.name for f in dataclasses.fields(default) if dataclasses.is_dataclass(getattr(default, f.name))}
    named = [s for s in re.findall(r"--([a-z][\w-]*)\.", message) if s.replace("-", "_") in sections]
    if not named:
        return message
    section = named[0].replace("-", "_")
    return _FULL_HELPTEXT.sub(lambda m: f"every {section} flag: {m.group(1)} --help {section}", message, count=1)


def field_paths(value: Any, prefix: str = "") -> list[str]:
    """Every leaf field of a config as a dotted path (`learner.learning_rate`)."""
    paths = []
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            paths += field_paths(child, f"{prefix}{f.name}.")
        else:
            paths.append(prefix + f.name)
    return paths


def nearest_flags(flag: str, flags: Sequence[str], n: int = 3) -> list[str]:
    """The flags nearest `flag`: by the whole path, by the last part (`--max-tokens` ~
    `--decode.max-new-tokens`), and by the last part's initials (`--lr` = learning-rate)."""
    want = flag.lstrip("-").replace("_", "-")
    tail = want.rsplit(".", 1)[-1]
    last = {f: f.lstrip("-").rsplit(".", 1)[-1] for f in flags}
    initials = [f for f in flags if len(tail) > 1 and "".join(w[:1] for w in last[f].split("-")) == tail]
    by_tail = [f for t in difflib.get_close_matches(tail, set(last.values()), n, 0.75) for f in flags if last[f] == t]
    by_path = difflib.get_close_matches("--" + want, flags, n, 0.8)
    return list(dict.fromkeys([*by_path, *initials, *by_tail]))[:n]
