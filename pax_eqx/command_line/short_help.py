"""`--help`: what a person reads first, in about a screenful per section (`--help-all` has the rest).

    the program's own flags (argparse's listing)
    the experiments, names only, wrapped
    each section of --exp (model, learner, data, ...): one line per field with the first
    sentence of its own help; a choice shows the chosen variant and the others, a nested config
    one line that points at --help-all

Why a second listing beside tyro's: tyro prints every nested field with its help wrapped over
several lines (888 lines for the default experiment), where a person wants to find a flag's
name and what it does. The full listing stays one flag away.
"""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from typing import Any

from pax_eqx.command_line import registry
from pax_eqx.config import field_hints, variant_choices


def experiments_line(width: int) -> str:
    """The registered experiments, wrapped: pax_eqx's own by name, three or more that share their
    first three words once as `prefix_{a, b, c}`; the ports of Paxml's registered classes (those
    with an alias `tasks.<...>.params.<module>.<Class>`) as a count per Paxml module, since a
    Pax user types their class names and --help-all lists each."""
    registry.load_entry_points()
    paxml: dict[str, int] = {}
    for alias in {a: n for a, n in registry.aliases().items() if a.startswith("tasks.")}:
        module = alias.split(".")[-2]
        paxml[module] = paxml.get(module, 0) + 1
    ported = {n for a, n in registry.aliases().items() if a.startswith("tasks.")}
    groups: dict[str, list[str]] = {}
    for name in registry.names():
        if name in ported:
            continue
        words = name.split("_")
        groups.setdefault("_".join(words[:3]) if len(words) > 3 else name, []).append(name)
    shown = []
    for prefix, members in groups.items():
        if len(members) < 3:
            shown += members
        else:
            rest = [m[len(prefix) + 1 :] if m != prefix else "" for m in members]
            shown.append(f"{prefix}_{{{', '.join(rest)}}}")
    fill = lambda text: textwrap.fill(text, width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    lines = [fill(", ".join(shown))]
    if paxml:
        counts = ", ".join(f"{module} {count}" for module, count in sorted(paxml.items()))
        lines.append(fill(f"and {sum(paxml.values())} of Paxml's classes by their names (--exp NVIDIA5B): {counts}"))
    return "\n".join(lines)


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value == "" else value
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "()"
    return str(value)


def section_lines(name: str, value: Any, width: int) -> list[str]:
    """One line per field of the config `value` (the section `name`): flag, value, its help."""
    from pax_eqx.command_line.cli import _field_helps  # the docstring reader --help-all uses too

    _, helps = _field_helps(type(value))
    hints = field_hints(type(value))
    lines = [f"{name} ({type(value).__name__}):"]
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        flag = f"--{name}.{f.name}".replace("_", "-")
        choices = variant_choices(hints[f.name])
        if choices:
            left = f"{flag} {child.kind}"
            text = "or " + ", ".join(k for k in choices if k != child.kind)  # the chosen one's fields: --help-all
        elif dataclasses.is_dataclass(child):
            left = f"{flag}.*"
            text = (
                f"{type(child).__name__}, {len(dataclasses.fields(child))} fields (--help-all). "
                + registry.first_sentence(helps.get(f.name, ""))
            )
        else:
            left = f"{flag} {_value_text(child)}"
            text = registry.first_sentence(helps.get(f.name, ""))
        line = f"  {left:<38} {text}".rstrip()
        lines.append(line if len(line) <= width else line[: width - 3].rstrip() + "...")
    return lines


def short_help(default: Any, width: int | None = None, sections: tuple[str, ...] | None = None) -> str:
    """The sections of the experiment `default`, each field on one line; with `sections`, only those
    (the ones a program reads, eval's data and checkpoint) and one line naming the others."""
    width = max(width or shutil.get_terminal_size().columns, 60)
    lines = [
        "the experiment's fields (its values shown; --help-all for every nested field with its whole help):",
    ]
    others = []
    for f in dataclasses.fields(default):
        child = getattr(default, f.name)
        if sections is not None and dataclasses.is_dataclass(child) and f.name not in sections:
            others.append(f.name)
        elif dataclasses.is_dataclass(child) and getattr(child, "enabled", True) is False:
            lines.append(_off_section_line(f.name, child, width))
        elif dataclasses.is_dataclass(child):
            lines += section_lines(f.name, child, width)
    if others:
        lines += textwrap.wrap(
            f"{', '.join(others)}: as the run saved them (python -m pax_eqx.train --help lists their fields).", width
        )
    return "\n".join(lines)


def _off_section_line(name: str, value: Any, width: int) -> str:
    """A section that is off as the experiment stands (`enabled` False: LoRA without targets) in one
    line: its fields do nothing until it is turned on, and --help-all lists them."""
    n = len(dataclasses.fields(value))
    line = f"{name} ({type(value).__name__}): off; its {n} fields (--{name}.FIELD) are listed by --help-all."
    return line if len(line) <= width else line[: width - 3].rstrip() + "..."
