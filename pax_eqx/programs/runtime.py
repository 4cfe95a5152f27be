"""Runtime: what train, eval and decode all build from an experiment before running.

The mesh, the Task and its compiled Programs, the tokenizer (trained into / loaded from the
job dir) and this host's inputs. It takes an experiment the entry point has validated
(`ExperimentConfig.validate`, once, before anything is written) and checks only what needs the
built pieces: the tokenizer's vocabulary against the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pax_eqx.data import build_input, build_tokenizer
from pax_eqx.data.build import check_token_ids
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.base import DEFAULT_SUMMARY_VERBOSITY, LAYER_STATISTICS_VERBOSITY
from pax_eqx.programs.compiled import Programs
from pax_eqx.quantization.quantization_choice import IntQuantizationConfig
from pax_eqx.sharding.mesh import build_mesh
from pax_eqx.tasks.lora_task import LoraTask
from pax_eqx.tasks.quantized_task import FakeQuantTask, MaterializedTask
from pax_eqx.tasks.task import Task


def build_task(exp: ExperimentConfig) -> Task:
    """The experiment's Task: its model, learner (an unset schedule decay_end resolved to
    train.num_steps), task configs, activation dtype and summary verbosity. The one place an
    experiment becomes a Task."""
    verbosity = LAYER_STATISTICS_VERBOSITY if exp.train.layer_summaries else DEFAULT_SUMMARY_VERBOSITY
    per_example = bool(exp.data.eval.metrics)
    if exp.lora.enabled:
        return LoraTask(
            exp.model, exp.resolved_learner(), exp.lora, exp.task, exp.train.fprop_dtype, verbosity, per_example
        )
    if exp.quantization.enabled:
        kind = MaterializedTask if isinstance(exp.quantization, IntQuantizationConfig) else FakeQuantTask
        return kind(
            exp.model, exp.resolved_learner(), exp.quantization, exp.task, exp.train.fprop_dtype, verbosity,
            per_example,
        )  # fmt: skip
    return Task(exp.model, exp.resolved_learner(), exp.task, exp.train.fprop_dtype, verbosity, per_example)


@dataclass
class Runtime:
    exp: ExperimentConfig
    job_dir: Path
    programs: Programs
    tokenizer: Any
    _inputs: dict[str, Any] = field(default_factory=dict)
    eval_batches_read: int = 0  # by the rolling eval input so far, this run and the ones it resumes
    # Where the newest rolling eval started ({"state", "first", "step"}): saved in checkpoints so
    # that `eval` on checkpoint N reads the batches the training eval at step N read.
    last_eval_window: dict[str, Any] | None = None

    @classmethod
    def create(cls, exp: ExperimentConfig, job_dir: Path, log: Callable = print) -> Runtime:
        mesh = build_mesh(exp.mesh)
        tokenizer = build_tokenizer(exp.data, job_dir)
        vocab = exp.model.token_vocab_size()
        if vocab is not None:  # the tokenizer's ids, its specials and any sentinels: each must have a row
            check_token_ids(exp.data, tokenizer, vocab)
        return cls(exp, job_dir, Programs(build_task(exp), mesh, exp.mesh.rules), tokenizer)

    def input(self, split: str) -> Any:
        """This host's input for `split`, built once and kept (eval inputs roll across runs)."""
        if split not in self._inputs:
            self._inputs[split] = build_input(self.exp.data, split, self.tokenizer)
        return self._inputs[split]
