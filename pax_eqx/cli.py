"""Command-line parsing shared by `python -m pax_eqx.{train,eval,decode,inspect_data}`.

Pax style: `--exp NAME --job-log-dir DIR` (Pax's `--job_log_dir` spelling too), then any
nested field of the experiment: `--model.num-layers 4 --train.num-steps 100`.
`--data.synthetic true` is shorthand for `--data.source synthetic` (synthetic rows of the
experiment's shapes, no data files). `--exp` is read
first with argparse; the rest is parsed by tyro with the chosen experiment as the default, so
a typo fails at once with tyro's "did you mean" and a wrong type names the field.
`--help` lists the experiments, then tyro's field help (with the config docstrings).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Sequence

import tyro

from pax_eqx.experiment import ExperimentConfig

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
    from experiments import registry  # the entry points are the only place experiments are loaded

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(prog=prog, description=description, add_help=False, allow_abbrev=False)
    pre.add_argument("--exp", default=DEFAULT_EXPERIMENT)
    pre.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", default=None)
    pre.add_argument("--data.synthetic", dest="data_synthetic", nargs="?", const="true", default=None)
    pre.add_argument("-h", "--help", action="store_true")
    for flag, kwargs in extra:
        pre.add_argument(flag, **kwargs)
    ns, rest = pre.parse_known_args(argv)
    try:
        default = registry.load_experiment(ns.exp)
    except registry.UnknownExperimentError as e:
        raise fail(str(e)) from None
    if ns.help:
        extras = "".join(f" [{flag} ...]" for flag, _ in extra)
        print(f"usage: {prog} --exp NAME --job-log-dir DIR{extras} [--section.field VALUE ...]\n")
        print(description + "\n\nexperiments:\n" + registry.describe() + "\n\nfields of --exp " + ns.exp + ":")
        tyro.cli(ExperimentConfig, default=default, args=["--help"], prog=prog)
    if job_dir_required and not ns.job_log_dir:
        raise fail(f"--job-log-dir is required: {prog} --exp {ns.exp} --job-log-dir DIR")
    if ns.data_synthetic is not None and _flag_value("--data.synthetic", ns.data_synthetic):
        rest = [*rest, "--data.source", "synthetic"]
    exp = _parse_fields(default, rest, prog)
    return exp, ns.job_log_dir, ns


def _flag_value(flag: str, text: str) -> bool:
    """A Pax-style boolean flag value (`--data.synthetic true`)."""
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise fail(f"{flag} {text!r} is not a boolean; pass {flag} true or {flag} false.")
    return value in ("true", "1", "yes")


def _parse_fields(default: ExperimentConfig, args: list[str], prog: str) -> ExperimentConfig:
    """tyro parses the fields; its error box becomes our one `error: ...` line (exit 2)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            exp = tyro.cli(ExperimentConfig, default=default, args=args, prog=prog)
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
