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
import math
import numbers
import types
import typing
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")
Bound = int | float | None  # a bound of `check_number` (beartype does not take an int as a float)


class ConfigError(ValueError):
    """A config was given a field, value or combination it cannot take: a user error, reported
    in one line (exit 2) by the entry points. Raise it (or a subclass) for anything the user can
    fix; a plain ValueError means a bug in pax_eqx and keeps its traceback."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file or directory the user named (a data path, a tokenizer model, a job dir's
    checkpoint) does not exist or holds nothing usable."""


def _suggest(name: str, choices: typing.Iterable[str]) -> str:
    choices = sorted(choices)
    if not choices:
        return " It has no fields."
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


# The largest int a config may hold by default: steps, sizes and counts end up in int32 arrays
# and shapes, where anything larger overflows (or is absurd).
INT32_MAX = 2**31 - 1
# The largest seed: `jax.random.key` and grain keep 32 bits of a seed (without jax_enable_x64,
# 2**32 silently gives the key of 0), so a seed is an int in [0, SEED_MAX].
SEED_MAX = 2**32 - 1


def _bounds_text(ge: Bound, gt: Bound, le: Bound, lt: Bound) -> str:
    """ ">= 0", "> 0", "in [0, 1)", "<= 5": the bounds as the error states them."""
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else None
    high = f"{le}]" if le is not None else f"{lt})" if lt is not None else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if ge is not None else "> ") + low[1:]
    if high:
        return ("<= " if le is not None else "< ") + high[:-1]
    return ""


def check_number(
    where: str,
    value: Any,
    *,
    integer: bool = False,
    ge: Bound = None,
    gt: Bound = None,
    le: Bound = None,
    lt: Bound = None,
    note: str = "",
    fix: str = "",
) -> None:
    """ConfigError unless `value` is a number of the right kind within the bounds: an int (not a
    bool, not a float) when `integer`, else a finite int or float (no NaN, no +-inf); and
    `ge <= value`, `gt < value`, `value <= le`, `value < lt` for the bounds given. An int with
    no bound given on a side stays within int32 there (at most INT32_MAX).

    The message names `where` (the flag: "learner.schedule.warmup_steps"), the bound, the value
    and, when given, what a value means (`note`, e.g. "0 = off") and the `fix` (a sentence):
    `learner.schedule.warmup_steps must be >= 0, got -1.`"""
    bounds = _bounds_text(ge, gt, le, lt)
    meaning = f" ({note})" if note else ""
    tail = f" {fix}" if fix else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        kind = "an int" if integer else "a number"
        raise ConfigError(f"{where} must be {kind}{' ' + bounds if bounds else ''}{meaning}, got {value!r}.{tail}")
    if not integer and not math.isfinite(value):
        raise ConfigError(
            f"{where} must be a finite number{' ' + bounds if bounds else ''}{meaning}, got {value!r}.{tail}"
        )
    if (
        (ge is not None and not value >= ge)
        or (gt is not None and not value > gt)
        or (le is not None and not value <= le)
        or (lt is not None and not value < lt)
    ):
        raise ConfigError(f"{where} must be {bounds}{meaning}, got {value!r}.{tail}")
    if integer and le is None and lt is None and value > INT32_MAX:
        raise ConfigError(f"{where} must be <= {INT32_MAX} (int32), got {value!r}.{tail}")
    if integer and ge is None and gt is None and value < -INT32_MAX - 1:
        raise ConfigError(f"{where} must be >= {-INT32_MAX - 1} (int32), got {value!r}.{tail}")


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)`, resolved once per class: it evaluates every string
    annotation of the class and its bases, and the command line, the walks over choices and the
    JSON reader ask it of the same few classes thousands of times. (The dict is shared: read it.)"""
    return typing.get_type_hints(cls)


@functools.cache
def _numeric_kind(cls: type, name: str) -> tuple[bool, bool]:
    """(is an int, is a tuple of them) for the field `name` of the config class `cls`, from its
    annotation: int, float, tuple[int, ...], tuple[float, float], ..."""
    hint = field_hints(cls)[name]
    is_tuple = get_origin(hint) is tuple
    element_types = {a for a in get_args(hint) if a is not Ellipsis} if is_tuple else {hint}
    if element_types == {int}:
        return True, is_tuple
    if element_types <= {int, float} and element_types:
        return False, is_tuple
    raise TypeError(f"{cls.__name__}.{name} is annotated {hint}, not a number or a tuple of numbers.")


def check_range(
    cfg: Any,
    names: str | typing.Iterable[str],
    *,
    prefix: str | None = None,
    ge: Bound = None,
    gt: Bound = None,
    le: Bound = None,
    lt: Bound = None,
    note: str = "",
    fix: str = "",
) -> None:
    """`check_number` for each field of `names` of `cfg` (one name or several), its kind (int or
    float) read from the field's annotation; a tuple field is checked element by element, each
    named `field[i]`. `prefix` is how the error names the config ("learner.schedule", "model",
    "SoftmaxConfig"); its class name by default. One line per field (or group) in a validate:

        check_range(self, "warmup_steps", ge=0, prefix="learner.schedule")
        check_range(self, ("b1", "b2"), ge=0.0, lt=1.0, prefix="learner.optimizer")
    """
    prefix = type(cfg).__name__ if prefix is None else prefix
    for name in (names,) if isinstance(names, str) else names:
        integer, is_tuple = _numeric_kind(type(cfg), name)
        value = getattr(cfg, name)
        bounds = dict(integer=integer, ge=ge, gt=gt, le=le, lt=lt, note=note, fix=fix)
        if not is_tuple:
            check_number(f"{prefix}.{name}", value, **bounds)
            continue
        if not isinstance(value, (tuple, list)):
            raise ConfigError(f"{prefix}.{name} must be a sequence of numbers, got {value!r}.")
        for i, item in enumerate(value):
            check_number(f"{prefix}.{name}[{i}]", item, **bounds)


def require_positive(cfg: Any, names: typing.Iterable[str], prefix: str | None = None) -> None:
    """ConfigError naming the first of `names` whose value in `cfg` is not a number > 0 of the
    field's kind (`check_range` with gt=0). `prefix` is how the error names the config
    ("model", "SoftmaxConfig"); its class name by default."""
    check_range(cfg, names, prefix=prefix, gt=0)


def check_once(cfg: Any, key: str, check: typing.Callable[[], None]) -> None:
    """Runs `check()` (a check of `cfg` in a role: an input as the eval split) unless it already
    passed on this object for `key`. Configs are frozen and shared, so a child a parent checks at
    its construction is met again by every copy of the parent (`replace`, the command line's
    rebuilds); it is checked once. A failed check records nothing."""
    done = getattr(cfg, "_checked", frozenset())
    if key in done:
        return
    check()
    object.__setattr__(cfg, "_checked", done | {key})  # not a field: equality and JSON ignore it


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

    def inert_fields(self) -> dict[str, str]:
        """{field (dotted below this config): why it has no effect} for the fields whose value this
        config, as it stands, never reads (a file path of a source that reads no files). The
        command line refuses a flag given for one (`command_line/inert_flags.py`). None by default."""
        return {}

    @classmethod
    def migrate(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The JSON object of an older pax_eqx's config of this class, in today's form (the job
        dirs it wrote still resume). Overridden where a field moved; the identity by default."""
        return data

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))


@config
class Variant(Config):
    """One variant of a *choice*: an optimizer, a schedule, a norm, a tokenizer. It holds only what
    this variant reads, and its class attribute `kind` names it ("sgd", "cosine", "rms_norm").

    A field annotated with a union of Variant classes (`optimizer: Adam | AdamW | Sgd`) is a
    choice: the command line switches it with `--learner.optimizer sgd` and sets the chosen
    variant's fields with `--learner.optimizer.momentum 0.9`; config.json records `"kind"` beside
    the fields. Fields that variants share are declared once, on a common base class; a switch
    carries them over (`switch_variant`), everything else starts at the new variant's defaults.
    """

    kind: ClassVar[str] = ""


class OpenChoice(Variant):
    """The base of a choice that is open: a field annotated with this base class (`source:
    DataSource`) chooses among every imported subclass that names its own `kind`, so a new variant
    is one class in one file, registered by its own definition (no union to edit). Subclass it
    once per choice; shared bases between it and the variants leave `kind` empty."""


def registered_variants(base: type[OpenChoice]) -> dict[str, type]:
    """{kind: class} of every imported subclass of the open choice `base` that declares a kind.
    Classes the command line derives from a variant (`specialise`) declare none. Two classes
    declaring one kind are a programming error (TypeError naming both)."""
    found: dict[str, type] = {}
    for sub in _subclasses(base):
        kind = vars(sub).get("kind")
        if not kind or "_specialised_from" in vars(sub):
            continue
        if found.setdefault(kind, sub) is not sub:
            raise TypeError(
                f"{sub.__module__}.{sub.__qualname__} and {found[kind].__module__}.{found[kind].__qualname__} "
                f"both declare the {base.__name__} kind {kind!r}; give one another kind."
            )
    return found


def variant_choices(hint: Any) -> dict[str, type]:
    """{kind: class} of a choice annotation (a union of Variant classes, or an OpenChoice base;
    Optional allowed), else {}."""
    if isinstance(hint, type) and OpenChoice in hint.__bases__:
        return registered_variants(hint)
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    found = {o.kind: o for o in options if isinstance(o, type) and issubclass(o, Variant) and o.kind}
    return found if found and len(found) == sum(o is not type(None) for o in options) else {}


def _declared_in(cls: type, name: str) -> type:
    """The class of `cls`'s MRO that declares the dataclass field `name`."""
    return next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))


def switch_variant(current: Variant, new_cls: type[Variant], *, check: bool = True) -> Variant:
    """A `new_cls` variant with its defaults, except the fields `current` and it share through a
    common base class, which keep their current values (a schedule's warmup_steps).

    check=False builds it without `validate`: the command line switches first and sets the new
    variant's fields after (a piecewise schedule's boundaries), and tyro builds the result again,
    checked."""
    if type(current) is new_cls:
        return current
    own = set(field_names(new_cls))
    shared = {
        name: getattr(current, name)
        for name in field_names(current)
        if name in own and _declared_in(type(current), name) is _declared_in(new_cls, name)
    }
    if check:
        return new_cls(**shared)
    values = {f.name: f.default for f in dataclasses.fields(new_cls)} | shared
    unchecked = object.__new__(new_cls)
    for name, value in values.items():
        object.__setattr__(unchecked, name, value)
    return unchecked


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Variant):
        return {"kind": value.kind, **value.to_dict()}
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
    `tp` itself or the (imported) subclass with all of the object's keys and the fewest fields
    besides (a config written before a field was added lacks that key, which then takes its
    default). Where several fit equally (a user's subclass that adds methods, not fields), the
    one the others derive from: the JSON holds nothing that tells them apart."""
    if set(value) <= set(field_names(tp)):
        return tp
    fits = [sub for sub in _subclasses(tp) if dataclasses.is_dataclass(sub) and set(value) <= set(field_names(sub))]
    if not fits:
        return tp
    fewest = min(len(field_names(sub)) for sub in fits)
    matches = [sub for sub in fits if len(field_names(sub)) == fewest]
    roots = [m for m in matches if all(issubclass(other, m) for other in matches)]
    return roots[0] if roots else tp


def _from_jsonable(tp: Any, value: Any, where: str) -> Any:
    """Rebuilds a value of (annotated) type `tp` from its JSON form."""
    origin = get_origin(tp)
    choices = variant_choices(tp)
    if choices and value is not None:
        return _variant_from_jsonable(choices, value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object for {tp.__name__}, got {value!r}.")
        tp = _concrete_config(tp, value)
        value = tp.migrate(dict(value))
        check_fields(tp, value)
        hints = field_hints(tp)
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


def _variant_from_jsonable(choices: dict[str, type], value: Any, where: str) -> Variant:
    """The variant a `{"kind": ..., field: ...}` object names. An older config.json held a choice
    as one flat config whose `kind` field chose (fields other kinds read stayed at their
    defaults, which `validate` enforced): those are dropped. Any other unknown key is refused."""
    if not isinstance(value, dict) or "kind" not in value:
        raise ConfigError(f'{where}: expected an object with a "kind" (one of {", ".join(choices)}), got {value!r}.')
    kind = value["kind"]
    if kind not in choices:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(choices)}.{_suggest(kind, choices)}")
    cls = choices[kind]
    own = set(field_names(cls))
    hints = field_hints(cls)
    others = {name for c in choices.values() for name in field_names(c)} - own
    fields = {k: v for k, v in cls.migrate(dict(value)).items() if k != "kind" and k not in others}
    check_fields(cls, fields)
    return cls(**{k: _from_jsonable(hints[k], v, f"{where}.{k}") for k, v in fields.items()})
