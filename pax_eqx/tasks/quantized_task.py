"""The Tasks of a quantized model (`ExperimentConfig.quantization`): training through fake
quantization, and running the materialized integers.

FakeQuantTask (fake_quant, aqt: Praxis' QuantizationType.FQ and AQT). Its parameters are the
float ones; `model(params)` puts each chosen weight's fake-quantized value in its place
(`weight_quantization.fake_quantized`), a pure function of the params inside every forward:
the loss's gradient reaches the float weights through Praxis' straight-through estimator, the
optimizer updates them, and eval and decode see the quantized values, as Praxis' FQ layers do in
every mode. Nothing else changes: checkpoints hold float weights (a resumed run, export and the
optimizer are as usual), and `python -m pax_eqx.quantize` turns them into the integers the
forward used.

MaterializedTask (int: Praxis' INFERENCE). Its parameters hold a QuantizedWeight where each
chosen weight was, so the checkpoint it restores holds integers and scales; `model(params)`
is the usual combine, and the layers multiply by the integers (`pax_eqx.quantization.products`).
It keeps no optimizer state and no EMA (an empty optax state: the checkpoint is the weights),
and it does not train: a train step is refused naming the field.

A pipelined stack is refused by both: its stages' weights are re-laid per stage, which the
quantized weights' per-channel scales are not written to follow.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import PRNGKeyArray

from pax_eqx.config import ConfigError
from pax_eqx.layers.base import DEFAULT_SUMMARY_VERBOSITY, Mode, split_state
from pax_eqx.learners import LearnerConfig
from pax_eqx.models.model import Model, ModelConfig
from pax_eqx.quantization.quantization_choice import IntQuantizationConfig
from pax_eqx.task_config import TaskConfig
from pax_eqx.tasks.task import Task, is_param
from pax_eqx.tasks.train_state import TrainState
from pax_eqx.tasks.weight_quantization import abstract_materialized, check_sites, fake_quantized, materialized


def _refuse_pipeline(model_cfg: ModelConfig, choice: Any) -> None:
    pipeline = getattr(model_cfg, "pipeline", None)
    if pipeline is not None and pipeline.enabled:
        raise ConfigError(
            f"quantization {choice.kind} with a pipelined stack (model.pipeline.num_stages={pipeline.num_stages}): the "
            "stages' weights are re-laid per stage, which quantized weights do not follow; train unpipelined, or "
            "pass --quantization none."
        )


class FakeQuantTask(Task):
    """A Task whose forward multiplies by fake-quantized weights (module doc)."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        learner_cfg: LearnerConfig,
        quantization: Any,
        task_cfg: TaskConfig = TaskConfig(),
        fprop_dtype: str = "float32",
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
        per_example: bool = False,
    ):
        _refuse_pipeline(model_cfg, quantization)
        if quantization.activation_bits:
            raise ConfigError(
                f"quantization ({quantization.kind}).activation_bits={quantization.activation_bits}: training with "
                "fake-quantized activations is not built yet (the weights are); pass --quantization.activation-bits 0, "
                "or quantize the activations of the materialized model (python -m pax_eqx.quantize "
                "--activation-bits 8)."
            )
        super().__init__(model_cfg, learner_cfg, task_cfg, fprop_dtype, summary_verbosity, per_example)
        self.quantization = quantization
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        check_sites(eqx.filter(model, is_param), quantization)

    def model(self, params: Any, key: PRNGKeyArray | None = None, mode: Mode = Mode.EVAL) -> Model:
        """The model with each chosen weight fake-quantized, in every mode (Praxis' FQ)."""
        del key, mode
        return eqx.combine(fake_quantized(params, self.quantization), self.static)


class MaterializedTask(Task):
    """A Task whose parameters hold QuantizedWeights (module doc): eval, decode and serve only."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        learner_cfg: LearnerConfig,
        quantization: IntQuantizationConfig,
        task_cfg: TaskConfig = TaskConfig(),
        fprop_dtype: str = "float32",
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
        per_example: bool = False,
    ):
        _refuse_pipeline(model_cfg, quantization)
        super().__init__(model_cfg, learner_cfg, task_cfg, fprop_dtype, summary_verbosity, per_example)
        self.quantization = quantization
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        static = eqx.filter(model, is_param, inverse=True)
        quantized = eqx.combine(static, abstract_materialized(eqx.filter(model, is_param), quantization))
        self.static = eqx.filter(quantized, is_param, inverse=True)
        self.optimized_mask = self.differentiated_mask = None
        self.optimizer = optax.set_to_zero()  # an empty state: the checkpoint holds the weights alone

    def quantize(self, params: Any) -> Any:
        """A float model's params (the same model) as this Task's: the chosen weights materialized."""
        return materialized(params, self.quantization)

    def init_state(self, key: PRNGKeyArray) -> TrainState:
        """A state of the quantized structure (the target a quantized checkpoint restores into)."""
        init_key, state_key = jax.random.split(key)
        model, nt_state = split_state(self.model_cfg.build(init_key))
        params = self.quantize(eqx.filter(model, eqx.is_array))
        return TrainState(jnp.zeros((), jnp.int32), params, nt_state, self.optimizer.init(params), None, state_key)

    def train_step(self, state: TrainState, batch: dict) -> Any:
        raise ConfigError(
            "quantization int: this job dir holds a materialized model (integers and scales), which has no "
            "gradient; train the float job dir (with --quantization fake_quant for quantization-aware training) "
            "and quantize it again with python -m pax_eqx.quantize."
        )
