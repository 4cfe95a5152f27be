"""LoraTask: the Task of a LoRA run (`ExperimentConfig.lora`): the base frozen, the adapters trained.

Its parameters are `LoraParams(base, adapters)` (`lora_adapters.py`). The Task's own machinery
does the rest, through its two masks: the base is neither differentiated nor optimised, so it
gets no gradient, no optimizer state (its places in the optimizer state are None: nothing is
allocated, not even zeros) and no EMA, and it keeps its bits; the adapters are the whole of
what the optimizer sees. The model is built from the base with each chosen weight merged,
W + (alpha / rank) A @ B, so every program (train, eval, decode, export) computes with the
adapted model and needs nothing new.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray

from pax_eqx.config import ConfigError
from pax_eqx.layers.base import DEFAULT_SUMMARY_VERBOSITY, split_state
from pax_eqx.layers.fp8 import overwritten_mask
from pax_eqx.learners import LearnerConfig, build_optimizer
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.models.model import Model, ModelConfig
from pax_eqx.task_config import TaskConfig
from pax_eqx.tasks.lora_adapters import LoraParams, init_adapters, merge, plan_targets
from pax_eqx.tasks.task import Task, is_param


class LoraTask(Task):
    """A Task whose parameters are LoraParams; `lora` chooses the weights, rank and scale."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        learner_cfg: LearnerConfig,
        lora: LoraConfig,
        task_cfg: TaskConfig = TaskConfig(),
        fprop_dtype: str = "float32",
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
        per_example: bool = False,
    ):
        if learner_cfg.frozen:
            raise ConfigError(
                f"learner.frozen={learner_cfg.frozen!r} with lora.targets: under LoRA every base weight is frozen "
                "already and only the adapters train; drop --learner.frozen (or adapt fewer weights with lora.targets)."
            )
        super().__init__(model_cfg, learner_cfg, task_cfg, fprop_dtype, summary_verbosity, per_example)
        self.lora = lora
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        base = eqx.filter(model, is_param)
        if overwritten_mask(base) is not None:
            raise ConfigError(
                "lora.targets with an fp8 model (model...fp8=True): its scales are updated every step, which a frozen "
                "base cannot be; turn fp8 off for a LoRA run."
            )
        self.targets = plan_targets(lora, base)
        abstract = LoraParams(
            base, jax.eval_shape(lambda: init_adapters(self.targets, lora.rank, jax.random.PRNGKey(0)))
        )
        trainable = LoraParams(jax.tree.map(lambda _: False, base), jax.tree.map(lambda _: True, abstract.adapters))
        self.optimized_mask = self.differentiated_mask = trainable
        optimized, _ = self.split_optimized(abstract)
        self.optimizer = build_optimizer(learner_cfg, optimized)

    def initial_params(self, model: Model, key: PRNGKeyArray) -> LoraParams:
        """The base as the model's initialisation (the run replaces it with the base checkpoint's)
        and adapters from their own key; `Task.init_state` adds the adapters' optimizer state and
        EMA (they are the optimised part)."""
        adapters = init_adapters(self.targets, self.lora.rank, jax.random.fold_in(key, 1))
        return LoraParams(eqx.filter(model, eqx.is_array), adapters)

    def model(self, params: Any) -> Model:
        """The model with every adapted weight merged: W + (alpha / rank) A @ B."""
        return eqx.combine(merge(params, self.targets, self.lora.scale), self.static)

    def merged_params(self, params: LoraParams) -> Any:
        """The model's own params pytree with the adapters merged in (what export_hf writes)."""
        return merge(params, self.targets, self.lora.scale)
