"""Every flag takes effect or is refused: a field flag whose value the run would ignore.

A config says which of its fields have no effect *as it stands* in `inert_fields()` (for a
data source that reads no files: `path`; for greedy decoding: `top_k`, `top_p`). After the
flags are parsed, each flag the user gave is looked up along its path, in every config it
passes through (`--model.network.block.ff-paddings`: the ViT network lists `block.ff_paddings`),
and a listed one is refused naming the flag and the reason. Only the flags given are checked,
so an experiment's own settings are never refused: a default is never in the way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pax_eqx.config import ConfigError


class InertFlagError(ConfigError):
    """A flag the user gave whose value the run would ignore."""


def _flag_paths(args: Sequence[str]) -> list[tuple[str, str]]:
    """(the flag as typed, its dotted field path) for each `--a.b-c` in `args`."""
    found = []
    for arg in args:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            found.append((flag, flag[2:].replace("-", "_")))
    return found


def _field_path(root: Any, path: str) -> list[str] | None:
    """The field names of `path` from `root` (a boolean's `no_x` read as `x`); None if not a field."""
    node, parts = root, path.split(".")
    names = []
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(node):
            return None
        fields = {f.name for f in dataclasses.fields(node)}
        if part not in fields and i == len(parts) - 1 and part.startswith("no_") and part[3:] in fields:
            part = part[3:]
        if part not in fields:
            return None
        names.append(part)
        node = getattr(node, part)
    return names


def refuse_inert_flags(value: Any, args: Sequence[str]) -> None:
    """InertFlagError for the first flag of `args` that a config on its path lists as inert."""
    for flag, path in _flag_paths(args):
        names = _field_path(value, path)
        if not names:
            continue
        node = value
        for depth in range(len(names)):
            inert = node.inert_fields() if hasattr(node, "inert_fields") else {}
            rest = names[depth:]
            for cut in range(1, len(rest) + 1):
                reason = inert.get(".".join(rest[:cut]))
                if reason:
                    raise InertFlagError(f"{flag} has no effect: {reason}. Remove it.")
            node = getattr(node, names[depth])
