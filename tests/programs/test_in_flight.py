"""InFlight: which dispatched calls have finished, seconds per step, and the bound on queued work,
driven by a fake device (calls that finish at given times on a fake clock) and, last, by jax."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from pax_eqx.programs.train.in_flight import InFlight


class FakeDevice:
    """Runs dispatched calls one after another, `seconds` each, on a clock the test moves; a
    marker is ready once the clock has passed its call's end. `wait` moves the clock to it."""

    def __init__(self):
        self.now = 0.0
        self.free_at = 0.0  # when the device finishes the work queued so far
        self.waited: list[int] = []

    def dispatch(self, seconds: float) -> float:
        """A call taking `seconds`; its marker (the time it ends)."""
        self.free_at = max(self.free_at, self.now) + seconds
        return self.free_at

    def is_ready(self, marker: float) -> bool:
        return self.now >= marker

    def wait(self, marker: float) -> None:
        self.waited.append(marker)
        self.now = max(self.now, marker)

    def tracker(self, start_step: int = 0, **kwargs) -> InFlight:
        return InFlight(start_step, clock=lambda: self.now, is_ready=self.is_ready, wait=self.wait, **kwargs)


def run_loop(device: FakeDevice, tracker: InFlight, *, calls: int, steps: int, seconds_per_step: float,
             host_seconds: float, sync_every: int) -> int:  # fmt: skip
    """The train loop's pattern: dispatch, (every `sync_every` calls a summary: drain), make_room;
    the host spends `host_seconds` preparing each call. The most calls ever in flight."""
    most = 0
    for i in range(1, calls + 1):
        device.now += host_seconds
        tracker.dispatched(i * steps, steps, device.dispatch(steps * seconds_per_step))
        most = max(most, tracker.in_flight)
        if i % sync_every == 0:
            tracker.drain()
        tracker.make_room()
    return most


def test_a_fast_model_never_blocks():
    """The default experiment's shape: calls of 10 steps at 0.1 s a step, a summary every 5
    calls, the host far ahead: every call of an interval is queued and nothing waits but the
    third call, for the first (nothing known of a step's time then), with the second queued."""
    device = FakeDevice()
    tracker = device.tracker()
    most = run_loop(device, tracker, calls=200, steps=10, seconds_per_step=0.1, host_seconds=0.005, sync_every=5)
    assert tracker.waits == 1 and device.waited[0] == pytest.approx(1.005)
    assert device.now == pytest.approx(200 * 1.0 + 40 * 0.005)  # idle only after each summary's sync, as before
    assert most == 5  # the host ran a whole summary interval ahead, as without the tracker
    assert tracker.completed_step == 2000
    assert tracker.seconds_per_step() == pytest.approx(0.1)


def test_a_slow_model_keeps_about_the_budget_queued():
    """Calls of 1 s with a summary only every 100 calls: unbounded, 100 s would be queued; the
    bound keeps at most the budget (5 s) plus the call just dispatched, and the device is never
    idle (the run takes the device's time)."""
    device = FakeDevice()
    tracker = device.tracker(budget_s=5.0)
    most = run_loop(device, tracker, calls=300, steps=1, seconds_per_step=1.0, host_seconds=0.01, sync_every=100)
    assert tracker.waits > 0
    assert most <= 7
    assert device.now == pytest.approx(300 * 1.0 + 0.01, abs=0.05)  # no idle device: the host only waited
    assert tracker.seconds_per_step() == pytest.approx(1.0, rel=0.02)


def test_a_call_longer_than_the_budget_runs_alone():
    """Calls of 60 s: once the first has finished, the host waits for each before the next
    dispatch, so a stop request read after make_room waits for nothing."""
    device = FakeDevice()
    tracker = device.tracker(budget_s=5.0)
    most = run_loop(device, tracker, calls=3, steps=10, seconds_per_step=6.0, host_seconds=0.01, sync_every=100)
    assert most == 3 and tracker.in_flight == 0  # the third was dispatched before the first finished
    assert tracker.completed_step == 30


def test_the_first_call_counts_before_anything_has_finished():
    """No finished call yet: the oldest call's time so far is the estimate, so a slow first step
    bounds the queue as soon as the queued work behind it passes the budget."""
    device = FakeDevice()
    tracker = device.tracker(budget_s=5.0)
    tracker.dispatched(1, 1, device.dispatch(100.0))  # the first step takes 100 s
    assert tracker.queued_seconds() == 0.0  # nothing known, nothing queued behind it
    device.now = 3.0
    tracker.dispatched(2, 1, device.dispatch(100.0))
    assert tracker.queued_seconds() == pytest.approx(3.0)  # step 2 takes at least as long as step 1 so far
    tracker.make_room()
    assert tracker.waits == 0
    device.now = 6.0
    tracker.make_room()
    # waited for step 1, which says a step takes 100 s: step 2, queued behind it, is more than the budget
    assert device.waited == [100.0, 200.0]
    assert tracker.completed_step == 2 and tracker.in_flight == 0


def test_poll_never_blocks_and_reports_in_order():
    device = FakeDevice()
    heard: list[tuple[int, float | None]] = []
    tracker = device.tracker(start_step=40, on_finish=lambda step, rate: heard.append((step, rate)))
    for end in (50, 60, 70):
        tracker.dispatched(end, 10, device.dispatch(2.0))
    assert tracker.poll() == 40 and tracker.seconds_per_step() is None
    device.now = 2.5
    assert tracker.poll() == 50
    device.now = 4.5
    assert tracker.poll() == 60
    # each seen 0.5 s late (2.0 s and 4.0 s): step 50 charged 2.5 s, step 60 from then, 2.0 s
    assert heard == [(50, pytest.approx(0.25)), (60, pytest.approx(4.5 / 20))]
    assert device.waited == []
    tracker.drain()
    assert tracker.completed_step == 70 and tracker.in_flight == 0


def test_several_calls_seen_finished_at_once_still_average_right():
    device = FakeDevice()
    tracker = device.tracker()
    for end in range(1, 5):
        tracker.dispatched(end, 1, device.dispatch(0.5))
    device.now = 10.0  # the host was away (a long log write): all four seen finished now
    tracker.poll()
    device.now = 10.0
    for end in range(5, 9):
        tracker.dispatched(end, 1, device.dispatch(0.5))
    tracker.drain()
    # the first four are charged 10 s (the host saw them late), the next four 0.5 s each
    assert tracker.seconds_per_step() == pytest.approx((10.0 + 2.0) / 8)


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError, match="budget_s must be > 0, got 0.0"):
        InFlight(0, budget_s=0.0)


def test_with_jax_arrays():
    """The real readiness test and wait, on arrays jax computed."""
    tracker = InFlight(0)
    for step in (1, 2):
        tracker.dispatched(step, 1, jnp.ones(3) * step)
    tracker.make_room()
    tracker.drain()
    assert tracker.completed_step == 2 and tracker.in_flight == 0
    assert tracker.seconds_per_step() is not None
