"""Choices on the command line: `--learner.optimizer sgd` switches a variant, before tyro parses.

A choice is a config field annotated with a union of `config.Variant` classes (the optimizer,
the schedule, a norm, the tokenizer). tyro would make such a union a positional subcommand
(`learner.optimizer:sgd`) whose fields must follow it; here the experiment's value is switched
first and tyro then parses the chosen variant's fields like any nested config (`specialise`
annotates the field with the variant's class). So:

    --learner.optimizer sgd                     switch (the variant's own defaults, shared
                                                fields carried over: `switch_variant`)
    --learner.optimizer.momentum 0.0            a field of the chosen variant, before or after
                                                the switch, in any order
    --learner.schedule.kind cosine              the older spelling of a switch, still accepted
    --learner.optimizer.momentum 0.0            with learner.optimizer adamw: refused, naming the
                                                variants that read momentum and the switch
    --learner.momentum 0.0                      a field that moved into a choice: refused, naming
                                                its new flag

Naming the variant the experiment already has keeps the experiment's values (a no-op).

A config may list choices whose variants' fields are also flags of the config itself
(`DataConfig.flattened = ("source",)`): `--data.path DIR` is `--data.source.path DIR`, so a
source's fields read as they did when they were the data's own.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Sequence
from typing import Any

from pax_eqx.config import ConfigError, field_hints, field_names, switch_variant, variant_choices


class ChoiceError(ConfigError):
    """A switch to an unknown variant, or a field flag of a variant that is not chosen."""


def choice_fields(value: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, type]]]:
    """(dotted path, {kind: class}) of every choice in the config tree `value`, outer ones first."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return
    hints = field_hints(type(value))
    for f in dataclasses.fields(value):
        path = prefix + f.name
        choices = variant_choices(hints[f.name])
        if choices:
            yield path, choices
        yield from choice_fields(getattr(value, f.name), path + ".")


def _flags(args: Sequence[str]) -> Iterator[tuple[int, str, str | None, int]]:
    """(index, dotted path, inline or next value, how many args it spans) of each `--a.b-c` flag."""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            i += 1
            continue
        flag, eq, inline = arg[2:].partition("=")
        path = flag.replace("-", "_")
        if eq:
            yield i, path, inline, 1
        else:
            following = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            yield i, path, following, 2 if following is not None else 1
        i += 1


def _get(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = getattr(value, part)
    return value


def apply_switches(default: Any, args: Sequence[str]) -> tuple[Any, list[str]]:
    """`default` with every switch of `args` applied, and the args left for tyro.

    Raises ChoiceError for an unknown variant name, a field flag of a variant that is not the
    chosen one, and a flag of a field that moved into a choice."""
    args = spell_flattened(default, args)
    switched = default
    choices = dict(choice_fields(default))
    used: set[int] = set()
    for i, path, value, span in _flags(args):
        target = path[: -len(".kind")] if path.endswith(".kind") and path[: -len(".kind")] in choices else path
        if target not in choices:
            continue
        if value is None:
            raise ChoiceError(
                f"--{target.replace('_', '-')} needs a variant name: one of {', '.join(choices[target])}."
            )
        name = value.strip().lower()
        options = choices[target]
        if name not in options:
            close = difflib.get_close_matches(name, options, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ChoiceError(f"--{target.replace('_', '-')} {value!r} is not one of {', '.join(options)}.{hint}")
        current = _get(switched, target)
        if current.kind != name:
            switched = switched.override(target, switch_variant(current, options[name], check=False))
        used.update(range(i, i + span))
    rest = [a for i, a in enumerate(args) if i not in used]
    _refuse_unchosen_fields(switched, rest)
    return switched, rest


def _flattened_choices(value: Any, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(the config's dotted path, the choice field, the config) for each choice a config in `value`'s
    tree lists in its `flattened`."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return
    for name in getattr(type(value), "flattened", ()):
        yield prefix.rstrip("."), name, value
    for f in dataclasses.fields(value):
        yield from _flattened_choices(getattr(value, f.name), prefix + f.name + ".")


def spell_flattened(default: Any, args: Sequence[str]) -> list[str]:
    """`args` with each flattened field flag spelt in full (`--data.path` -> `--data.source.path`):
    a flag whose first field after a config is no field of that config but is one of a variant of
    a choice it flattens (any variant: one not chosen is then refused by name)."""
    args = list(args)
    hints_of = {}
    for owner, choice, node in _flattened_choices(default):
        hints_of.setdefault(type(node), field_hints(type(node)))
        options = variant_choices(hints_of[type(node)][choice])
        variant_fields = {name for cls in options.values() for name in field_names(cls)}
        own = set(field_names(node))
        for i, path, _, _ in _flags(args):
            head = owner + "." if owner else ""
            if not path.startswith(head):
                continue
            first = path[len(head) :].split(".")[0]
            bare = first[3:] if first.startswith("no_") and first[3:] in variant_fields else first
            if bare in own or bare not in variant_fields:
                continue
            flag, eq, inline = args[i][2:].partition("=")
            dash = flag[len(head) :]
            args[i] = f"--{head.replace('_', '-')}{choice.replace('_', '-')}.{dash}" + (eq + inline if eq else "")
    return args


def _refuse_unchosen_fields(value: Any, args: Sequence[str]) -> None:
    choices = dict(choice_fields(value))
    for _, path, _, _ in _flags(args):
        inside = [c for c in choices if path.startswith(c + ".")]
        if not inside:
            owner, _, name = path.rpartition(".")
            _refuse_moved_field(value, owner, name, choices)
            continue
        owner = max(inside, key=len)  # the innermost choice the flag is under
        name = path[len(owner) + 1 :].split(".")[0]
        chosen = _get(value, owner)
        own = field_names(chosen)
        if name.startswith("no_") and name[3:] in own:
            continue
        if name in own:
            continue
        readers = [k for k, cls in choices[owner].items() if name in field_names(cls) or name[3:] in field_names(cls)]
        if readers:
            # The variant most like the chosen one first (the most shared base classes): an image
            # source for an image source's missing path, not the first text source.
            # (then the most similar name: digits_images for digits).
            readers.sort(key=lambda k: (-len(set(type(chosen).__mro__) & set(choices[owner][k].__mro__)),
                                        -difflib.SequenceMatcher(None, chosen.kind, k).ratio()))  # fmt: skip
            flag = owner.replace("_", "-")
            raise ChoiceError(
                f"--{path.replace('_', '-')}: {owner} is {chosen.kind!r} here, which has no {name}; "
                f"{', '.join(readers)} {'reads' if len(readers) == 1 else 'read'} it. Switch with --{flag} "
                f"{readers[0]}, or drop the flag."
            )


def _refuse_moved_field(value: Any, owner: str, name: str, choices: dict[str, dict[str, type]]) -> None:
    """`--learner.momentum`: a field of no config at `owner`, but of a variant of a choice there."""
    try:
        parent = _get(value, owner) if owner else value
    except AttributeError:
        return
    if not dataclasses.is_dataclass(parent) or name in field_names(parent):
        return
    for path, options in choices.items():
        if path.rpartition(".")[0] != owner:
            continue
        readers = [k for k, cls in options.items() if name in field_names(cls)]
        if readers:
            chosen = _get(value, path)
            where = f"--{path}.{name}".replace("_", "-")
            note = (
                ""
                if chosen.kind in readers
                else f" (with --{path.replace('_', '-')} {readers[0]}; it is {chosen.kind!r} here)"
            )
            raise ChoiceError(
                f"--{owner}.{name}".replace("_", "-")
                + f": {name} belongs to the {path} choice now ({', '.join(readers)}): "
                f"pass {where}{note}."
            )
