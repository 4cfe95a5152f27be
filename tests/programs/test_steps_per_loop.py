"""train.steps_per_loop: K steps in one compiled call train exactly as K calls of one step do,
with the same summaries, evals and checkpoints, resume exactly, and take any interval (the steps
up to an event a loop would pass run one a call)."""

import json

import jax
import pytest
from tiny import TINY, mesh_args
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx import train
from pax_eqx.command_line import cli
from pax_eqx.programs.train.train_loop import _loop_length
from pax_eqx.summaries.writer import TIMING_KEYS

# 8 steps: summaries every 2, evals and checkpoints every 4.
RUN = [*TINY, "--train.num-steps", "8", "--train.eval-interval-steps", "4", "--checkpoint.every-n-steps", "4"]


def _args(job, *extra):
    return ["--exp", "shakespeare_char", "--job-log-dir", str(job), *RUN, *mesh_args(jax.device_count()), *extra]


def _rows(job) -> list[dict]:
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]  # clocks and rates


def _metrics(row: dict) -> dict:
    """A row's numbers, each a leaf compared against its own scale (a loss, a learning rate)."""
    return {k: v for k, v in row.items() if k not in ("split", "step")}


def _checkpoints(job) -> list[str]:
    return sorted(p.name for p in (job / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    job = tmp_path_factory.mktemp("k1")
    assert train.main(_args(job, "--train.no-sample-at-end")) == 0
    return job


def test_several_steps_per_call_train_the_same(one_step_run, tmp_path):
    job = tmp_path / "k2"
    assert train.main(_args(job, "--train.no-sample-at-end", "--train.steps-per-loop", "2")) == 0
    ours, theirs = _rows(job), _rows(one_step_run)
    assert [(r["split"], r["step"]) for r in ours] == [(r["split"], r["step"]) for r in theirs]
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        assert_same_math_tree(_metrics(a), _metrics(b))
    assert _checkpoints(job) == _checkpoints(one_step_run) == ["4", "8"]


def test_a_resumed_loop_run_continues_exactly(one_step_run, tmp_path):
    """Stopped at step 4 and resumed with 2 steps per call, against the one-step run throughout."""
    job = tmp_path / "resumed"
    assert train.main(_args(job, "--train.no-sample-at-end", "--train.num-steps", "4")) == 0
    assert train.main(_args(job, "--train.no-sample-at-end", "--train.steps-per-loop", "2")) == 0
    assert_same_math(
        [r["total_loss"] for r in _rows(job) if r["step"] > 4],
        [r["total_loss"] for r in _rows(one_step_run) if r["step"] > 4],
    )


def test_loop_length_catches_up_to_a_multiple_and_stops_at_the_end():
    exp, _, _ = cli.parse(
        ["--train.num-steps", "10", "--train.steps-per-loop", "4", "--train.eval-interval-steps", "0",
         "--train.summary-interval-steps", "4", "--checkpoint.every-n-steps", "4"],
        "test", "test", job_dir_required=False,
    )  # fmt: skip
    assert [_loop_length(exp, s) for s in (0, 3, 4, 5, 7, 8, 9)] == [4, 1, 4, 1, 1, 1, 1]
    profiled = exp.replace(profile=exp.profile.replace(steps=(5, 6)))
    assert [_loop_length(profiled, s) for s in (0, 4, 7, 8)] == [4, 1, 1, 1]


def test_intervals_the_loop_does_not_divide_put_single_steps_before_each_event():
    exp, _, _ = cli.parse(
        ["--train.num-steps", "20", "--train.steps-per-loop", "10", "--train.eval-interval-steps", "15",
         "--train.summary-interval-steps", "10", "--checkpoint.every-n-steps", "0"],
        "test", "test", job_dir_required=False,
    )  # fmt: skip
    exp.validate(num_devices=1)  # nothing refused
    step, calls = 0, []
    while step < exp.train.num_steps:
        calls.append(_loop_length(exp, step))
        step += calls[-1]
    assert calls == [10] + [1] * 10  # 10 -> 15 (eval) -> 20 (summary, last): singles, then none left
    every = exp.replace(train=exp.train.replace(summary_interval_steps=1))
    assert {_loop_length(every, s) for s in range(20)} == {1}  # a summary every step: nothing to fuse


@pytest.mark.parametrize("flags", [
    ["--train.eval-interval-steps", "15"], ["--train.summary-interval-steps", "1"], ["--checkpoint.every-n-steps", "5"],
])  # fmt: skip
def test_the_default_experiments_loop_refuses_no_interval(flags):
    """shakespeare_char runs 10 steps a call; these were refused before ('does not divide')."""
    exp, _, _ = cli.parse(["--exp", "shakespeare_char", *flags], "test", "test", job_dir_required=False)
    assert exp.train.steps_per_loop == 10
    exp.validate(num_devices=1, data_files=False)


def test_a_loop_with_intervals_it_does_not_divide_trains_the_same(tmp_path):
    """K = 3 with evals, summaries and checkpoints every 5: loops 0-3 and 5-8, singles 3-5."""
    every5 = [
        "--train.eval-interval-steps",
        "5",
        "--train.summary-interval-steps",
        "5",
        "--checkpoint.every-n-steps",
        "5",
    ]
    jobs = {k: tmp_path / f"k{k}" for k in (1, 3)}
    for k, job in jobs.items():
        assert train.main(_args(job, "--train.no-sample-at-end", "--train.steps-per-loop", str(k), *every5)) == 0
    ours, theirs = _rows(jobs[3]), _rows(jobs[1])
    assert [(r["split"], r["step"]) for r in ours] == [(r["split"], r["step"]) for r in theirs]
    assert {(r["split"], r["step"]) for r in ours} >= {("train", 5), ("eval", 5), ("train", 8), ("eval", 8)}
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        assert_same_math_tree(_metrics(a), _metrics(b))
    assert _checkpoints(jobs[3]) == _checkpoints(jobs[1]) == ["5", "8"]
