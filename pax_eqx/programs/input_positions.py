"""Where the inputs stand, in a checkpoint: the training input's position and a rolling eval's.

A checkpoint's data state is `{INPUT_STATES_KEY: 1, "train": ..., "eval": ..., "eval_data": ...}`:
the training iterator's state, and, for a rolling eval (reset_for_eval=False, each eval run
reads the next batches), the eval iterator's state with the eval pipeline it belongs to, so a
resumed run's evals read what an uninterrupted run's would, and where the newest eval started
(`eval_window`), so `eval` on a checkpoint of an eval's step reads that eval's batches again: one
validation number per checkpoint. Early stopping's state rides along.
"""

from __future__ import annotations

import json
from typing import Any

from pax_eqx.experiment import ExperimentConfig

# Marks the data state a checkpoint holds as {"train": ..., "eval": ..., "eval_data": ...}; a
# checkpoint without it (written before rolling eval positions were saved) holds the train
# iterator's state alone.
INPUT_STATES_KEY = "pax_eqx_input_states"


def eval_data(exp: ExperimentConfig) -> dict[str, Any]:
    """What the eval input is built from: its saved position only applies to the same pipeline.
    (As it reads back from the checkpoint's JSON, so a saved and a fresh one compare equal.)"""
    return json.loads(json.dumps({k: v for k, v in exp.data.to_dict().items() if k != "train"}))


def input_states(rt: Any, exp: ExperimentConfig, riders: dict[str, Any] | None = None) -> dict[str, Any]:
    """This host's input positions for the checkpoint: the training input's, and the rolling eval
        input's (reset_for_eval=False: each eval run reads the next batches, so where it stands
        decides what the next eval sees). `rt`: the Runtime (anything whose .input(split) has
        get_state/set_state). `riders`: more host state that rides along under its own keys (early
    stopping's, train/early_stopping.py)."""
    states: dict[str, Any] = {INPUT_STATES_KEY: 1, "train": rt.input("train").get_state()}
    states.update(riders or {})
    if not exp.data.eval.reset_for_eval:
        states["eval"] = rt.input("eval").get_state()
        states["eval_data"] = eval_data(exp)
        states["eval_batches_read"] = rt.eval_batches_read
        if rt.last_eval_window is not None:
            states["eval_window"] = rt.last_eval_window
    return states


def restore_inputs(rt: Any, exp: ExperimentConfig, data_state: dict[str, Any] | None, log) -> None:
    if data_state is None:
        log("The checkpoint holds no data iterator state: the training input starts from its first batch.")
        return
    if INPUT_STATES_KEY not in data_state:  # an older checkpoint: the train iterator's state alone
        rt.input("train").set_state(data_state)
        return
    rt.input("train").set_state(data_state["train"])
    if "eval" in data_state and not exp.data.eval.reset_for_eval:
        if data_state.get("eval_data") == eval_data(exp):
            rt.input("eval").set_state(data_state["eval"])
            rt.eval_batches_read = data_state.get("eval_batches_read", 0)
            rt.last_eval_window = data_state.get("eval_window")
        else:
            log("data.eval changed since the checkpoint: the rolling eval input starts from its first batch.")


def replay_eval_window(rt: Any, exp: ExperimentConfig, data_state: dict[str, Any] | None, step: int) -> bool:
    """For `eval` on checkpoint `step` of a rolling eval: puts the eval input where the training
    eval at `step` started, so both read the same batches and print the same number. False (the
    eval then reads from the stream's first batch, and its line says so) when no eval ran at that
    step, the eval data changed, or the checkpoint predates saved windows."""
    if exp.data.eval.reset_for_eval or not data_state or INPUT_STATES_KEY not in data_state:
        return False
    window = data_state.get("eval_window")
    if not window or window.get("step") != step or data_state.get("eval_data") != eval_data(exp):
        return False
    rt.input("eval").set_state(window["state"])
    rt.eval_batches_read = window["first"] - 1
    return True
