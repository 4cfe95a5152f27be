"""Configs: frozen dataclasses that play the role of Pax's templates (`pax_fiddle.Config`).

A config is data: it names a layer's hyperparameters and, as nested configs, the templates of
its children. `cfg.build(key)` makes the (immutable) module. Configs are what tyro parses on
the command line and what the job dir's `config.json` stores.

Why our own decorator rather than bare `dataclasses.dataclass`: Pax promises that a typo
raises immediately, *with* the field named. A plain dataclass says "unexpected keyword
argument 'hiden_dims'"; ours adds "did you mean 'hidden_dims'?" and lists the valid fields,
and the same check guards `replace`, dotted overrides and JSON loading.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A config was given a field, value or combination it cannot take: a user error, reported
    in one line (exit 2) by the entry points. Raise it (or a subclass) for anything the user can
    fix; a plain ValueError means a bug in pax_eqx and keeps its traceback."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file or directory the user named (a data path, a tokenizer model, a job dir's
    checkpoint) does not exist or holds nothing usable."""


def _suggest(name: str, choices: typing.Iterable[str]) -> str:
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Valid fields: {', '.join(choices)}."


def field_names(cls_or_cfg: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls_or_cfg)]


def check_fields(cls: type, names: typing.Iterable[str]) -> None:
    """Raises ConfigError naming the first unknown field, with a suggestion."""
    valid = field_names(cls)
    for name in names:
        if name not in valid:
            raise ConfigError(f"{cls.__name__} has no field {name!r}.{_suggest(name, valid)}")


def require_positive(cfg: Any, names: typing.Iterable[str], prefix: str | None = None) -> None:
    """ConfigError naming the first of `names` whose value in `cfg` is not > 0. `prefix` is how
    the error names the config ("model", "SoftmaxConfig"); its class name by default."""
    prefix = type(cfg).__name__ if prefix is None else prefix
    for name in names:
        value = getattr(cfg, name)
        if not value > 0:
            raise ConfigError(f"{prefix}.{name} must be > 0, got {value}.")


def config(cls: type[T]) -> type[T]:
    """Makes `cls` a frozen, keyword-only dataclass whose constructor names unknown fields."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        if args:
            raise ConfigError(
                f"{cls.__name__} takes keyword arguments only, e.g. {cls.__name__}({field_names(cls)[0]}=...)."
            )
        check_fields(cls, kwargs)
        original_init(self, **kwargs)

    cls.__init__ = __init__
    return cls


@config
class Config:
    """Base of every pax_eqx config. Subclasses are decorated with `@config`."""

    def replace(self: T, **changes: Any) -> T:
        """Returns a copy with `changes` applied (Pax's `tpl.clone().set(...)`)."""
        check_fields(type(self), changes)
        return dataclasses.replace(self, **changes)

    def override(self: T, dotted: str, value: Any) -> T:
        """Returns a copy with the nested field at `dotted` (e.g. "model.num_layers") set."""
        head, _, rest = dotted.partition(".")
        check_fields(type(self), [head])
        if rest:
            child = getattr(self, head)
            if not isinstance(child, Config):
                raise ConfigError(f"{type(self).__name__}.{head} is not a config; cannot set {rest!r}.")
            value = child.override(rest, value)
        return dataclasses.replace(self, **{head: value})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return _from_jsonable(cls, data, cls.__name__)

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return "nan"
    return value


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _concrete_config(tp: type, value: dict[str, Any]) -> type:
    """The class a JSON object of a polymorphic field (`model: ModelConfig`) was written from:
    `tp` itself or the (imported) subclass whose fields are exactly the object's keys."""
    if set(value) <= set(field_names(tp)):
        return tp
    matches = [sub for sub in _subclasses(tp) if dataclasses.is_dataclass(sub) and set(field_names(sub)) == set(value)]
    return matches[0] if len(matches) == 1 else tp


def _from_jsonable(tp: Any, value: Any, where: str) -> Any:
    """Rebuilds a value of (annotated) type `tp` from its JSON form."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object for {tp.__name__}, got {value!r}.")
        tp = _concrete_config(tp, value)
        check_fields(tp, value)
        hints = typing.get_type_hints(tp)
        return tp(**{k: _from_jsonable(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _from_jsonable(option, value, where)
            except (ConfigError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} matches none of {tp}: {errors}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {get_args(tp)}.")
        return value
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_jsonable(args[0], v, where) for v in value)
        return tuple(_from_jsonable(a, v, where) for a, v in zip(args, value, strict=True))
    if origin is dict:
        return dict(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float:
        return float(value)
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an int, got {value!r}.")
    return value
