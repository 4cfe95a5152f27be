"""Task: model + learner + loss aggregation + metrics (Pax's SingleTask), as pure functions.

`Task` is built once on the host from configs. It owns the model's static structure and the
optax transformation, and exposes pure functions of arrays only:

    state = task.init_state(key)
    state, metrics = task.train_step(state, batch)
    metrics = task.eval_step(state, batch)

`pax_eqx.programs` jits these with shardings and donation; nothing here knows about meshes.

Mixed precision: parameters stay float32 (the master copy the optimizer updates); the
activations are `fprop_dtype` and every layer casts its weights to the activation dtype where
it uses them. Inside the layer scan that means one layer's narrow copy is live at a time (no
second, bf16 copy of the whole model held through forward and backward) and gradients come
back in float32.

Gradient accumulation (`learner.num_microbatches`): the batch is split along its leading axis
and a `lax.scan` sums gradients; metrics are weighted by each microbatch's number of
predictions; non-trainable variables marked mean_sync are averaged over microbatches, the
others keep the last microbatch's value.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from pax_eqx.layers.base import Context, Mode, mean_sync_markers, split_state
from pax_eqx.learners import LearnerConfig, build_optimizer, ema_update, learning_rate_fn, skipped_steps
from pax_eqx.models.language_model import LanguageModel, LanguageModelConfig
from pax_eqx.tasks.train_state import TrainState

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def is_param(x: Any) -> bool:
    """Arrays, or their abstract shapes (the Task is built from `eval_shape`)."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


class Task:
    def __init__(self, model_cfg: LanguageModelConfig, learner_cfg: LearnerConfig, fprop_dtype: str = "float32"):
        self.model_cfg = model_cfg
        self.learner_cfg = learner_cfg
        self.dtype = _DTYPES[fprop_dtype]
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        self.static = eqx.filter(model, is_param, inverse=True)
        self.mean_sync = mean_sync_markers(model)
        self.lr_fn = learning_rate_fn(learner_cfg)
        self.optimizer = build_optimizer(learner_cfg, eqx.filter(model, is_param))

    # Building ---------------------------------------------------------------------------------
    def init_state(self, key: jax.Array) -> TrainState:
        """A fresh TrainState from a uint32 PRNGKey (jit this with out_shardings)."""
        init_key, state_key = jax.random.split(key)
        model, nt_state = split_state(self.model_cfg.build(init_key))
        params = eqx.filter(model, eqx.is_array)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            nt_state=nt_state,
            opt_state=self.optimizer.init(params),
            ema=params if self.learner_cfg.ema_decay > 0 else None,
            key=state_key,
        )

    def model(self, params: Any) -> LanguageModel:
        return eqx.combine(params, self.static)

    # Forward and loss -------------------------------------------------------------------------
    def loss(self, params, nt_state, batch: dict, key, mode: Mode):
        """(total_loss, (metrics, new nt_state, summaries)) on one (micro)batch."""
        model = self.model(params)
        ctx = Context(key=key, state=nt_state, mode=mode)
        paddings = 1.0 - (batch["segment_ids"] > 0) if "segment_ids" in batch else None
        x, ctx = model.hidden(
            batch["ids"], ctx, segment_ids=batch.get("segment_ids"), segment_pos=batch.get("segment_pos"),
            paddings=paddings, dtype=self.dtype,
        )  # fmt: skip
        aux = sum(ctx.aux_losses.values(), jnp.zeros((), jnp.float32))
        metrics = model.loss(x, batch["labels"], batch["weights"], aux)
        return metrics["total_loss"], (metrics, ctx.state, ctx.summaries)

    # Steps ------------------------------------------------------------------------------------
    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        key, step_key = jax.random.split(state.key)
        grads, metrics, nt_state = self._gradients(state, batch, step_key)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ema = None
        if state.ema is not None:
            ema = ema_update(state.ema, params, self.learner_cfg.ema_decay)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["learning_rate"] = jnp.asarray(self.lr_fn(state.step), jnp.float32)
        metrics["skipped_steps"] = jnp.asarray(skipped_steps(opt_state), jnp.float32)
        new_state = TrainState(state.step + 1, params, nt_state, opt_state, ema, key)
        return new_state, metrics

    def eval_step(self, state: TrainState, batch: dict) -> dict:
        params = state.params if state.ema is None else state.ema
        _, (metrics, _, _) = self.loss(params, state.nt_state, batch, None, Mode.EVAL)
        return metrics

    def _gradients(self, state: TrainState, batch: dict, key):
        grad_fn = jax.grad(self.loss, has_aux=True)
        n = self.learner_cfg.num_microbatches
        if n == 1:
            grads, (metrics, nt_state, _) = grad_fn(state.params, state.nt_state, batch, key, Mode.TRAIN)
            return grads, metrics, nt_state
        micro = jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)
        keys = jax.random.split(key, n)
        zeros = jax.tree.map(jnp.zeros_like, state.params)

        def body(carry, xs):
            grads, nt_state = carry
            mb, k = xs
            g, (metrics, new_nt, _) = grad_fn(state.params, nt_state, mb, k, Mode.TRAIN)
            return (jax.tree.map(jnp.add, grads, g), new_nt), (metrics, new_nt)

        (grads, last_nt), (metrics, all_nt) = jax.lax.scan(body, (zeros, state.nt_state), (micro, keys))
        # Each microbatch's loss is already a mean over its own predictions: average the grads.
        grads = jax.tree.map(lambda g: g / n, grads)
        weights = metrics["num_predictions"] / jnp.maximum(jnp.sum(metrics["num_predictions"]), 1.0)
        merged = {k: jnp.sum(v * weights) for k, v in metrics.items() if k != "num_predictions"}
        merged["num_predictions"] = jnp.sum(metrics["num_predictions"])
        return grads, merged, self._merge_state(last_nt, all_nt)

    def _merge_state(self, last, stacked):
        """mean_sync variables: mean over microbatches; the others: the last microbatch's value."""
        if last is None or not self.mean_sync:
            return last
        values, markers = stacked.tree_flatten()
        for marker, value in zip(markers, values):
            if marker in self.mean_sync:
                index = eqx.nn.StateIndex(value[0])
                object.__setattr__(index, "marker", marker)
                last = last.set(index, jnp.mean(value, axis=0))
        return last
