"""Naming parameters by their path, and choosing some of them by regex (Pax's var regexes).

Pax chooses variables by a regex on their path: `bprop_variable_exclusion` (frozen variables),
`MultiOptimizer`'s `(regex, optimizer)` pairs, `init_from_checkpoint_rules`. pax_eqx names a
parameter by the attribute path from the model down, joined by dots, a list index as a number:

    embedding.w
    stack.layers.attention.w_qkv          a stack scanned over layers ([layers, ...] arrays)
    stack.layers.0.attention.w_qkv        a stack kept as a Python list (repeat=False)
    final_norm.scale

A pattern matches a parameter when `re.fullmatch(pattern, name)` (the whole name: `attention`
does not match `stack.layers.attention.w_qkv`, `.*attention.*` does). `param_names(model)`
lists the names of a model's (or params pytree's) arrays.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from pax_eqx.config import ConfigError


def path_name(path: tuple) -> str:
    """`(GetAttrKey('stack'), GetAttrKey('layers'), SequenceKey(0), ...)` -> "stack.layers.0..."."""
    return jtu.keystr(path, simple=True, separator=".")


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or hasattr(x, "shape")


def param_names(params: Any) -> list[str]:
    """The names of the arrays of `params` (a model, or its `eqx.filter(model, eqx.is_array)`), in
    pytree order."""
    leaves, _ = jtu.tree_flatten_with_path(params)
    return [path_name(path) for path, leaf in leaves if _is_array_like(leaf)]


def check_patterns(field: str, patterns: Any) -> None:
    """Each pattern is a string that compiles as a regex; else a ConfigError naming `field`."""
    if not isinstance(patterns, (tuple, list)):
        raise ConfigError(f"{field}={patterns!r} must be a tuple of regexes on parameter names.")
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise ConfigError(
                f"{field} holds {p!r}, not a regex on parameter names (e.g. 'stack\\.layers\\.attention\\..*')."
            )
        try:
            re.compile(p)
        except re.error as e:
            raise ConfigError(f"{field} holds {p!r}, which is not a valid regex ({e}); fix the pattern.") from None


def matches(pattern: str, name: str) -> bool:
    return re.fullmatch(pattern, name) is not None


def label_params(params: Any, label_of: Callable[[str], Any]) -> Any:
    """A pytree like `params` with `label_of(name)` for each leaf (None leaves stay empty)."""
    return jtu.tree_map_with_path(lambda path, _: label_of(path_name(path)), params)


def mask_of(params: Any, patterns: Sequence[str]) -> Any:
    """A pytree like `params`: True where the leaf's name fully matches one of `patterns`."""
    return label_params(params, lambda name: any(matches(p, name) for p in patterns))


def require_matches(field: str, patterns: Sequence[str], params: Any) -> None:
    """A pattern that matches no parameter is a typo: ConfigError naming it and a few names."""
    names = param_names(params)
    for p in patterns:
        if not any(matches(p, n) for n in names):
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise ConfigError(
                f"{field}: the pattern {p!r} matches no parameter (fully, with re.fullmatch); the model's parameters "
                f"are named like {shown}. Fix the pattern."
            )
