"""The default experiment's decay follows --train.num-steps; a run that ends before its schedule says so.

Issue 50: `--train.num-steps 500` on shakespeare_char used to end at 90% of the peak learning
rate, its decay still ending at 2000, and nothing said so.
"""

import json

import pytest

from pax_eqx.command_line import cli, registry
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.job_dir import JobDirError, check_config
from pax_eqx.learners import build_schedule
from pax_eqx.learners.schedules import ConstantSchedule, CosineSchedule, PiecewiseSchedule, RsqrtSchedule

# The experiments whose length is not part of their definition: CPU recipes of this repository.
# Every other experiment is a port of a published config (Paxml's, T5X's, the GPT-3 benchmark's)
# and keeps the decay end it publishes.
FOLLOW_THE_RUN = {
    "shakespeare_char", "shakespeare_moe", "shakespeare_pipelined", "bert_shakespeare_char",
    "shakespeare_span_corruption", "digits_mlp", "digits_resnet", "digits_vit", "shakespeare_char_llama",
    "lm_long_context", "lm_long_context_32k",
}  # fmt: skip


def _parse(*argv: str) -> ExperimentConfig:
    exp, _, _ = cli.parse(["--exp", "shakespeare_char", *argv], "test", "test", job_dir_required=False)
    return exp


def _multiplier(exp: ExperimentConfig, step: int) -> float:
    """The schedule's multiplier (a fraction of the peak) at `step`, as the run builds it."""
    return float(build_schedule(exp.resolved_learner().schedule)(step))


def test_which_experiments_follow_the_run():
    follows = {n for n in registry.names() if registry.load_experiment(n).learner.schedule.follows_num_steps}
    assert follows == FOLLOW_THE_RUN
    assert registry.load_experiment("gpt3_xl").resolved_learner().schedule.decay_end == 100_000
    assert registry.load_experiment("c4_spmd_adam").resolved_learner().schedule.decay_end == 300_000


@pytest.mark.parametrize("num_steps", [2000, 500, 300])
def test_the_default_experiment_decays_to_its_floor_at_the_last_step(num_steps):
    exp = _parse("--train.num-steps", str(num_steps))
    schedule = exp.resolved_learner().schedule
    assert (schedule.decay_end, schedule.warmup_steps, schedule.min_ratio) == (num_steps, 100, 0.1)
    assert _multiplier(exp, num_steps) == pytest.approx(0.1)
    assert _multiplier(exp, 100) == pytest.approx(1.0)  # the warm-up stays 100 steps
    assert exp.learner.schedule.note_for_run(num_steps) is None


def test_the_default_length_keeps_the_published_curve():
    """At its own 2000 steps shakespeare_char decays as it did with decay_end=2000, step for step."""
    exp = _parse()
    before = CosineSchedule(warmup_steps=100, decay_end=2000, min_ratio=0.1)
    for step in (0, 50, 100, 500, 1000, 1999, 2000):
        assert _multiplier(exp, step) == pytest.approx(float(build_schedule(before)(step)), abs=1e-7)


def test_a_decay_end_on_the_command_line_is_kept_and_the_run_says_where_it_stops():
    exp = _parse("--train.num-steps", "500", "--learner.schedule.decay-end", "2000")
    assert exp.resolved_learner().schedule.decay_end == 2000
    assert 0.90 < _multiplier(exp, 499) < 0.91
    note = exp.learner.schedule.note_for_run(exp.train.num_steps)
    assert note == (
        "the schedule decays until step 2000, after this run's last step 500 (learning rate at the end: 90.6% of "
        "peak); --learner.schedule.decay-end 0 ties it to the run"
    )


def test_an_old_job_dir_keeps_its_decay_end(tmp_path):
    """A config.json written when shakespeare_char decayed until 2000 resumes with 2000: the job
    dir's experiment is read as it was saved. Naming the experiment again resumes when today's
    schedule is the same one (decay_end 0 at num_steps 2000 is 2000), and is refused, the changed
    field named, where it would change a half-trained run's schedule (a 500-step run of it)."""
    old = _parse().to_dict()
    old["learner"]["schedule"]["decay_end"] = 2000
    (tmp_path / "config.json").write_text(json.dumps(old))
    resumed, _, _ = cli.parse(
        ["--job-log-dir", str(tmp_path), "--train.num-steps", "500"], "test", "test", saved_experiment=True
    )
    assert resumed.learner.schedule.decay_end == 2000
    assert resumed.resolved_learner().schedule.decay_end == 2000
    assert check_config(tmp_path, resumed.to_dict(), allow_change=False) == ["train.num_steps: 2000 -> 500"]
    assert check_config(tmp_path, _parse().to_dict(), allow_change=False) == []  # the same command again
    with pytest.raises(JobDirError, match=r"learner.schedule.decay_end: 2000 -> 500"):
        check_config(tmp_path, _parse("--train.num-steps", "500").to_dict(), allow_change=False)


def test_a_run_shorter_than_the_warmup_builds_and_says_so():
    """6 steps of a 100-step warm-up (every tiny test run) trains on the ramp, as before."""
    exp = _parse("--train.num-steps", "6")
    exp.validate(data_files=False)
    assert _multiplier(exp, 5) == pytest.approx(0.05)
    assert exp.learner.schedule.note_for_run(6) == (
        "the warm-up ends at step 100, after this run's last step 6 (learning rate at the end: 5% of peak); "
        "lower --learner.schedule.warmup-steps"
    )


@pytest.mark.parametrize(
    "schedule, num_steps, note",
    [
        (CosineSchedule(warmup_steps=10, decay_start=50), 20, "the decay starts at step 50, after this run's last "
         "step 20 (learning rate at the end: 100% of peak); lower --learner.schedule.decay-start"),
        (CosineSchedule(warmup_steps=100), 100, "the decay starts at step 100, after this run's last step 100 "
         "(learning rate at the end: 99% of peak); lower the warm-up"),
        # 0.01 + 0.99 * (1 + cos(pi * 19 / 30)) / 2 = 0.304 at the last update, step 29
        (CosineSchedule(warmup_steps=10, decay_end=40, max=2.0), 30, "the schedule decays until step 40, after "
         "this run's last step 30 (learning rate at the end: 30.4% of peak); --learner.schedule.decay-end 0 ties "
         "it to the run"),
        (ConstantSchedule(warmup_steps=10, max=3.0), 5, "the warm-up ends at step 10, after this run's last step "
         "5 (learning rate at the end: 40% of peak); lower --learner.schedule.warmup-steps"),
    ],
)  # fmt: skip
def test_a_run_that_ends_before_its_schedule_gets_a_note(schedule, num_steps, note):
    assert schedule.note_for_run(num_steps) == note


@pytest.mark.parametrize(
    "schedule, num_steps",
    [
        (CosineSchedule(warmup_steps=10), 11),  # decay_end 0: the decay ends with the run
        (CosineSchedule(warmup_steps=10, decay_end=40), 40),
        (CosineSchedule(warmup_steps=10, decay_end=40), 100),  # held at the floor after 40: chosen, not cut short
        (ConstantSchedule(warmup_steps=10), 10),
        (RsqrtSchedule(warmup_steps=10), 1000),  # no end
        (PiecewiseSchedule(warmup_steps=10, boundaries=(500,), values=(0.1,)), 100),  # pieces are steps given
    ],
)
def test_a_run_that_sees_its_schedule_through_gets_none(schedule, num_steps):
    assert schedule.note_for_run(num_steps) is None
