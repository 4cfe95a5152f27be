"""SIGTERM and SIGINT: finish the current step, save a checkpoint, say so, exit 0; the rerun
continues bit for bit. Ctrl-C twice: stop at once, exit 130, save nothing.

One job dir, four stops: Ctrl-C twice before step 2 (nothing saved), SIGTERM while the run is
still compiling (honoured after step 1), SIGTERM at step 5 (not a checkpoint step: the stop
forces one), SIGINT at step 7; then a final rerun to the end, whose every metrics line equals
the uninterrupted reference run's.
"""

from __future__ import annotations

import signal

from reliability_harness import (
    NUM_STEPS,
    Running,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    reference,
    run,
    trajectory,
)


def stop_at(job, step: int, sig: signal.Signals) -> Running:
    """Parks the run before step `step`, sends `sig`, lets it go on; it must stop after `step`."""
    r = Running(job, faults=f"hold:train:{step}")
    r.wait_for_hold(f"train-{step}")
    r.proc.send_signal(sig)
    r.wait_for(lambda: f"{sig.name} received" in r.stderr, f"the run to acknowledge {sig.name}")
    r.release(f"train-{step}")
    assert r.finish() == 0, r.stderr[-3000:]
    assert f"Stop requested ({sig.name}): saved a checkpoint at step {step}; exiting." in r.stdout
    assert max(trajectory(job)) == step
    assert_no_traceback(r.stderr)
    return r


def test_sigterm_and_sigint_save_exit_0_and_the_rerun_is_bitwise_equal(tmp_path):
    ref = reference()
    job = tmp_path / "job"

    r = Running(job, faults="hold:train:2")
    r.wait_for_hold("train-2")
    r.proc.send_signal(signal.SIGINT)
    r.wait_for(lambda: "SIGINT received" in r.stderr, "the run to acknowledge SIGINT")
    r.proc.send_signal(signal.SIGINT)
    assert r.finish() == 130, r.stderr[-3000:]
    assert_no_traceback(r.stderr)
    assert "error: interrupted (second SIGINT: stopping without saving)" in r.stderr
    assert committed_steps(job) == []

    r = Running(job)
    r.wait_for(lambda: "Starting" in r.stdout, "the run to start compiling")
    r.proc.send_signal(signal.SIGTERM)
    assert r.finish() == 0, r.stderr[-3000:]
    assert "Stop requested (SIGTERM): saved a checkpoint at step 1" in r.stdout
    assert committed_steps(job) == [1]

    stop_at(job, 5, signal.SIGTERM)
    assert committed_steps(job)[-1] == 5
    stop_at(job, 7, signal.SIGINT)
    assert committed_steps(job)[-1] == 7

    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming shakespeare_char from checkpoint at step 7" in done.stdout
    assert f"Finished at step {NUM_STEPS}" in done.stdout
    assert_every_record_matches(job, ref)


def test_sigint_after_sigterm_is_named_as_such_and_sigterm_twice_never_stops_at_once():
    """It said 'second SIGINT' after a SIGTERM and one SIGINT."""
    import pytest

    from pax_eqx.programs.train.stop_flag import StopFlag

    with StopFlag() as flag:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # schedulers resend it while they wait for the save
        assert flag.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match=r"^SIGINT after SIGTERM: stopping without saving$"):
            signal.raise_signal(signal.SIGINT)
