"""The compiled train calls dispatched but not yet run, and how long a step takes.

JAX returns from a compiled call before the device has run it, so the train loop runs ahead
and queues every call up to its next host sync (a summary's `device_get`). That keeps the
device busy; on a slow model it also queues minutes of work: nothing can say which step is
running, and a stop request (SIGTERM) is honoured only once every queued step has run.

`InFlight` remembers, for each call, the step it ends at and one of its output arrays (a
call's outputs are all ready together), asks `jax.Array.is_ready()` (which never blocks)
which calls have finished, and estimates the seconds a step takes from them. `make_room`
blocks on the oldest call only while the work still queued exceeds `budget_s`, or, before any
call has finished (nothing known of a step's time), while more than two calls are in flight:

- on a fast model (the default experiment: about 0.1 s a step, 50 steps between syncs) the
  queue never holds that much, so nothing blocks after the first call (the third waits for the
  first, with the second queued: the device never idles) and the loop runs as before;
- on a slow one the queue is held to `budget_s` (a call longer than that runs alone), so a
  stop waits for about `budget_s` or one call, not for the whole summary interval, and
  `completed_step` says which step the device has finished.

Calls finish in order (each one's state is the next one's input), so only the oldest is
ever asked. A call's time is counted from when it could start: its dispatch, or the end of
the call before it, whichever is later; where several calls are seen finished at once their
summed time is still right. `drain` waits for every call, one by one (so `on_finish` hears of
each as it ends): the loop calls it where it is about to wait anyway (a summary, an eval, a
checkpoint), so the time spent after it is not counted as steps.

The clock, the readiness test and the wait are parameters, so the rule is tested with fake
markers and a fake clock (tests/programs/test_in_flight.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

BUDGET_S = 5.0  # the most queued work (seconds) make_room lets a slow model keep in flight


def _is_ready(marker: Any) -> bool:
    return marker.is_ready()


def _wait(marker: Any) -> None:
    jax.block_until_ready(marker)


@dataclass(frozen=True)
class _Call:
    end_step: int  # the step the call ends at
    steps: int  # how many steps it runs (train.steps_per_loop, or 1)
    marker: Any  # one of its output arrays
    dispatched_at: float


class InFlight:
    """The calls in flight; see the module doc.

    in_flight = InFlight(start_step=0)
    ... state, outputs = train_step(state, batch)
    in_flight.dispatched(step, 1, outputs.metrics["total_loss"].value)
    in_flight.make_room()     # before the next dispatch: blocks only on a slow model
    in_flight.completed_step, in_flight.seconds_per_step()
    """

    def __init__(
        self,
        start_step: int,
        budget_s: float = BUDGET_S,
        *,
        window: int = 8,
        clock: Callable[[], float] = time.monotonic,
        is_ready: Callable[[Any], bool] = _is_ready,
        wait: Callable[[Any], None] = _wait,
        on_finish: Callable[[int, float | None], None] | None = None,
    ):
        """`on_finish(completed_step, seconds_per_step)` is called as each call is seen finished."""
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}.")
        self.budget_s = budget_s
        self.completed_step = start_step  # the newest step the device has finished
        self.completed_at: float | None = None  # when it was seen finished (clock's time)
        self.waits = 0  # how many times make_room blocked (on a fast model once: the third call, for the first)
        self._calls: deque[_Call] = deque()
        self._steps_in_flight = 0
        self._recent: deque[tuple[float, int]] = deque(maxlen=window)  # (seconds, steps) of finished calls
        self._clock, self._is_ready, self._wait = clock, is_ready, wait
        self._on_finish = on_finish

    def dispatched(self, end_step: int, steps: int, marker: Any) -> None:
        """A call running `steps` steps up to `end_step` was dispatched; `marker` is one of its outputs."""
        self._calls.append(_Call(end_step, steps, marker, self._clock()))
        self._steps_in_flight += steps
        self.poll()

    def poll(self) -> int:
        """Notes the calls that have finished (never blocks); returns `completed_step`."""
        while self._calls and self._is_ready(self._calls[0].marker):
            self._finish_oldest()
        return self.completed_step

    def drain(self) -> None:
        """Waits for every call in flight, oldest first."""
        while self._calls:
            self._wait(self._calls[0].marker)
            self._finish_oldest()

    def make_room(self) -> None:
        """Blocks on the oldest call while more than `budget_s` of work is queued (or, with no
        call finished yet, more than two calls)."""
        self.poll()
        while self._calls and (self.queued_seconds() > self.budget_s or (not self._recent and len(self._calls) > 2)):
            self._wait(self._calls[0].marker)
            self.waits += 1
            self._finish_oldest()

    @property
    def in_flight(self) -> int:
        """How many calls are dispatched and not yet seen finished."""
        return len(self._calls)

    def seconds_per_step(self) -> float | None:
        """The average over the last `window` finished calls (None before the first)."""
        steps = sum(n for _, n in self._recent)
        return sum(s for s, _ in self._recent) / steps if steps else None

    def queued_seconds(self) -> float:
        """The work still to run in the calls in flight, estimated: their steps times the
        seconds a step takes, less what the oldest has run already. A call that has run longer
        than the estimate says raises it (so the first call, with nothing finished before it,
        counts too)."""
        if not self._calls:
            return 0.0
        oldest = self._calls[0]
        running = max(self._clock() - self._started(oldest), 0.0)
        per_step = max(self.seconds_per_step() or 0.0, running / oldest.steps)
        return max(self._steps_in_flight * per_step - running, 0.0)

    def _started(self, call: _Call) -> float:
        """When `call` could start: its dispatch, or the end of the call before it."""
        if self.completed_at is None:
            return call.dispatched_at
        return max(call.dispatched_at, self.completed_at)

    def _finish_oldest(self) -> None:
        call = self._calls.popleft()
        now = self._clock()
        self._recent.append((max(now - self._started(call), 0.0), call.steps))
        self._steps_in_flight -= call.steps
        self.completed_step, self.completed_at = call.end_step, now
        if self._on_finish is not None:
            self._on_finish(self.completed_step, self.seconds_per_step())
