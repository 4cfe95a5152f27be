"""What every `python -m pax_eqx.<program>` shares: one `error: ...` line and an exit status.

    exit 0    done (or stopped by SIGTERM/SIGINT after saving a checkpoint)
    exit 1    the run started and then failed: NaN/Inf loss, a failing data pipeline, a
              checkpoint that cannot be written or read (pax_eqx.programs.errors,
              pax_eqx.checkpoint); the checkpoints written before are intact
    exit 2    a user error: a bad flag, field, value, path, data file or job dir, found before
              anything is written; the message names the field, the value and the fix
    exit 130  interrupted (Ctrl-C twice, or before training began) without saving

No traceback is printed for these; set PAX_EQX_TRACEBACK=1 to see it anyway. Anything else is
a bug in pax_eqx and keeps its traceback.

Only pax_eqx's own error types count as a user error or a run failure: `ConfigError` (and its
subclasses `JobDirError`, `UnknownExperimentError`) and `CheckpointMismatchError` exit 2;
`RunError` and `CheckpointError` exit 1. A bare ValueError, FileNotFoundError or
PermissionError is not one of them, whoever raised it: were it caught here, a bug in pax_eqx
(or in a library under it) would print as a user's mistake and lose its traceback. Code that
finds a bad input raises ConfigError (a ValueError, so `except ValueError` still catches it).

Background threads of orbax and tensorstore report a failed write (a full disk) in their own
words as well: their log records keep their message but lose the traceback, and exceptions
that Python can only ignore ("Event loop is closed" from a callback after a failed save) are
named once, in one `warning:` line each -- unless PAX_EQX_TRACEBACK=1.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable

from pax_eqx.checkpoint import CheckpointError
from pax_eqx.checkpoint.checkpointer import CheckpointMismatchError
from pax_eqx.config import ConfigError
from pax_eqx.programs.cli import CliError
from pax_eqx.programs.errors import RunError

# ConfigError covers JobDirError and UnknownExperimentError (its subclasses). A checkpoint that
# does not match the model is a bad input too (the wrong flags or job dir), found before a step
# runs: exit 2, although it is a CheckpointError.
USER_ERRORS = (ConfigError, CheckpointMismatchError)
RUN_ERRORS = (RunError, CheckpointError)


def run(main: Callable[[], int]) -> None:
    warnings.formatwarning = _format_warning
    if not os.environ.get("PAX_EQX_TRACEBACK"):
        for library in ("absl", "asyncio"):  # orbax's threads; tensorstore's unretrieved write tasks
            logging.getLogger(library).addFilter(_drop_traceback)
        sys.unraisablehook = _UnraisableOnce()
    try:
        code = main()
    except CliError as e:
        code = e.code
    except USER_ERRORS as e:
        code = _report(e, 2)
    except RUN_ERRORS as e:
        code = _report(e, 1)
    except KeyboardInterrupt as e:
        if os.environ.get("PAX_EQX_TRACEBACK"):
            raise
        reason = f" ({e})" if str(e) else ""
        print(
            f"error: interrupted{reason}; nothing was saved since the newest checkpoint. Rerun the same command to "
            "resume from it.",
            file=sys.stderr,
        )
        code = 130
    sys.exit(code)


def _report(error: BaseException, code: int) -> int:
    if os.environ.get("PAX_EQX_TRACEBACK"):
        raise error
    print(f"error: {error}", file=sys.stderr)
    return code


_python_format_warning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """pax_eqx's own warnings (a checkpoint skipped as unreadable, ...) as one `warning: ...` line,
    without the source line Python would quote; other libraries' warnings as Python prints them."""
    if category.__module__.startswith("pax_eqx"):
        return f"warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


def _drop_traceback(record: logging.LogRecord) -> bool:
    """Keeps a library's log record, minus the traceback of a background thread's exception."""
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    return True


class _UnraisableOnce:
    """One line per distinct exception Python had to ignore (raised in a callback after its event
    loop closed, in a __del__, ...), instead of a traceback each time."""

    def __init__(self):
        self.seen: set[tuple[type, str]] = set()

    def __call__(self, unraisable) -> None:
        key = (unraisable.exc_type, str(unraisable.exc_value))
        if key not in self.seen:
            self.seen.add(key)
            name = getattr(unraisable.exc_type, "__name__", str(unraisable.exc_type))
            print(f"warning: ignored in a background callback: {name}: {unraisable.exc_value}", file=sys.stderr)
