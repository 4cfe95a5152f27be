"""The ETA estimator on a fake clock: a simulated run with a long compile and a slow first call,
evals on a schedule, and a machine whose load changes."""

from __future__ import annotations

import pytest

from pax_eqx.summaries.eta import Eta


def simulate(eta: Eta | None, *, total=2000, per_call=10, step_s=0.14, compile_s=30.0, first_call_s=6.0,
             eval_every=500, eval_s=3.0, slow_after=None):  # fmt: skip
    """A run as the train loop reports it: each call of `per_call` steps seen finished, an eval
    (paused out) every `eval_every` steps before the last. Returns [(time, step)] of the calls
    seen finished and the time the last step finished."""
    now, step, seen = compile_s + first_call_s, per_call, []
    while True:
        seen.append((now, step))
        if eta is not None:
            eta.reached(step, now, seconds_per_step=None)
        if step == total:
            return seen, now
        if step % eval_every == 0:
            if eta is not None:
                eta.pause("evaluating", now)
            now += eval_s
            if eta is not None:
                eta.resume(now)
        step += per_call
        now += per_call * step_s * (2.0 if slow_after is not None and step > slow_after else 1.0)


def test_the_first_eta_is_within_a_few_percent_of_the_time_left():
    """The default run's shape: 18 s of compile and first call, 0.14 s a step, a summary every
    50 steps. At the first summary the old rule (steps done / time since the start) said 3.3
    times the time left (the real run said 1,039 s for 306 s); the recent rate after the first
    call says it within 5% (low by the three evals not yet seen), and within half a second
    once the first eval has been timed."""
    eta = Eta(2000, {"evaluating": 500})
    seen, end = simulate(eta, compile_s=15.0, first_call_s=3.0)
    _, finished = simulate(None, compile_s=15.0, first_call_s=3.0)
    assert end == finished  # the pauses were the simulation's own

    replay = Eta(2000, {"evaluating": 500})
    errors = []
    for now, step in seen:
        replay.reached(step, now)
        if step == 10:
            assert replay.seconds_left(now) is None  # one step known: no rate yet (and no hint given)
        if step == 50:  # the first summary
            truth = end - now
            assert abs(replay.seconds_left(now) - truth) / truth < 0.05
            assert (2000 - step) * now / step / truth > 3.0  # the old rule, compile included
        if step > 500:  # the first eval timed
            errors.append(abs(replay.seconds_left(now) - (end - now)))
        if step % 500 == 0 and step < 2000:
            replay.pause("evaluating", now)
            replay.resume(now + 3.0)
    assert max(errors) < 0.5  # seconds


def test_a_slower_machine_is_followed_within_the_window():
    """Half the speed from step 1000 on: a minute of slower steps later, the ETA is the new rate's."""
    eta = Eta(2000, {"evaluating": 500}, window_s=60.0)
    seen, end = simulate(eta, slow_after=1000, total=2000)
    replay = Eta(2000, {"evaluating": 500}, window_s=60.0)
    for now, step in seen:
        replay.reached(step, now)
        if step % 500 == 0 and step < 2000:
            replay.pause("evaluating", now)
            replay.resume(now + 3.0)
        if step == 1500:  # 70 s of slow steps behind it
            assert replay.seconds_per_step() == pytest.approx(0.28)
            assert replay.seconds_left(now) == pytest.approx(end - now, abs=0.5)


def test_the_estimate_counts_down_between_updates_and_stops_at_zero():
    eta = Eta(100)
    eta.reached(10, 10.0)
    eta.reached(40, 16.0)  # 0.2 s a step: 60 steps, 12 s
    assert eta.seconds_left(16.0) == pytest.approx(12.0)
    assert eta.seconds_left(20.0) == pytest.approx(8.0)
    assert eta.seconds_left(40.0) == 0.0


def test_a_hint_stands_in_until_the_steps_span_five_seconds():
    """A call's end is seen when the host looks: over a short span that lag is the rate."""
    eta = Eta(500)
    eta.reached(40, 100.0, seconds_per_step=6.1)
    assert eta.seconds_left(100.0) == pytest.approx(460 * 6.1)
    eta.reached(50, 150.0, seconds_per_step=6.1)  # its own rate now: 5 s a step
    assert eta.seconds_left(150.0) == pytest.approx(450 * 5.0)
    fast = Eta(2000)
    fast.reached(10, 50.0, seconds_per_step=0.2)
    fast.reached(20, 51.0, seconds_per_step=0.2)  # 0.1 s a step seen, over 1 s: the hint still
    assert fast.seconds_per_step() == 0.2
    fast.reached(40, 55.0)
    assert fast.seconds_per_step() == pytest.approx(0.1667, abs=1e-4)


def test_a_step_already_known_adds_nothing():
    """A summary after the drain that reported its step: the host's time is not a step's."""
    eta = Eta(100)
    eta.reached(10, 10.0)
    eta.reached(40, 16.0)
    eta.reached(40, 17.0)
    assert eta.seconds_per_step() == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("step", "done_here", "to_come"),
    [(100, False, 3), (500, False, 3), (500, True, 2), (1500, True, 0), (1999, False, 0)],
)
def test_the_events_still_to_come_before_the_last_step(step, done_here, to_come):
    """An eval every 500 of 2000 steps runs at 500, 1000 and 1500 (the one at 2000 is after the
    bar ends); a step of 1 s, an eval of 3 s (timed ten steps before)."""
    eta = Eta(2000, {"evaluating": 500, "unscheduled": 0})
    assert set(eta.events) == {"evaluating"}  # no schedule: its time counts as the steps'
    eta.reached(step - 10, 0.0)
    eta.pause("evaluating", 0.0)
    eta.resume(3.0)
    eta.reached(step, 13.0)
    if done_here:
        eta.pause("evaluating", 13.0)
        eta.resume(16.0)
    now = 16.0 if done_here else 13.0
    assert eta.seconds_left(now) == pytest.approx((2000 - step) * 1.0 + to_come * 3.0)


def test_an_event_without_a_schedule_is_not_paused():
    eta = Eta(100)
    eta.reached(10, 0.0)
    eta.pause("saving a checkpoint", 1.0)
    eta.resume(3.0)
    eta.reached(20, 6.0)
    assert eta.seconds_per_step() == pytest.approx(0.6)  # the 2 s are the steps'
