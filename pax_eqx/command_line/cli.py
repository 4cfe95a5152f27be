"""Command-line parsing shared by `python -m pax_eqx.{train,eval,decode,inspect_data}`.

Pax style: `--exp NAME --job-log-dir DIR` (Pax's `--job_log_dir` spelling too), then any
nested field of the experiment: `--model.num-layers 4 --train.num-steps 100`.
`--data.synthetic true` is shorthand for `--data.source synthetic` (synthetic rows of the
experiment's shapes, no data files). A choice among variant configs (the optimizer, the
schedule, a norm) switches with `--learner.optimizer sgd` and takes its fields as
`--learner.optimizer.momentum 0.0` (`choices.py`). `--exp` is read
first with argparse; the rest is parsed by tyro with the chosen experiment as the default, so
a typo fails at once with tyro's "did you mean" and a wrong type names the field.
`--help` lists the program's own flags, the experiments, the sections of `--exp` and the most used
flags; `--help SECTION` every flag of one section; `--help-all` every field of `--exp` with its help,
cut from its config class's docstring (`help_spec`), as tyro prints it (short_help.py).

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
import inspect
import io
import json
import re
import shlex
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tyro

from pax_eqx.command_line import entry, registry, short_help
from pax_eqx.command_line.choices import ChoiceError, apply_switches, spell_flattened
from pax_eqx.command_line.data_files import follow_data_files
from pax_eqx.command_line.flag_hints import with_nearest_flags, with_section_help
from pax_eqx.command_line.inert_flags import InertFlagError, refuse_inert_flags
from pax_eqx.command_line.width import columns, fill, print_message
from pax_eqx.config import Config, ConfigError, field_hints
from pax_eqx.experiment import ExperimentConfig

DEFAULT_EXPERIMENT = entry.DEFAULT_EXPERIMENT
C = typing.TypeVar("C", bound=Config)


class CliError(SystemExit):
    """A user error already reported on stderr; exits with status 2."""


def fail(message: str, code: int = 2) -> CliError:
    """Prints `error: MESSAGE` (broken at spaces to a terminal's width) and returns the CliError to raise."""
    print_message("error: ", message)
    return CliError(code)


def parse(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    *,
    job_dir_required: bool = True,
    extra: Sequence[tuple[str, dict]] = (),
    saved_experiment: bool = False,
    sections: tuple[str, ...] | None = None,
) -> tuple[ExperimentConfig, str | None, argparse.Namespace]:
    """Returns (experiment, job dir, namespace of `extra` flags).

    saved_experiment: the program reads or continues a job dir (train, eval, decode): without `--exp` the
    experiment is DIR/config.json's, every field as the run saved it, and the flags given
    change only what they name; an `--exp` naming another experiment than the saved one is
    refused with the command that works. sections: the experiment's sections --help lists (those the
    program reads; None: all)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"{prog} {'[--exp NAME]' if saved_experiment else '--exp NAME'}"
    usage += " --job-log-dir DIR" if job_dir_required else " [--job-log-dir DIR]"
    usage += "".join(f" [{flag}{' ' + _metavar(flag, kw) if _takes_value(kw) else ''}]" for flag, kw in extra)
    pre = entry.OneLineParser(
        prog=prog,
        usage=usage + " [--verbose] [--section.field VALUE ...]",
        description=description,
        add_help=False,
        allow_abbrev=False,
    )
    default_help = (
        "the experiment the job dir's config.json saved, else " if saved_experiment else ""
    ) + DEFAULT_EXPERIMENT
    pre.add_argument(
        "--exp",
        default=None,
        metavar="NAME",
        help="a registered experiment (listed below) or alias, Pax's class name, a dotted path "
        f"package.module.function to your own, or a config.json (default: {default_help})",
    )
    pre.add_argument(
        "--job-log-dir",
        "--job_log_dir",
        dest="job_log_dir",
        default=None,
        metavar="DIR",
        help="the job's directory: config.json, checkpoints/, summaries/, metrics.jsonl, plots/",
    )
    pre.add_argument(
        "--data.synthetic",
        dest="data_synthetic",
        nargs="?",
        const="true",
        default=None,
        metavar="BOOL",
        help="true: shorthand for --data.source synthetic (rows of the experiment's shapes, no data files)",
    )
    detailed = []  # extra flags whose help only --help-all shows (`"detail": True` in their kwargs)
    for flag, kwargs in extra:
        kwargs = dict(kwargs)
        detail = kwargs.pop("detail", False)
        action = pre.add_argument(flag, **kwargs)
        if detail:
            detailed.append(action)
    pre.add_argument(
        "--verbose",
        action="store_true",
        help="print an error's Python traceback before its one line (or set PAX_EQX_VERBOSE=1)",
    )
    pre.add_argument(
        "-h",
        "--help",
        nargs="?",
        const="",
        default=None,
        metavar="SECTION",
        help="this overview; with a SECTION of the experiment (learner, data.train, model.block): every flag of it "
        "with its whole help",
    )
    pre.add_argument(
        "--help-all",
        action="store_true",
        help="every experiment with its description, every nested field with its help",
    )
    ns, rest = pre.parse_known_args(argv)
    if ns.verbose:
        entry.set_verbose()
    saved = saved_config(ns.job_log_dir) if saved_experiment else None
    recovered = None
    if saved_experiment and saved is None and ns.exp is None and ns.job_log_dir:
        recovered = experiment_in_checkpoints(ns.job_log_dir)
    if ns.exp is None:
        ns.exp = str(saved) if saved else recovered.name if recovered else DEFAULT_EXPERIMENT
    # A bad --exp (unknown, or its code raises) is a ConfigError: entry.run prints its one line.
    default = recovered or registry.load_experiment(ns.exp)
    if saved and Path(ns.exp) != saved:
        _refuse_other_experiment(default, saved, prog, ns.job_log_dir, rest)
    if ns.help is not None and not ns.help_all:
        _print_help(pre, ns.help, apply_switches(default, rest)[0] if rest else default, detailed, sections)
    if ns.help_all:
        print(pre.format_help())
        print(
            "experiments (--exp NAME, or its Pax class name in parentheses, or Pax's path "
            f"tasks.<...>.params.<module>.<ClassName>):\n{registry.describe()}\n"
        )
        if python_only_fields(default):
            print(_python_only_line(default) + "\n")
        spec = help_spec(type(default), default)
        tyro.cli(
            spec,
            default=_as(spec, default),
            args=["--help"],
            prog=f"{prog} --exp {ns.exp}",
            description=f"The fields of --exp {ns.exp}, each a flag --section.field VALUE; the defaults shown are "
            "this experiment's values. A choice (the optimizer, the schedule, a norm) switches with "
            "--section.field NAME and lists the chosen variant's fields.",
        )
    if job_dir_required and not ns.job_log_dir:
        raise fail(f"--job-log-dir is required: {prog} --exp {ns.exp} --job-log-dir DIR")
    if ns.data_synthetic is not None and _flag_value("--data.synthetic", ns.data_synthetic):
        rest = [*rest, "--data.source", "synthetic"]
    exp = follow_data_files(_parse_fields(default, rest, prog), rest)
    entry.note_run(prog, exp, ns.job_log_dir)
    return exp, ns.job_log_dir, ns


def _print_help(
    pre: argparse.ArgumentParser,
    section: str,
    exp: ExperimentConfig,
    detailed: list[argparse.Action],
    sections: tuple[str, ...] | None,
) -> None:
    """`--help`: the program's flags, the experiments, the sections and the most used flags
    (`short_help.short_help`); `--help SECTION`: every flag of that section (exit 0), or one error
    line naming the sections (exit 2)."""
    width = columns()
    if section:
        text = short_help.section_help(exp, section, width)
        if text is None:
            raise fail(short_help.unknown_section(exp, section))
        print(text)
        raise SystemExit(0)
    for action in detailed:
        action.help = argparse.SUPPRESS
    print(pre.format_help().rstrip("\n"))
    if detailed:
        print(fill(f"{', '.join(a.option_strings[0] for a in detailed)}: see --help-all", width, "  ", first="  "))
    print(f"\nexperiments (--exp NAME; --help-all describes each):\n{short_help.experiments_line(width)}\n")
    print(short_help.short_help(exp, width, sections))
    if python_only_fields(exp):
        print("\n" + fill(_python_only_line(exp), width))
    raise SystemExit(0)


def saved_config(job_dir: str | None) -> Path | None:
    """DIR/config.json when DIR holds one (a run started there), else None (also for a path the
    file system cannot hold: `job_dir.prepare` names that problem)."""
    file = Path(job_dir) / "config.json" if job_dir else None
    try:
        return file if file is not None and file.is_file() else None
    except OSError:  # ENAMETOOLONG and the like
        return None


def experiment_in_checkpoints(job_dir: str) -> ExperimentConfig | None:
    """The experiment the newest intact checkpoint of DIR saved in its manifest, when DIR/config.json
    is gone (deleted by hand) but checkpoints are there: eval and decode then read the model that
    was trained, not the default experiment's (a warning says so); None without checkpoints."""
    folder = Path(job_dir) / "checkpoints"
    try:
        if not folder.is_dir() or not any(p.name.isdigit() for p in folder.iterdir()):
            return None
    except OSError:
        return None
    from pax_eqx.checkpoint import Checkpointer

    found = Checkpointer(folder, read_only=True).saved_config()
    if found is None:
        return None
    step, config = found
    print_message(
        "warning: ",
        f"{Path(job_dir) / 'config.json'} is missing; using the experiment saved with the step-{step} checkpoint.",
    )
    return ExperimentConfig.from_json(json.dumps(config))


def _refuse_other_experiment(named: ExperimentConfig, saved: Path, prog: str, job_dir: str, rest: list[str]) -> None:
    """An `--exp` that is not the experiment DIR trained: one line naming both, and the command
    that reads the saved one."""
    try:
        saved_name = json.loads(saved.read_text()).get("name", "")
    except (OSError, json.JSONDecodeError, AttributeError):
        return  # check_config reports an unreadable config.json with its reason
    if saved_name and named.name != saved_name:
        again = shlex.join([*prog.split(), "--job-log-dir", job_dir, *rest])
        raise fail(
            f"--exp {named.name} but --job-log-dir {job_dir} holds a run of {saved_name!r} ({saved}); drop --exp to "
            f"use the saved experiment and its flags: {again}"
        )


def _takes_value(kwargs: dict) -> bool:
    return kwargs.get("action") not in ("store_true", "store_false")


def _metavar(flag: str, kwargs: dict) -> str:
    return kwargs.get("metavar") or flag.lstrip("-").rpartition(".")[2].replace("-", "_").upper()


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
    hints = field_hints(cls)
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


def help_spec(cls: type, value: Any) -> type:
    """`specialise` for `--help`: every config class in `value`'s tree becomes a subclass whose
    fields carry their help (`tyro.conf.arg(help=...)`), cut out of the class docstring's
    `field: text` sentences (`_field_helps`), and whose own description keeps the rest of the
    docstring, each paragraph on one line (rich wraps it). Parsing never uses it."""
    hints = field_hints(cls)
    prose, helps = _field_helps(cls)
    fields = []
    for f in dataclasses.fields(cls):
        child = getattr(value, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            hint = help_spec(type(child), child)
        if helps.get(f.name):
            hint = typing.Annotated[hint, tyro.conf.arg(help=helps[f.name])]
        fields.append((f.name, hint, dataclasses.field(kw_only=True)))
    namespace = {
        "__doc__": prose or " ",  # not None: dataclass would write its signature there
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_specialised_from": cls,
    }
    params = cls.__dataclass_params__
    return dataclasses.make_dataclass(
        cls.__name__, fields, bases=(cls,), namespace=namespace, frozen=params.frozen, eq=params.eq
    )


_SEPARATOR = r"\s*(?:/|,|\band\b)\s*"


def _field_helps(cls: type) -> tuple[str, dict[str, str]]:
    """(the docstring's prose, {field: its help}) of a config class whose docstring documents its
    fields as sentences `name: text`, `a / b: text`, `a, b (note): text`. A sentence that names
    no field stays in the prose; a class without a docstring of its own has neither. Inherited
    fields take their help from the base class that documents them (DecodeConfig's sampling
    fields from SampleConfig), unless the class documents them again."""
    helps: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base) and base is not object:
            helps.update(_own_field_helps(base)[1])
    prose, own = _own_field_helps(cls)
    return prose, {**helps, **own}


def _own_field_helps(cls: type) -> tuple[str, dict[str, str]]:
    """`_field_helps` from `cls`'s own docstring only."""
    doc = vars(cls).get("__doc__") or ""
    if doc.startswith(cls.__name__ + "("):  # the signature dataclass writes when there is no docstring
        doc = ""
    names = sorted((f.name for f in dataclasses.fields(cls)), key=len, reverse=True)
    field = "(?:" + "|".join(map(re.escape, names)) + ")"
    start = re.compile(rf"(?:^|(?<=[.;:]\s))({field}(?:{_SEPARATOR}{field})*)(?:\s*\([^()]*\))?:\s")
    prose, helps = [], {}
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        text = " ".join(paragraph.split())
        found = list(start.finditer(text))
        if not found:
            prose.append(text)
            continue
        if found[0].start() > 0:
            prose.append(text[: found[0].start()].strip())
        for match, following in zip(found, [*found[1:], None]):
            help_text = _tidy(text[match.end() : following.start() if following else len(text)])
            for name in re.split(_SEPARATOR, match.group(1)):
                helps[name] = f"{helps[name]} {help_text}" if name in helps else help_text
    return "\n\n".join(p for p in prose if p), helps


def _tidy(text: str) -> str:
    """A field's help without the separator before the next field (`;`, `,`) or a trailing
    sentence that introduces what follows ("Seq2seq (module doc):")."""
    text = text.strip().rstrip(";,").strip()
    if text.endswith(":"):
        head, dot, _ = text.rpartition(". ")
        text = head + dot.strip() if dot else ""
    return text


def _as(cls: Any, value: Any) -> Any:
    """`value` rebuilt as an instance of `cls`, the class `specialise` made for it (tyro wants
    a default of the type it parses)."""
    if type(value) is cls or not dataclasses.is_dataclass(cls):
        return value
    hints = field_hints(cls)
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


class FlagError(ConfigError):
    """Field flags tyro cannot parse: its error box as one line (a user error: exit 2)."""


def _parse_fields(default: ExperimentConfig, args: list[str], prog: str) -> ExperimentConfig:
    """tyro parses the fields; its error box becomes our one `error: ...` line (exit 2)."""
    try:
        return parse_fields(default, args, prog)
    except FlagError as e:
        raise fail(str(e), code=2) from None


def parse_fields(default: C, args: Sequence[str], prog: str) -> C:
    """`default` (an ExperimentConfig, or any config) with the field flags `args`
    (`--model.num-layers 4 ...`) applied: the switches of its choices first (`choices.py`), then
    tyro, as `python -m pax_eqx.train` applies them; FlagError (printing nothing) when refused."""
    _refuse_python_only(default, args)
    # A flattened field's flag (`--data.path`) is parsed as its full spelling (`--data.source.path`);
    # errors name it as typed.
    typed = {
        full.split("=")[0]: given.split("=")[0]
        for full, given in zip(spell_flattened(default, args), args, strict=True)
        if full != given
    }

    def as_typed(message: str) -> str:
        for full, given in typed.items():
            message = message.replace(full, given)
        return message

    try:
        default, args = apply_switches(default, args)
    except ChoiceError as e:
        raise FlagError(as_typed(str(e))) from None
    captured = io.StringIO()
    spec = specialise(type(default), default)
    try:
        with contextlib.redirect_stderr(captured):
            exp = generalise(tyro.cli(spec, default=_as(spec, default), args=list(args), prog=prog))
    except SystemExit as e:
        if e.code not in (0, None):
            message = one_line(captured.getvalue()) or f"cannot parse the arguments {list(args)}"
            raise FlagError(as_typed(with_section_help(with_nearest_flags(message, default), default))) from None
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())  # warnings, if any
    try:
        refuse_inert_flags(exp, args)
    except InertFlagError as e:
        raise FlagError(as_typed(str(e))) from None
    return exp


# Where a user reads how to set a field the command line cannot (python_only_fields).
_HOW_TO_SET_IN_PYTHON = 'README, "Write your own experiment"'


def python_only_fields(value: Any, prefix: str = "") -> dict[str, type]:
    """{dotted field: its element class} for the fields of `value` (recursively) that hold a tuple of
    configs (`learner.variable_groups`, `checkpoint.init_from_checkpoint_rules`). tyro has no flag
    syntax for a variable-length tuple of dataclasses and leaves them out of the parser, so they
    are set in Python, in an experiment function (README, "Write your own experiment")."""
    found: dict[str, type] = {}
    hints = field_hints(type(value))
    for f in dataclasses.fields(value):
        child, name = getattr(value, f.name), prefix + f.name
        if dataclasses.is_dataclass(child):
            found.update(python_only_fields(child, name + "."))
        elif typing.get_origin(hints[f.name]) is tuple:
            configs = [a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)]
            if configs:
                found[name] = configs[0]
    return found


def _python_only_line(default: Config) -> str:
    """The `--help` line naming the fields set in Python only, each with its element class."""
    fields = python_only_fields(default)
    listed = ", ".join(f"{name} ({cls.__name__})" for name, cls in fields.items())
    return f"fields set in Python only (a tuple of configs: {_HOW_TO_SET_IN_PYTHON}): {listed}"


def _refuse_python_only(default: Config, args: Sequence[str]) -> None:
    """One FlagError naming the flag and the fix when `args` set a field `python_only_fields` lists
    (tyro would say only "Unrecognized options")."""
    fields = python_only_fields(default)
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        field = flag[2:].replace("-", "_")
        if field in fields:
            element = fields[field].__name__
            raise FlagError(
                f"{flag}: {field} is a tuple of {element}s, which has no command-line syntax; set it in Python, in "
                f"an experiment function run with --exp mypkg.myexps.NAME ({_HOW_TO_SET_IN_PYTHON}): "
                f"{_replace_expression('exp', field.split('.'), f'({element}(...),)')}"
            )


def _replace_expression(owner: str, path: list[str], value: str) -> str:
    """`exp.replace(learner=exp.learner.replace(variable_groups=VALUE))` for path [learner, variable_groups]."""
    head, *rest = path
    inner = _replace_expression(f"{owner}.{head}", rest, value) if rest else value
    return f"{owner}.replace({head}={inner})"


_RULE = re.compile(r"^[\s\-─━═╌┄]*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def one_line(box: str) -> str:
    """tyro's (rich's) error box -> one line: its sections joined by " -- ", the title dropped.

    The box is a title, then sections separated by rules; rich wraps long lines, so the lines
    of a section are joined with spaces.
    """
    sections: list[list[str]] = [[]]
    box = _ANSI.sub("", box)  # a colour terminal's codes sit between the box characters
    lines = [line.strip().strip("│|╭╮╰╯").strip() for line in box.splitlines()]
    lines = [line for line in lines if line]
    for line in lines[1:]:  # lines[0] is the title ("Value error", "Unrecognized options")
        if _RULE.match(line):
            sections.append([])
        else:
            sections[-1].append(line)
    return " -- ".join(" ".join(section) for section in sections if section)
