"""`--help` and `--help SECTION`: what a person reads first, at the terminal's width, nothing cut.

    --help            an overview: the program's own flags, the experiments, the sections of
                      --exp (each with its fields' names) and the most used flags, each with the
                      first sentence of its help, whole
    --help SECTION    one section (`learner`, `data.train`, `model.block`), every flag of it with
                      its whole help and the experiment's value, the nested configs after
    --help-all        tyro's listing of every field of every section (cli.py)

Why a listing beside tyro's: tyro prints every nested field with its help over several lines
(888 lines for the default experiment), where a person first wants to find a flag's name and what
it does, then read one section. Every line here is broken at spaces (`width.py`), so a flag is
never split and no help is cut short with "...".
"""

from __future__ import annotations

import dataclasses
import difflib
import shutil
import types
import typing
from typing import Any

from pax_eqx.command_line import registry
from pax_eqx.command_line.width import fill, fill_groups, wrap
from pax_eqx.config import field_hints, variant_choices

# The flags a run changes most, shown with their sentence in the overview (those the experiment
# and the program have); `--help SECTION` has the rest.
MOST_USED = (
    "model.num_layers", "model.model_dims", "model.num_heads",
    "learner.optimizer", "learner.learning_rate", "learner.schedule",
    "data.source", "data.path", "data.seq_len", "data.train.batch_size", "data.eval.batch_size",
    "train.num_steps", "train.eval_interval_steps",
    "checkpoint.every_n_steps",
    "mesh.ici_mesh_shape",
    "decode.strategy", "decode.prompt", "decode.max_new_tokens",
)  # fmt: skip
HELP_COLUMN = 32  # where the overview's sentences start


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
    lines = [fill(", ".join(shown), width, "  ")]
    if paxml:
        counts = ", ".join(f"{module} {count}" for module, count in sorted(paxml.items()))
        lines.append(fill(f"and {sum(paxml.values())} of Paxml's classes by their names (--exp NVIDIA5B): {counts}",
                          width, "  "))  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- the overview


def short_help(default: Any, width: int | None = None, sections: tuple[str, ...] | None = None) -> str:
    """The overview of the experiment `default`: each section with its fields' names, then the
    most used flags with their first sentence; with `sections`, only those (the ones a program
    reads: eval's data, train, checkpoint, mesh) and one line naming the others."""
    width = max(width or shutil.get_terminal_size().columns, 60)
    lines = wrap(
        f"the sections of --exp {default.name or 'NAME'} (--help SECTION: every flag of one with its whole help, "
        "e.g. --help learner, --help data.train; --help-all: every section):",
        width,
    )
    others = []
    for name, child in _sections(default):
        if sections is not None and name not in sections:
            others.append(name)
        elif getattr(child, "enabled", True) is False:
            n = len(dataclasses.fields(child))
            lines += wrap(
                f"{name} ({type(child).__name__}): off; its {n} fields do nothing until it is turned on "
                f"(--help {name}).",
                width, "      ", first="  ",
            )  # fmt: skip
        else:
            lines += fill_groups(_field_names(child), width, f"  {name} ({type(child).__name__}):", "      ")
    if others:
        lines += wrap(
            f"{', '.join(others)}: as the run saved them (--help SECTION lists their flags too).",
            width, "      ", first="  ",
        )  # fmt: skip
    shown = [(flag, value, text) for path in MOST_USED if (found := _most_used(default, path, sections))
             for flag, value, text in [found]]  # fmt: skip
    if shown:
        lines += ["", *wrap(f"the most used flags ({default.name or 'the experiment'}'s values):", width)]
        for flag, value, text in shown:
            lines += _two_columns(f"  {flag} {value}".rstrip(), text, width)
    return "\n".join(lines)


def _sections(default: Any) -> list[tuple[str, Any]]:
    """(name, config) of the experiment's sections: its config-valued fields."""
    return [
        (f.name, getattr(default, f.name))
        for f in dataclasses.fields(default)
        if dataclasses.is_dataclass(getattr(default, f.name))
    ]


def _field_names(value: Any) -> list[str]:
    """The names of a config's flags as they are typed after `--SECTION.`: `num-layers`, a nested
    config as `block.*`; a tuple of configs (set in Python only) is left out."""
    hints = field_hints(type(value))
    names = []
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        name = f.name.replace("_", "-")
        if variant_choices(hints[f.name]):
            names.append(name)
        elif dataclasses.is_dataclass(child):
            names.append(name + ".*")
        elif not _configs_tuple(hints[f.name]):
            names.append(name)
    return [n + "," for n in names[:-1]] + names[-1:]


def _most_used(default: Any, path: str, sections: tuple[str, ...] | None) -> tuple[str, str, str] | None:
    """(flag, the experiment's value, the first sentence of its help) of the field `path`, or None
    where the experiment has no such field or the program does not read its section. A choice's
    flattened field (`data.path`, the source's) is found in the chosen variant."""
    *owners, name = path.split(".")
    if sections is not None and owners[0] not in sections:
        return None
    node = default
    for part in owners:
        node = getattr(node, part, None)
    if node is None or not dataclasses.is_dataclass(node):
        return None
    holder = node
    if name not in {f.name for f in dataclasses.fields(node)}:
        holder = next(
            (getattr(node, c) for c in getattr(type(node), "flattened", ())
             if name in {f.name for f in dataclasses.fields(getattr(node, c))}),
            None,
        )  # fmt: skip
        if holder is None:
            return None
    value = getattr(holder, name)
    hint = field_hints(type(holder))[name]
    text = registry.first_sentence(_helps(type(holder)).get(name, ""))
    if variant_choices(hint):  # its sentence names the variants, or --help SECTION lists them
        return "--" + _dashed(path), value.kind, text
    if dataclasses.is_dataclass(value):
        return None
    if hint is bool:
        return ("--" + _dashed(path) if value else "--" + _negated(path)), "", text
    return "--" + path.replace("_", "-"), _value_text(value), text


def _two_columns(left: str, text: str, width: int) -> list[str]:
    """`left` (a flag and its value), then `text` from column HELP_COLUMN, broken at spaces; when
    `left` reaches the column, the text starts on the next line."""
    column = min(HELP_COLUMN, width // 2)
    indent = " " * column
    if not text:
        return wrap(left, width, " " * 6)
    if len(left) < column - 1:
        return wrap(text, width, indent, first=left.ljust(column))
    return [*wrap(left, width, " " * 6), *wrap(text, width, indent)]


# ----------------------------------------------------------------------------- one section in full


def section_paths(default: Any) -> list[str]:
    """Every config a `--help SECTION` can name: the sections and the configs inside them, a
    choice by its field (`learner.optimizer`, its chosen variant)."""
    paths = []
    for name, child in _sections(default):
        paths.append(name)
        paths += _nested_paths(child, name)
    return paths


def _nested_paths(value: Any, prefix: str) -> list[str]:
    paths = []
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        if dataclasses.is_dataclass(child):
            paths.append(f"{prefix}.{f.name}")
            paths += _nested_paths(child, f"{prefix}.{f.name}")
    return paths


def unknown_section(default: Any, name: str) -> str:
    """The one error line for `--help NAME` naming no section: the sections, and the nearest paths."""
    paths = section_paths(default)
    near = difflib.get_close_matches(name.replace("-", "_"), paths, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(near)}?" if near else ""
    tops = ", ".join(n for n, _ in _sections(default))
    return (
        f"--help {name}: --exp {default.name or 'NAME'} has no section {name!r}.{hint} Its sections: {tops}; a config "
        "inside one by its path (data.train, model.block); --help alone lists them."
    )


def section_help(default: Any, path: str, width: int | None = None) -> str | None:
    """Every flag of the config at `path` (`learner`, `data.train`, `learner.optimizer`) with its
    whole help, the experiment's value as its default, then the configs nested in it; None when
    `path` names no config of `default`."""
    width = max(width or shutil.get_terminal_size().columns, 60)
    path = path.replace("-", "_")
    if path not in section_paths(default):
        return None
    owner, value, help_text = default, default, ""
    for part in path.split("."):
        owner, value = value, getattr(value, part)
    help_text = _helps(type(owner)).get(path.rsplit(".", 1)[-1], "")
    hint = field_hints(type(owner))[path.rsplit(".", 1)[-1]]
    choices = variant_choices(hint)
    lines = wrap(
        f"--help {path} of --exp {default.name or 'NAME'}: each flag with its type and whole help, the experiment's "
        "value as its default.",
        width,
    )
    if choices:  # the choice's own flag first: which variant, and the others
        note = f"its fields below; another's: --{_dashed(path)} NAME --help {path}"
        lines += ["", *_flag_lines(path, list(choices), value.kind, help_text, width, note=note)]
    flattened = path.rsplit(".", 1)[-1] in getattr(type(owner), "flattened", ())
    lines += ["", *_config_lines(path, value, help_text, choices, width, flattened)]
    return "\n".join(lines)


def _config_lines(
    path: str, value: Any, help_text: str, choices: dict[str, type], width: int, flattened: bool = False
) -> list[str]:
    """A config's header (with `help_text`, its help in the config that holds it, unless a choice's
    flag line there has said it), its prose, its own flags, then each config nested in it.
    flattened: a choice its holder flattens (`--data.path` is `--data.source.path`)."""
    cls = type(value)
    title = f"{path} ({cls.__name__}" + (f", the choice {value.kind}" if choices else "")
    if flattened:
        title += f"; its flags also spelt --{_dashed(path.rsplit('.', 1)[0])}.FIELD"
    title += ")"
    if getattr(value, "enabled", True) is False:
        title += ": off as the experiment stands; its fields do nothing until it is turned on"
    if help_text and not choices:
        title += f": {help_text}"
    lines = wrap(title, width)
    prose, helps = _prose_and_helps(cls)
    for paragraph in prose.split("\n\n") if prose else []:
        lines += wrap(paragraph, width, "  ")
    hints = field_hints(cls)
    nested, python_only = [], []
    for f in dataclasses.fields(value):
        child, hint, flag_path = getattr(value, f.name), hints[f.name], f"{path}.{f.name}"
        child_choices = variant_choices(hint)
        if child_choices:
            lines += _flag_lines(flag_path, list(child_choices), child.kind, helps.get(f.name, ""), width,
                                 note=f"its fields: {flag_path} below; another's: --{_dashed(flag_path)} NAME "
                                 f"--help {flag_path}")  # fmt: skip
        if dataclasses.is_dataclass(child):
            nested.append((f.name, child, child_choices))
        elif _configs_tuple(hint):
            python_only.append(f.name)
        else:
            lines += _flag_lines(flag_path, hint, child, helps.get(f.name, ""), width)
    for name in python_only:
        element = next(a for a in typing.get_args(hints[name]) if dataclasses.is_dataclass(a)).__name__
        lines += wrap(
            f"{path}.{name}: a tuple of {element}, set in Python only (no flag; README, \"Write your own "
            f"experiment\"): {helps.get(name, '')}".rstrip(": "),
            width, "      ", first="  ",
        )  # fmt: skip
    for name, child, child_choices in nested:
        flat = name in getattr(cls, "flattened", ())
        lines += ["", *_config_lines(f"{path}.{name}", child, helps.get(name, ""), child_choices, width, flat)]
    return lines


def _flag_lines(path: str, hint: Any, value: Any, help_text: str, width: int, note: str = "") -> list[str]:
    """One flag: its spelling with its type (`hint`, or a choice's variants as a list), then its
    whole help, the experiment's value and `note`."""
    options = hint if isinstance(hint, list) else _literal_options(hint)
    if hint is bool:
        flag = f"--{_dashed(path)}, --{_negated(path)}"
    elif options:
        braces = "{" + ",".join(options) + "}"
        flag = f"--{_dashed(path)} {braces if len(braces) <= 24 else 'NAME'}"
    else:
        flag = f"--{_dashed(path)} {_metavar(hint)}"
    listed = f"one of {', '.join(options)}; " if options and flag.endswith(" NAME") else ""
    text = f"{help_text} ({listed}default: {_value_text(value)}{'; ' + note if note else ''})".strip()
    return [*fill_groups([flag], width, "  ", "      "), *wrap(text, width, " " * 6)]


def _metavar(hint: Any) -> str:
    """tyro's metavar of a field's type: INT, FLOAT, STR, {a,b}, [INT [INT ...]]."""
    if typing.get_origin(hint) is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = _metavar(args[0]) if args else "VALUE"
        return f"[{inner} [{inner} ...]]"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _metavar(args[0]) if len(args) == 1 else "VALUE"
    return {int: "INT", float: "FLOAT", str: "STR"}.get(hint, getattr(hint, "__name__", "VALUE").upper())


def _literal_options(hint: Any) -> list[str]:
    """The values of a Literal (or a union of Literals), as text; [] for any other type."""
    if typing.get_origin(hint) is typing.Literal:
        return [str(a) for a in typing.get_args(hint)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_literal_options(a) for a in typing.get_args(hint)]
        if parts and all(parts):
            return [option for part in parts for option in part]
    return []


def _configs_tuple(hint: Any) -> bool:
    """A tuple of configs: tyro has no flag syntax for it (cli.python_only_fields)."""
    return typing.get_origin(hint) is tuple and any(dataclasses.is_dataclass(a) for a in typing.get_args(hint))


def _helps(cls: type) -> dict[str, str]:
    return _prose_and_helps(cls)[1]


def _prose_and_helps(cls: type) -> tuple[str, dict[str, str]]:
    from pax_eqx.command_line.cli import _field_helps  # the docstring reader --help-all uses too

    return _field_helps(cls)


def _dashed(path: str) -> str:
    return path.replace("_", "-")


def _negated(path: str) -> str:
    """`train.no-sample-at-end` for `train.sample_at_end`: tyro's flag that sets a boolean False."""
    owner, _, name = path.rpartition(".")
    return _dashed(f"{owner}.no_{name}" if owner else f"no_{name}")


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value == "" else value
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "()"
    return str(value)
