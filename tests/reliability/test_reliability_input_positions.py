"""What a checkpoint records of the inputs' positions, and what a resume does with it.

The end-to-end tests (test_reliability_sigkill_resume.py) show the positions restore exactly;
these cover the cases they do not reach: a checkpoint written before eval positions were saved
(the train iterator's state alone), a rolling eval whose data.eval changed on resume (its old
position does not apply: the eval starts over, and says so), and a reset-for-eval input (no
position to keep).
"""

from __future__ import annotations

from pax_eqx.data import DataConfig, InputConfig, RandomSource
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs.input_positions import INPUT_STATES_KEY, input_states, replay_eval_window, restore_inputs

ROLLING = InputConfig(batch_size=4, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=2)
ONE_EPOCH = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True)


class FakeInput:
    def __init__(self, position: int = 0):
        self.position = position

    def get_state(self) -> dict:
        return {"next_index": self.position}

    def set_state(self, state: dict) -> None:
        self.position = state["next_index"]


class FakeRuntime:
    def __init__(self, train: int = 0, eval: int = 0):
        self.inputs = {"train": FakeInput(train), "eval": FakeInput(eval)}
        self.eval_batches_read = eval  # one batch an eval position here
        self.last_eval_window = {"state": {"next_index": eval - 2}, "first": eval - 1, "step": 10} if eval else None

    def input(self, split: str) -> FakeInput:
        return self.inputs[split]


def experiment(eval_cfg: InputConfig) -> ExperimentConfig:
    return ExperimentConfig(data=DataConfig(source=RandomSource(), eval=eval_cfg))


def test_train_and_rolling_eval_positions_round_trip():
    exp = experiment(ROLLING)
    states = input_states(FakeRuntime(train=7, eval=4), exp)
    window = {"state": {"next_index": 2}, "first": 3, "step": 10}  # where the newest eval (step 10) started
    assert states == {INPUT_STATES_KEY: 1, "train": {"next_index": 7}, "eval": {"next_index": 4},
                      "eval_data": states["eval_data"], "eval_batches_read": 4, "eval_window": window}  # fmt: skip
    resumed, logged = FakeRuntime(), []
    restore_inputs(resumed, exp, states, logged.append)
    assert (resumed.inputs["train"].position, resumed.inputs["eval"].position) == (7, 4) and logged == []
    assert (resumed.eval_batches_read, resumed.last_eval_window) == (4, window)  # the eval line's count goes on

    # `eval` on the step-10 checkpoint reads the step-10 eval's batches again; on another step it cannot
    for step, replayed, position in ((10, True, 2), (12, False, 0)):
        reader = FakeRuntime()
        assert replay_eval_window(reader, exp, states, step) is replayed
        assert reader.inputs["eval"].position == position


def test_a_checkpoint_with_the_train_state_alone_still_resumes():
    resumed, logged = FakeRuntime(), []
    restore_inputs(resumed, experiment(ROLLING), {"next_index": 9}, logged.append)
    assert (resumed.inputs["train"].position, resumed.inputs["eval"].position) == (9, 0) and logged == []


def test_a_changed_rolling_eval_starts_over_and_says_so():
    states = input_states(FakeRuntime(train=7, eval=4), experiment(ROLLING))
    resumed, logged = FakeRuntime(), []
    restore_inputs(resumed, experiment(ROLLING.replace(eval_loop_num_batches=3)), states, logged.append)
    assert (resumed.inputs["train"].position, resumed.inputs["eval"].position) == (7, 0)
    assert logged == ["data.eval changed since the checkpoint: the rolling eval input starts from its first batch."]


def test_an_eval_reset_every_run_keeps_no_position():
    states = input_states(FakeRuntime(train=7, eval=4), experiment(ONE_EPOCH))
    assert set(states) == {INPUT_STATES_KEY, "train"}
