"""Command-line parsing shared by `python -m pax_eqx.{train,eval,decode,inspect_data}`.

Pax style: `--exp NAME --job-log-dir DIR` (Pax's `--job_log_dir` spelling too), then any
nested field of the experiment: `--model.num-layers 4 --train.num-steps 100`.
`--data.synthetic true` is shorthand for `--data.source synthetic` (synthetic rows of the
experiment's shapes, no data files). `--exp` is read
first with argparse; the rest is parsed by tyro with the chosen experiment as the default, so
a typo fails at once with tyro's "did you mean" and a wrong type names the field.
`--help` lists the experiments, then tyro's field help (with the config docstrings).

A config field may hold a subclass of its annotation (`model: ModelConfig` holding a
`LanguageModelConfig`, or a user's own model config). tyro parses by annotation, so it would
show only the base's fields and build the base class. The parser is therefore specialised to
the chosen experiment: each config-typed field is re-annotated with its default value's
concrete type (`specialise`), tyro parses that, and the result is turned back into the plain
config classes (`generalise`), so the rest of the program sees an ordinary ExperimentConfig.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

import tyro

from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs import entry, registry

DEFAULT_EXPERIMENT = "shakespeare_char"


class CliError(SystemExit):
    """A user error already reported on stderr; exits with status 2."""


def fail(message: str, code: int = 2) -> CliError:
    print(f"error: {message}", file=sys.stderr)
    return CliError(code)


def parse(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    *,
    job_dir_required: bool = True,
    extra: Sequence[tuple[str, dict]] = (),
) -> tuple[ExperimentConfig, str | None, argparse.Namespace]:
    """Returns (experiment, job dir, namespace of `extra` flags)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(prog=prog, description=description, add_help=False, allow_abbrev=False)
    pre.add_argument("--exp", default=DEFAULT_EXPERIMENT)
    pre.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", default=None)
    pre.add_argument("--data.synthetic", dest="data_synthetic", nargs="?", const="true", default=None)
    pre.add_argument("-h", "--help", action="store_true")
    pre.add_argument("--verbose", action="store_true")
    for flag, kwargs in extra:
        pre.add_argument(flag, **kwargs)
    ns, rest = pre.parse_known_args(argv)
    if ns.verbose:
        entry.set_verbose()
    # A bad --exp (unknown, or its code raises) is a ConfigError: entry.run prints its one line.
    default = registry.load_experiment(ns.exp)
    if ns.help:
        extras = "".join(f" [{flag} ...]" for flag, _ in extra)
        print(f"usage: {prog} --exp NAME --job-log-dir DIR{extras} [--section.field VALUE ...]\n")
        print(description + "\n\nexperiments:\n" + registry.describe() + "\n\nfields of --exp " + ns.exp + ":")
        spec = specialise(type(default), default)
        tyro.cli(spec, default=_as(spec, default), args=["--help"], prog=prog)
    if job_dir_required and not ns.job_log_dir:
        raise fail(f"--job-log-dir is required: {prog} --exp {ns.exp} --job-log-dir DIR")
    if ns.data_synthetic is not None and _flag_value("--data.synthetic", ns.data_synthetic):
        rest = [*rest, "--data.source", "synthetic"]
    exp = _parse_fields(default, rest, prog)
    entry.note_run(prog, exp, ns.job_log_dir)
    return exp, ns.job_log_dir, ns


def _flag_value(flag: str, text: str) -> bool:
    """A Pax-style boolean flag value (`--data.synthetic true`)."""
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise fail(f"{flag} {text!r} is not a boolean; pass {flag} true or {flag} false.")
    return value in ("true", "1", "yes")


def specialise(cls: type, value: Any) -> type:
    """`cls`, or a dataclass subclass of it whose config-typed fields are annotated with the
    concrete types of `value`'s fields (recursively), so tyro parses and builds those types.

    A field is re-annotated when `value` holds a strict subclass of its class, one member of its
    union of configs (`network: MLPConfig | ResNetConfig`: the experiment chose, so the CLI shows
    that member's fields rather than asking for a subcommand), or a value whose own fields need it.
    """
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        child = getattr(value, f.name)
        hint = hints[f.name]
        is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        options = typing.get_args(hint) if is_union else (hint,)
        if not (dataclasses.is_dataclass(child) and any(isinstance(o, type) and isinstance(child, o) for o in options)):
            continue
        concrete = specialise(type(child), child)
        if concrete is not hint:
            fields.append((f.name, concrete, dataclasses.field(kw_only=True)))
    if not fields:
        return cls
    namespace = {
        "__doc__": cls.__doc__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_specialised_from": cls,  # what `generalise` turns a parsed value back into
    }
    params = cls.__dataclass_params__
    return dataclasses.make_dataclass(
        cls.__name__, fields, bases=(cls,), namespace=namespace, frozen=params.frozen, eq=params.eq
    )


def _as(cls: Any, value: Any) -> Any:
    """`value` rebuilt as an instance of `cls`, the class `specialise` made for it (tyro wants
    a default of the type it parses)."""
    if type(value) is cls or not dataclasses.is_dataclass(cls):
        return value
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _as(hints[f.name], getattr(value, f.name)) for f in dataclasses.fields(cls) if f.init})


def generalise(value: Any) -> Any:
    """A parsed value of a `specialise`d class back as its plain config class (recursively)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    cls = vars(type(value)).get("_specialised_from", type(value))
    changed = {f.name: generalise(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if cls is type(value) and all(changed[k] is getattr(value, k) for k in changed):
        return value
    return cls(**changed)


def _parse_fields(default: ExperimentConfig, args: list[str], prog: str) -> ExperimentConfig:
    """tyro parses the fields; its error box becomes our one `error: ...` line (exit 2)."""
    captured = io.StringIO()
    spec = specialise(type(default), default)
    try:
        with contextlib.redirect_stderr(captured):
            exp = generalise(tyro.cli(spec, default=_as(spec, default), args=args, prog=prog))
    except SystemExit as e:
        if e.code not in (0, None):
            raise fail(one_line(captured.getvalue()) or f"cannot parse the arguments {args}", code=2) from None
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())  # warnings, if any
    return exp


_RULE = re.compile(r"^[\s\-─━═╌┄]*$")


def one_line(box: str) -> str:
    """tyro's (rich's) error box -> one line: its sections joined by " -- ", the title dropped.

    The box is a title, then sections separated by rules; rich wraps long lines, so the lines
    of a section are joined with spaces.
    """
    sections: list[list[str]] = [[]]
    lines = [line.strip().strip("│|╭╮╰╯").strip() for line in box.splitlines()]
    lines = [line for line in lines if line]
    for line in lines[1:]:  # lines[0] is the title ("Value error", "Unrecognized options")
        if _RULE.match(line):
            sections.append([])
        else:
            sections[-1].append(line)
    return " -- ".join(" ".join(section) for section in sections if section)
