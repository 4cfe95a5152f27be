"""SIGTERM and SIGINT during a training run: finish the step, save, exit 0. A closed stdout
(`train ... | head -1`) stops the same way, and the run exits 141 (pax_eqx.closed_stdout)."""

from __future__ import annotations

import os
import signal

from pax_eqx import closed_stdout
from pax_eqx.sharding.distributed import any_host


class StopFlag:
    """Set by SIGTERM/SIGINT; read once per step. Agreed across hosts when there are several.

    Installed for the whole run, so a preemption notice that arrives while the run is still
    compiling or restoring is honoured after the first step. A second SIGINT (Ctrl-C twice)
    stops at once without saving, as a user pressing it again expects; SIGTERM never does,
    since schedulers resend it while they wait for the save.

    The handler acknowledges the signal on stderr with one unbuffered `os.write`: a `print`
    there could re-enter a stdout write the main thread was in the middle of, and fail.
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        self._forget_stdout = closed_stdout.on_close(self._stdout_closed)
        return self

    def _stdout_closed(self):
        if not self.requested:
            os.write(2, b"stdout was closed: finishing the current step, then saving a checkpoint and exiting.\n")
        self.requested = self.requested or "closed stdout"

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            after = "second SIGINT" if self.requested == "SIGINT" else f"SIGINT after {self.requested}"
            raise KeyboardInterrupt(f"{after}: stopping without saving")
        if not self.requested:
            note = f"{name} received: finishing the current step, then saving a checkpoint and exiting.\n"
            os.write(2, note.encode())
        self.requested = self.requested or name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._forget_stdout()

    def agreed(self) -> bool:
        return any_host(bool(self.requested))
