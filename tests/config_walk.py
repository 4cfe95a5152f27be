"""The walk over a config's fields that the every-flag tests share: each leaf field's path, its
type and value, the values to try instead, and digests that say whether two builds differ."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import typing
from typing import Any, Literal

import equinox as eqx
import jax
import numpy as np

from pax_eqx.config import Config
from pax_eqx.learners.optimizers import VariableGroupConfig


def digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
    return h.hexdigest()


def jaxpr_text(fn, *args) -> str:
    """The jaxpr as text, without the object addresses jax prints for some callables."""
    return re.sub(r" at 0x[0-9a-f]+", "", str(jax.make_jaxpr(fn)(*args)))


def arrays_digest(tree: Any) -> str:
    leaves, treedef = jax.tree.flatten(tree)
    arrays = [np.asarray(leaf) for leaf in leaves if eqx.is_array(leaf)]
    return digest(treedef, [(a.shape, a.dtype) for a in arrays], *(a.tobytes() for a in arrays))


def leaf_paths(cfg: Config, prefix: str = "") -> list[str]:
    paths = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, Config):
            paths += leaf_paths(value, f"{prefix}{f.name}.")
        else:
            paths.append(prefix + f.name)
    return paths


def field_type(cfg: Config, path: str) -> Any:
    *parents, name = path.split(".")
    for parent in parents:
        cfg = getattr(cfg, parent)
    return _type_hints(type(cfg))[name], getattr(cfg, name)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A config class's resolved annotations: resolving them is most of what collecting the walk
    costs, and a class's never change."""
    return typing.get_type_hints(cls)


def new_values(tp: Any, value: Any) -> list[Any]:
    """Values to try instead of `value`, the likeliest valid first."""
    if typing.get_origin(tp) is Literal:
        candidates = list(typing.get_args(tp))
    elif value is None and bool in typing.get_args(tp):  # `bool | None`: None = another field's default
        candidates = [True, False]
    elif isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, int):
        candidates = [value + 1, value * 2, value + 2]
    elif isinstance(value, float):
        candidates = [value / 2, value * 2, 0.5, 0.1]
    elif typing.get_origin(tp) is tuple and typing.get_origin(typing.get_args(tp)[0]) is Literal:  # a set of names
        names = typing.get_args(typing.get_args(tp)[0])
        candidates = [value[:-1], value[1:]] if value else [names[:1], names[-1:]]
    elif typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is str:
        candidates = [value + ("w",)]  # a regex on parameter names: _PARAMS's "w"
    elif typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is VariableGroupConfig:
        candidates = [value + (VariableGroupConfig(pattern="w", lr_multiplier=0.5),)]
    elif isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        candidates = [(value[0] * 2,) + value[1:], value + value[-1:]] if value else [(4,)]
    elif isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        candidates = [(value[0] / 2,) + value[1:], value + (0.5,)] if value else [(0.5,)]
    elif isinstance(value, str):
        candidates = [value + "_changed"]
    else:
        raise TypeError(f"no perturbation for {tp} (value {value!r}); teach _new_values this type.")
    return list(dict.fromkeys(c for c in candidates if c != value))
