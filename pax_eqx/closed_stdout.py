"""A closed stdout (`train ... | head -1`, a pager quit early) ends a command quietly.

Python ignores SIGPIPE, so the first write after the reader left raises BrokenPipeError, and the
flush at exit raises it again under "Exception ignored". A C program would die of SIGPIPE and
the shell would report 141; that is what a closed stdout means here too, without the traceback:

- `guard()` (pax_eqx.command_line.entry.run installs it) wraps sys.stdout. The first
  BrokenPipeError points the file descriptor at /dev/null, so no later write or the flush at
  exit fails again, and marks the stream closed.
- A program that can stop cleanly registers `on_close(callback)`: the train loop's stop flag
  does, so a closed stdout saves a checkpoint at the end of the current step, like SIGTERM,
  and nothing is lost. Its writes are then discarded and it goes on to that save.
- With no callback registered (eval, decode, plots, --help), the write raises
  `StdoutClosed`; the entry point exits 141 at once, with nothing on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_STATUS = 141  # 128 + SIGPIPE, what the shell reports for a reader that left


class StdoutClosed(BrokenPipeError):
    """stdout's reader left and no program asked to be told: the command ends with 141."""


class _State:
    closed = False
    callbacks: list[Callable[[], None]] = []


def closed() -> bool:
    """Whether stdout's reader left during this command."""
    return _State.closed


def on_close(callback: Callable[[], None]) -> Callable[[], None]:
    """Calls `callback()` (once, from the writing thread) when stdout's reader leaves, instead
    of raising into the write. Returns a function that removes it again."""
    _State.callbacks.append(callback)
    return lambda: _State.callbacks.remove(callback) if callback in _State.callbacks else None


class _GuardedStdout:
    """sys.stdout, minus the BrokenPipeError: everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if _State.closed:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _closed_now()
            return len(text)

    def flush(self) -> None:
        if _State.closed:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            _closed_now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _closed_now() -> None:
    _State.closed = True
    try:  # the descriptor now discards: the flush at interpreter exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass
    callbacks = list(_State.callbacks)
    if not callbacks:
        raise StdoutClosed("stdout was closed by its reader")
    for callback in callbacks:
        callback()


def guard() -> None:
    """Wraps sys.stdout (once) and forgets a previous command's state (tests run several)."""
    _State.closed, _State.callbacks = False, []
    if not isinstance(sys.stdout, _GuardedStdout):
        sys.stdout = _GuardedStdout(sys.stdout)
