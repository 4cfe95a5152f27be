"""What every `python -m pax_eqx.<program>` shares: one `error: ...` line and an exit status.

The line is one line of text; on a terminal it is broken at spaces to the terminal's width
(`width.py`), so a long one reads as a paragraph and never splits a flag.

    exit 0    done (or stopped by SIGTERM/SIGINT after saving a checkpoint)
    exit 1    the run started and then failed: NaN/Inf loss, a failing data pipeline, a
              checkpoint that cannot be written or read (pax_eqx.job.errors,
              pax_eqx.checkpoint), out of device or host memory; the checkpoints written
              before are intact
    exit 2    a user error: a bad flag, field, value, path, data file or job dir, an `--exp`
              that cannot be imported or called, found before anything is written; the
              message names the field, the value and the fix
    exit 130  interrupted (Ctrl-C twice, or before training began) without saving

No traceback is printed for these; pass `--verbose` (every program takes it) or set
PAX_EQX_VERBOSE=1 (or PAX_EQX_TRACEBACK=1, its older name) to see it printed before the line
(the exit status stays the same). Anything else is a bug in pax_eqx and keeps its traceback.

Only pax_eqx's own error types count as a user error or a run failure: `ConfigError` (and its
subclasses `JobDirError`, `UnknownExperimentError`, `ExperimentLoadError`) and
`CheckpointMismatchError` exit 2; `RunError` and `CheckpointError` exit 1. A bare ValueError,
FileNotFoundError or PermissionError is not one of them, whoever raised it: were it caught here,
a bug in pax_eqx (or in a library under it) would print as a user's mistake and lose its
traceback. Code that finds a bad input raises ConfigError (a ValueError, so `except ValueError`
still catches it). The one exception from outside: running out of memory (XLA's
RESOURCE_EXHAUSTED, Python's MemoryError) is the run's size, not a bug, and gets one line with
the planner's estimate and the flags that use less memory (exit 1).

Background threads of orbax and tensorstore report a failed write (a full disk) in their own
words as well: their log records keep their message but lose the traceback, and exceptions
that Python can only ignore ("Event loop is closed" from a callback after a failed save) are
named once, in one `warning:` line each -- unless verbose.

This module imports nothing heavy (no JAX, orbax or tyro): a program prints its first line
before those load. pax_eqx's error types are recognised through `sys.modules`: an exception
can only be an instance of a class whose module is imported.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from pax_eqx import closed_stdout
from pax_eqx.command_line.host_memory import retain_freed_pages
from pax_eqx.command_line.width import columns, fill, fill_groups, message_lines, print_message

VERBOSE_ENV = ("PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK")
DEFAULT_EXPERIMENT = "shakespeare_char"

# (module, class name): ConfigError covers JobDirError, UnknownExperimentError and
# ExperimentLoadError (its subclasses). A checkpoint that does not match the model is a bad input
# too (the wrong flags or job dir), found before a step runs: exit 2, although it is a
# CheckpointError.
_USER_ERRORS = (("pax_eqx.config", "ConfigError"), ("pax_eqx.checkpoint.errors", "CheckpointMismatchError"))
# A package of a missing extra (pax_eqx.extras) is the environment: exit 1, with the pip command.
_RUN_ERRORS = (
    ("pax_eqx.job.errors", "RunError"),
    ("pax_eqx.checkpoint.errors", "CheckpointError"),
    ("pax_eqx.extras", "MissingExtraError"),
)


class _State:
    """What the running program told us (pax_eqx.command_line.cli.parse fills it in): `--verbose`,
    and the experiment and job dir an out-of-memory message talks about."""

    verbose = False
    program = ""
    exp: Any = None
    job_dir: str | None = None
    planner: Callable[[Any], int] | None = None  # experiment -> planned bytes per device (--dry-run)


def set_verbose(on: bool = True) -> None:
    _State.verbose = on


def verbose() -> bool:
    """`--verbose` was given, or PAX_EQX_VERBOSE / PAX_EQX_TRACEBACK is set (to anything but 0)."""
    return _State.verbose or any(os.environ.get(name, "0") not in ("", "0") for name in VERBOSE_ENV)


def experiment_named(argv: list[str]) -> str:
    """The `--exp` value of a command line, read without the parser (for a first line printed
    before the parser's imports); without one, the job dir's saved config.json if it has one
    (what `cli.parse(saved_experiment=True)` reads), else the default experiment."""
    value = {"--exp": None, "--job-log-dir": None}
    for i, arg in enumerate(argv):
        flag, eq, given = arg.replace("--job_log_dir", "--job-log-dir").partition("=")
        if flag in value:
            value[flag] = given if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    if value["--exp"]:
        return value["--exp"]
    saved = os.path.join(value["--job-log-dir"], "config.json") if value["--job-log-dir"] else None
    return saved if saved and os.path.isfile(saved) else DEFAULT_EXPERIMENT


def note_run(program: str, exp: Any, job_dir: str | None) -> None:
    """The parsed experiment and job dir, for the out-of-memory message."""
    _State.program, _State.exp, _State.job_dir = program, exp, job_dir


def __getattr__(name: str):  # USER_ERRORS / RUN_ERRORS as tuples of classes, for whoever asks
    if name in ("USER_ERRORS", "RUN_ERRORS"):
        import importlib

        pairs = _USER_ERRORS if name == "USER_ERRORS" else _RUN_ERRORS
        return tuple(getattr(importlib.import_module(m), c) for m, c in pairs)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is(error: BaseException, pairs: tuple[tuple[str, str], ...]) -> bool:
    for module, name in pairs:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(error, cls):
            return True
    return False


def _usage_groups(usage: str) -> list[str]:
    """A usage's groups, each kept on one line: a part in brackets (nested ones too), a flag with
    its metavar (`--exp NAME`), or a word."""
    groups: list[str] = []
    depth, current = 0, ""
    for char in usage.strip() + " ":
        if char == " " and depth == 0:
            if current:
                metavar = re.fullmatch(r"[A-Z][A-Z_.]*|\.\.\.", current)
                if metavar and groups and groups[-1].startswith("-"):
                    groups[-1] += " " + current
                else:
                    groups.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    return groups


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, its lines broken at spaces only (argparse's own break at hyphens, inside
    a flag: `--dry-run-` / `devices`)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return fill(" ".join(text.split()), width).splitlines()

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(" ".join(text.split()), width, indent)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors (a bad choice, a value that is not a number, a missing value)
    one `error:` line like every other flag error, not the usage block and a second line; its
    help broken at spaces, and a usage it is given laid out in lines that fit the terminal, each
    broken between its groups (`[--dry-run-devices N]`, `--exp NAME`), never inside one (argparse
    prints a given usage as it is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        if self.usage:
            first = f"usage: {self.prog}"
            given = self.usage.removeprefix(self.prog).removeprefix("%(prog)s")
            lines = fill_groups(_usage_groups(given), columns(), first, " " * len("usage: "))
            self.usage = "\n".join(lines)[len("usage: ") :]  # argparse writes "usage: " before it

    def error(self, message: str) -> NoReturn:
        print_message("error: ", f"{message}; see {self.prog} --help.")
        raise SystemExit(2)


def run(main: Callable[[], int], memory_planner: Callable[[Any], int] | None = None) -> None:
    """Runs a program's `main` and exits with its status, or with the error's (one line).
    memory_planner: what an out-of-memory line quotes, the program's estimate of an experiment's
    bytes per device (train, eval and decode pass the dry-run planner: this room never imports
    the programs)."""
    _State.verbose, _State.program, _State.exp, _State.job_dir = False, "", None, None
    _State.planner = memory_planner
    warnings.formatwarning = _format_warning
    for library in ("absl", "asyncio"):  # orbax's threads; tensorstore's unretrieved write tasks
        logging.getLogger(library).addFilter(_drop_traceback)
    sys.unraisablehook = _UnraisableOnce(sys.unraisablehook)
    retain_freed_pages()  # a CPU step reuses its temporaries' pages (host_memory.py)
    closed_stdout.guard()  # `... | head -1`: exit 141 quietly, or a train run saves first
    try:
        code = main()
    except BaseException as e:  # noqa: BLE001 -- sorted below; anything not ours is re-raised as it was
        code = _handle(e)
    if closed_stdout.closed() and code == 0:
        code = closed_stdout.EXIT_STATUS
    sys.exit(code)


def _handle(error: BaseException) -> int:
    """The exit status for an error of ours (printed as one line); re-raises anything else."""
    cli = sys.modules.get("pax_eqx.command_line.cli")
    if cli is not None and isinstance(error, cli.CliError):
        return error.code
    if isinstance(error, BrokenPipeError) and closed_stdout.closed():
        return closed_stdout.EXIT_STATUS  # the reader left: nothing to say, and no one to say it to
    if _is(error, _USER_ERRORS):
        return _report(error, 2)
    if _is(error, _RUN_ERRORS):
        return _report(error, 1)
    if isinstance(error, KeyboardInterrupt):
        reason = f" ({error})" if str(error) else ""
        message = (
            f"interrupted{reason}; nothing was saved since the newest checkpoint. Rerun the same command to resume "
            "from it."
        )
        return _report(error, 130, message)
    oom = out_of_memory(error)
    if oom is not None:
        return _report(error, 1, oom_message(oom))
    raise


def _report(error: BaseException, code: int, message: str | None = None) -> int:
    """One `error:` line on stderr (after the traceback, when verbose); returns `code`."""
    if verbose():
        traceback.print_exception(error)
    print_message("error: ", str(error) if message is None else message)
    return code


# ------------------------------------------------------------------------------ out of memory

_OOM_TEXT = ("resource_exhausted", "out of memory")


def out_of_memory(error: BaseException) -> BaseException | None:
    """`error`, or the exception that caused it, when it is running out of memory: a MemoryError
    (host), or JAX's runtime error (jaxlib's XlaRuntimeError) saying RESOURCE_EXHAUSTED or
    "Out of memory" (device, while compiling or running a step). None otherwise."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, MemoryError):
            return error
        names = {cls.__name__ for cls in type(error).__mro__}
        if names & {"JaxRuntimeError", "XlaRuntimeError"} and any(t in str(error).lower() for t in _OOM_TEXT):
            return error
        error, seen = error.__cause__, seen + 1
    return None


def oom_message(error: BaseException) -> str:
    """One line: what ran out, the planner's per-device estimate, the flags that use less
    memory (with their current values), and what is kept."""
    exp = _State.exp
    host = isinstance(error, MemoryError)
    detail = " ".join(str(error).split())
    if len(detail) > 200:
        detail = detail[:200] + "..."
    if host:
        what = "host memory (MemoryError" + (f": {detail})" if detail else ")")
    else:
        what = f"device memory ({detail})"
    parts = [f"out of {what}"]
    if exp is not None:
        parts.append(_planned(exp))
        try:
            parts.append("to use less memory: " + ", ".join(_memory_flags(exp, _State.program)))
        except Exception:  # noqa: BLE001 -- an experiment without these fields: the line comes out regardless
            pass
    parts.append(_kept(_State.job_dir) if _State.program.endswith("train") else "nothing was written")
    return "; ".join(p for p in parts if p) + "."


def _planned(exp: Any) -> str:
    """The dry-run planner's per-device total, or "" when planning itself fails."""
    if _State.planner is None:
        return ""
    try:
        total = _State.planner(exp)
        name = getattr(exp, "name", "") or "the experiment"
        return f"the planner (--dry-run) estimates {_size(total)} per device for {name}{_device_memory()}"
    except Exception:  # noqa: BLE001 -- an estimate is a courtesy; the error line must come out regardless
        return ""


def _size(nbytes: int | float) -> str:
    return f"{nbytes / 1024**3:.2f} GiB" if nbytes >= 0.1 * 1024**3 else f"{nbytes / 1024**2:.1f} MiB"


def _device_memory() -> str:
    try:
        import jax

        limit = jax.local_devices()[0].memory_stats()["bytes_limit"]
    except Exception:  # noqa: BLE001 -- CPU devices have no memory_stats
        return ""
    return f" (the device has {_size(limit)})"


def _memory_flags(exp: Any, program: str) -> list[str]:
    model, flags = getattr(exp, "model", None), []
    if program.endswith("decode"):
        decode = exp.decode
        flags.append(f"fewer --decode.num-samples (now {decode.num_samples})")
        hint = decode.strategy.memory_hint()
        if hint:
            flags.append(hint)
        flags.append(f"fewer --decode.max-new-tokens (now {decode.max_new_tokens})")
        return flags
    split = "eval" if program.endswith("eval") else "train"
    batch = getattr(exp.data, split).batch_size
    flags.append(f"a smaller --data.{split}.batch-size (now {batch})")
    if split == "train":
        remat = getattr(model, "remat_policy", None)
        if remat not in (None, "full"):
            flags.append(f"--model.remat-policy full (now {remat}: recompute each layer's activations)")
    chunk = getattr(model, "loss_chunk_size", None)
    if chunk == 0:
        seq = getattr(exp.data, "seq_len", 0)
        flags.append(f"--model.loss-chunk-size {max(1, seq // 4)} (now 0: the logits of all positions at once)")
    if split == "train":
        micro = exp.learner.num_microbatches
        flags.append(f"--learner.num-microbatches {2 * micro} (now {micro}: the batch in that many sequential parts)")
    return flags


def _kept(job_dir: str | None) -> str:
    steps = []
    if job_dir:
        try:
            steps = [int(p.name) for p in (Path(job_dir) / "checkpoints").iterdir() if p.name.isdigit()]
        except OSError:
            pass
    if not steps:
        return "no checkpoint had been written; nothing else is lost"
    return (
        f"the checkpoints written before are intact (the newest: step {max(steps)}); a rerun with the model or "
        "learner flags above resumes from it (a new batch size needs --checkpoint.allow-config-change)"
    )


# ------------------------------------------------------------------------- warnings and logs

_python_format_warning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """pax_eqx's own warnings (a checkpoint skipped as unreadable, ...) as one `warning: ...` line,
    without the source line Python would quote; other libraries' warnings as Python prints them."""
    if category.__module__.startswith("pax_eqx"):
        return message_lines("warning: ", str(message), sys.stderr) + "\n"
    return _python_format_warning(message, category, filename, lineno, line)


# Library records that say nothing to a user of a healthy run (shown under --verbose):
# orbax restoring a Composite item, which has no per-item metadata file of its own; asyncio
# closing tensorstore's loop under a task that finished after it.
_BENIGN_RECORDS = ("Metadata file does not exist", "Event loop is closed")


def _drop_traceback(record: logging.LogRecord) -> bool:
    """Keeps a library's log record, minus the traceback of a background thread's exception, and
    drops the benign ones above (unless verbose)."""
    if verbose():
        return True
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    return not any(text in record.getMessage() for text in _BENIGN_RECORDS)


class _UnraisableOnce:
    """One line per distinct exception Python had to ignore (raised in a callback after its event
    loop closed, in a __del__, ...), instead of a traceback each time (unless verbose)."""

    def __init__(self, python_hook=sys.__unraisablehook__):
        self.seen: set[tuple[type, str]] = set()
        self.python_hook = python_hook if not isinstance(python_hook, _UnraisableOnce) else python_hook.python_hook

    def __call__(self, unraisable) -> None:
        if verbose():
            self.python_hook(unraisable)
            return
        key = (unraisable.exc_type, str(unraisable.exc_value))
        if key not in self.seen:
            self.seen.add(key)
            name = getattr(unraisable.exc_type, "__name__", str(unraisable.exc_type))
            print_message("warning: ", f"ignored in a background callback: {name}: {unraisable.exc_value}")
