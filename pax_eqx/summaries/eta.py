"""How long a run has left: the recent steps' rate after the compile, plus the evals to come.

    eta = Eta(total_steps=2000, events={"evaluating": 500})
    eta.reached(step, now)              # the device has finished `step` (a summary, a call seen done)
    eta.pause("evaluating", now) ... eta.resume(now)
    eta.seconds_left(now)               # None until a rate is known

The bar used to divide the steps done by the time since the run began. That time holds the
compile (tens of seconds on the default run, minutes on a large model) and the first calls,
so the first ETA was two to three times the real one and converged only slowly (measured on
the default run: 1,039 s shown at step 50 for 306 s left; this rule said 203 s for 218 s in
another run). Here

- the rate is measured from the first step the device is seen to finish (the compile and
  the first call are before it) over the last `window_s` seconds of steps (two minutes: a
  machine whose speed changes for good is followed within them, while a load that comes and
  goes for seconds moves the estimate little; replayed on two default runs on a shared
  2-core machine, a 30 s window was off by 16% and 30% on average, 120 s by 9% and 30%);
- time spent in an event with a schedule (an eval every 500 steps, a checkpoint, the plots)
  is paused out of the steps' time, measured on its own (the mean of its last three), and
  added once for each of its occurrences still to come before the last step. An event not
  yet seen adds nothing: the estimate is low by one eval until the first eval;
- until the steps known span `min_span_s` (5 s: a call's end is seen when the host looks, a
  second or so late, which a shorter span would magnify), the caller's own seconds-per-step
  (the device's time of the calls seen finished: pax_eqx.programs.train.in_flight) stands in,
  so a slow model has an ETA after its first call.

Between updates the estimate counts down with the clock (`seconds_left(now)`), so a bar
redrawn four times a second does not freeze between summaries. The clock is passed in (times
are the caller's `time.monotonic()`), so the rule is tested with a fake one
(tests/summaries/test_progress_eta.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

WINDOW_S = 120.0  # the seconds of recent steps the rate is averaged over
MIN_SPAN_S = 5.0  # the fewest seconds of steps a rate is measured over (the hint stands in before)
_KEPT_DURATIONS = 3  # an event's duration: the mean of its last few


class Eta:
    """Seconds left to `total_steps`; see the module doc."""

    def __init__(
        self,
        total_steps: int,
        events: Mapping[str, int] | None = None,
        *,
        window_s: float = WINDOW_S,
        min_span_s: float = MIN_SPAN_S,
    ):
        """`events`: what the run does between steps on a schedule (a `Progress.doing` status)
        -> every how many steps (0: not on a step schedule, its time counts as the steps')."""
        self.total_steps = total_steps
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.events = {name: every for name, every in (events or {}).items() if every > 0}
        self._samples: deque[tuple[int, float]] = deque()  # (step, steps' time) after the first call
        self._paused_s = 0.0  # event time so far, left out of the steps' time
        self._pause: tuple[str, float] | None = None  # the event in progress and when it began
        self._durations: dict[str, deque[float]] = {name: deque(maxlen=_KEPT_DURATIONS) for name in self.events}
        self._done_at: dict[str, int] = {}  # the step each event last ran at
        self._hint: float | None = None  # the caller's seconds per step, before two samples
        self._estimate: tuple[float, float] | None = None  # (seconds left, the clock when estimated)

    @property
    def step(self) -> int | None:
        """The newest step known finished."""
        return self._samples[-1][0] if self._samples else None

    def reached(self, step: int, now: float, seconds_per_step: float | None = None) -> None:
        """The device had finished `step` at `now`. A step already known is ignored (a summary
        after the drain that reported it adds only host time)."""
        if seconds_per_step:
            self._hint = seconds_per_step
        if self._samples and step <= self._samples[-1][0]:
            return
        self._samples.append((step, self._steps_time(now)))
        while len(self._samples) > 2 and self._samples[1][1] <= self._samples[-1][1] - self.window_s:
            self._samples.popleft()  # the oldest is kept only while the next is inside the window
        self._estimate_at(now)

    def pause(self, event: str, now: float) -> None:
        """`event` began: its time is not the steps'. An event without a schedule is ignored."""
        if event in self.events and self._pause is None:
            self._pause = (event, now)

    def resume(self, now: float) -> None:
        """The event in progress ended (nothing when none was)."""
        if self._pause is None:
            return
        event, began = self._pause
        self._pause = None
        self._paused_s += now - began
        self._durations[event].append(now - began)
        if self.step is not None:
            self._done_at[event] = self.step
        self._estimate_at(now)

    def seconds_per_step(self) -> float | None:
        """The steps' recent rate (event time left out): over the window's samples, or the
        caller's hint while they span less than `min_span_s`."""
        if len(self._samples) < 2 or self._samples[-1][1] - self._samples[0][1] < self.min_span_s:
            return self._hint
        (first, began), (last, ended) = self._samples[0], self._samples[-1]
        return (ended - began) / (last - first)

    def seconds_left(self, now: float) -> float | None:
        """The last estimate less the time since it was made (never below 0); None before a
        rate is known."""
        if self._estimate is None:
            return None
        left, at = self._estimate
        return max(left - (now - at), 0.0)

    def _estimate_at(self, now: float) -> None:
        per_step, step = self.seconds_per_step(), self.step
        if per_step is None or step is None:
            return
        left = (self.total_steps - step) * per_step
        for event, every in self.events.items():
            if self._durations[event]:
                mean = sum(self._durations[event]) / len(self._durations[event])
                left += self._still_to_come(event, every, step) * mean
        self._estimate = (max(left, 0.0), now)

    def _still_to_come(self, event: str, every: int, step: int) -> int:
        """How many times `event` runs from `step` (unless it has run there) to before the last step."""
        after = step if self._done_at.get(event, -1) >= step else step - 1
        return max((self.total_steps - 1) // every - after // every, 0)

    def _steps_time(self, now: float) -> float:
        """The clock less the time spent in events: the steps' own time."""
        paused = self._paused_s + (now - self._pause[1] if self._pause else 0.0)
        return now - paused
