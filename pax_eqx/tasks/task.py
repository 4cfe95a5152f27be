"""Task: model + learner + loss aggregation + metrics (Pax's SingleTask), as pure functions.

`Task` is built once on the host from configs. It owns the model's static structure and the
optax transformation, and exposes pure functions of arrays only:

    state = task.init_state(key)
    state, out = task.train_step(state, batch)     # out.metrics: {name: Weighted}, out.summaries
    out = task.eval_step(state, batch)

It knows only the model contract (`pax_eqx.models.model`): predictions from the batch, weighted
metrics from predictions and batch. It never reads a batch key itself, so the same Task trains
a language model, a classifier or a user's own model. `pax_eqx.programs` jits these with
shardings and donation; nothing here knows about meshes.

The training objective is the loss aggregator's weighted sum of the model's loss metrics plus
the layers' aux losses (`TaskConfig`); variational noise perturbs the weights of the training
forward; `learner.num_microbatches` accumulates the exact full-batch gradient
(`microbatching.py`).

Mixed precision: parameters stay float32 (the master copy the optimizer updates); the model
casts its inputs to `fprop_dtype` (`Context.dtype`) and every layer casts its weights to the
activation dtype where it uses them, so gradients come back in float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, PRNGKeyArray

from pax_eqx.config import ConfigError
from pax_eqx.layers.base import DEFAULT_SUMMARY_VERBOSITY, Context, Mode, mean_sync_markers, split_state
from pax_eqx.layers.fp8 import overwritten_mask
from pax_eqx.learners import LearnerConfig, build_optimizer, ema_update, learning_rate_fn, skipped_steps
from pax_eqx.learners.variables import mask_of
from pax_eqx.metrics import Metrics, Weighted, merge_stacked, weighted
from pax_eqx.models.model import Model, ModelConfig
from pax_eqx.task_config import TaskConfig
from pax_eqx.tasks.microbatching import MeanSync, accumulate_gradients, objective
from pax_eqx.tasks.train_state import TrainState
from pax_eqx.tasks.variational_noise import add_variational_noise

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class StepOutputs(NamedTuple):
    """What a train or eval step reports: weighted metrics, the layers' summaries (each a
    scalar, or one value per layer of a scanned stack) and, from an eval step of a Task built
    with `per_example=True`, the model's per-example outputs."""

    metrics: Metrics
    summaries: dict[str, Array]
    per_example: dict[str, Array] = {}


class _Forward(NamedTuple):
    metrics: Metrics
    nt_state: Any
    summaries: dict[str, Array]
    terms: tuple[Weighted, ...]  # the loss aggregator's terms, each times its coefficient
    aux: Array | None  # the weighted sum of the layers' aux losses; None when no layer adds one
    per_example: dict[str, Array]


def is_param(x: Any) -> bool:
    """Arrays, or their abstract shapes (the Task is built from `eval_shape`)."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


class Task:
    """Args:
    model_cfg: any ModelConfig (its `build(key)` gives a model with the contract).
    learner_cfg: the optimizer, schedule, clipping, EMA and microbatching.
    task_cfg: the loss aggregator, aux-loss weight and variational noise.
    fprop_dtype: "float32" or "bfloat16", the activation dtype.
    summary_verbosity: Pax's; 4 records the layers' statistics (train.layer_summaries).
    per_example: eval steps also return the model's per-example outputs (data.eval.metrics).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        learner_cfg: LearnerConfig,
        task_cfg: TaskConfig = TaskConfig(),
        fprop_dtype: str = "float32",
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
        per_example: bool = False,
    ):
        self.model_cfg = model_cfg
        self.learner_cfg = learner_cfg
        self.task_cfg = task_cfg
        self.dtype = _DTYPES[fprop_dtype]
        self.summary_verbosity = summary_verbosity
        self.per_example = per_example
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        if not isinstance(model, Model):
            raise ConfigError(
                f"model: {type(model_cfg).__name__}.build returned a {type(model).__name__}, not a "
                "pax_eqx.models.Model; subclass Model and implement compute_predictions / compute_loss."
            )
        self.static = eqx.filter(model, is_param, inverse=True)
        self.input_keys = type(model).input_keys
        self.loss_terms = task_cfg.loss_terms(type(model).loss_name)
        self.mean_sync = mean_sync_markers(model)
        self.lr_fn = learning_rate_fn(learner_cfg)
        abstract_params = eqx.filter(model, is_param)
        # Three kinds of parameter: optimised ones; frozen ones (learner.frozen), neither
        # differentiated nor updated; and fp8 scales (layers.fp8), differentiated but overwritten
        # with their gradient instead of optimised. Each mask is None when the kind is absent.
        frozen = mask_of(abstract_params, learner_cfg.frozen) if learner_cfg.frozen else None
        overwritten = overwritten_mask(abstract_params)
        self.differentiated_mask = None if frozen is None else jax.tree.map(lambda f: not f, frozen)
        self.optimized_mask = None
        if frozen is not None or overwritten is not None:
            none = jax.tree.map(lambda _: False, abstract_params)
            self.optimized_mask = jax.tree.map(
                lambda f, o: not (f or o),
                none if frozen is None else frozen,
                none if overwritten is None else overwritten,
            )
        self.optimizer = build_optimizer(learner_cfg, abstract_params)

    # Building ---------------------------------------------------------------------------------
    def init_state(self, key: PRNGKeyArray) -> TrainState:
        """A fresh TrainState from a uint32 PRNGKey (jit this with out_shardings)."""
        init_key, state_key = jax.random.split(key)
        model, nt_state = split_state(self.model_cfg.build(init_key))
        params = self.initial_params(model, init_key)
        optimized, _ = self.split_optimized(params)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            nt_state=nt_state,
            opt_state=self.optimizer.init(optimized),
            ema=optimized if self.learner_cfg.ema_decay > 0 else None,
            key=state_key,
        )

    def initial_params(self, model: Model, key: PRNGKeyArray) -> Any:
        """The parameters a fresh state starts from: the built model's arrays (`key` built it)."""
        del key
        return eqx.filter(model, eqx.is_array)

    def model(self, params: Any, key: PRNGKeyArray | None = None, mode: Mode = Mode.EVAL) -> Model:
        """The model computing with `params`. `key` and `mode` are the forward's: a Task whose
        model depends on them (LoraTask's adapter dropout in training) reads them; this one does not."""
        del key, mode
        return eqx.combine(params, self.static)

    def split_optimized(self, params: Any) -> tuple[Any, Any]:
        """(optimized, rest) parts of a params-shaped pytree (arrays, shapes or shardings), each
        with None in the other's places (`eqx.partition`); (params, None) when every parameter is
        optimised. The rest are the frozen parameters and the fp8 scales. The optimizer state and
        the EMA cover the optimised part only."""
        return _split(params, self.optimized_mask)

    def split_differentiated(self, params: Any) -> tuple[Any, Any]:
        """(differentiated, frozen) parts: everything but learner.frozen is differentiated."""
        return _split(params, self.differentiated_mask)

    def inference_params(self, state: TrainState) -> Any:
        """The parameters eval and decode use: the EMA where one is kept (the rest as they are)."""
        if state.ema is None:
            return state.params
        _, rest = self.split_optimized(state.params)
        return state.ema if rest is None else eqx.combine(state.ema, rest)

    # Forward, metrics and the objective -------------------------------------------------------
    def forward(self, params, nt_state, batch: dict, key: PRNGKeyArray | None, mode: Mode) -> _Forward:
        """The model's predictions and weighted metrics on one (micro)batch, plus the Task's
        `total_loss` and `aux_loss`."""
        self._check_batch(batch)
        model = self.model(params, key, mode)
        ctx = Context(key=key, state=nt_state, mode=mode, dtype=self.dtype, summary_verbosity=self.summary_verbosity)
        predictions, ctx = model.compute_predictions(batch, ctx)
        metrics = dict(model.compute_loss(predictions, batch))
        terms = self._terms(metrics)
        aux = self._aux(ctx)
        total = objective(terms, aux)
        metrics["total_loss"] = weighted(total, terms[0].weight)
        metrics["aux_loss"] = weighted(jnp.zeros((), jnp.float32) if aux is None else aux)
        per_example = {}
        if self.per_example and mode is Mode.EVAL:
            per_example = model.per_example_outputs(predictions, batch)
        return _Forward(metrics, ctx.state, ctx.summaries, terms, aux, per_example)

    def _terms(self, metrics: Metrics) -> tuple[Weighted, ...]:
        missing = [name for name, _ in self.loss_terms if name not in metrics]
        if missing:
            raise ConfigError(
                f"task.losses names {missing}, but the model's compute_loss reports only {sorted(metrics)}; "
                "name one of those."
            )
        return tuple(Weighted(metrics[name].value * c, metrics[name].weight) for name, c in self.loss_terms)

    def _aux(self, ctx: Context) -> Array | None:
        if not ctx.aux_losses:
            if self.task_cfg.aux_loss_weight != 1.0:
                raise ConfigError(
                    f"task.aux_loss_weight={self.task_cfg.aux_loss_weight} has no effect: the model "
                    f"({type(self.model_cfg).__name__}) adds no aux losses; leave it at its default 1.0."
                )
            return None
        return self.task_cfg.aux_loss_weight * sum(ctx.aux_losses.values(), jnp.zeros((), jnp.float32))

    def _check_batch(self, batch: dict) -> None:
        missing = [k for k in self.input_keys if k not in batch]
        if missing:
            raise ConfigError(
                f"the batch has keys {sorted(batch)}, but the model ({type(self.model_cfg).__name__}) needs "
                f"{list(self.input_keys)}: missing {missing}. Choose a data.source whose examples carry them."
            )

    def _loss(self, params, nt_state, batch, key):
        """For microbatching: (loss terms, aux, outputs) of one training (micro)batch."""
        fwd = self.forward(params, nt_state, batch, key, Mode.TRAIN)
        return fwd.terms, fwd.aux, fwd

    # Steps ------------------------------------------------------------------------------------
    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, StepOutputs]:
        key, step_key = jax.random.split(state.key)
        # The noise's key is folded out of the step's, so the forward's randomness (dropout) is
        # the same with and without variational noise.
        noise_key = jax.random.fold_in(step_key, 1)
        optimized, rest = self.split_optimized(state.params)
        noised = add_variational_noise(optimized, noise_key, state.step, self.task_cfg.variational_noise)
        # Frozen parameters (learner.frozen) take part in the forward and keep their values bit
        # for bit; fp8 scales are differentiated, and their gradient is their next value.
        differentiated, frozen = self.split_differentiated(_combine(noised, rest))
        grads, metrics, nt_state, summaries = self._gradients(differentiated, frozen, state.nt_state, batch, step_key)
        grads, new_scales = self.split_optimized(grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, optimized)
        new_optimized = optax.apply_updates(optimized, updates)
        new_params = _combine(new_optimized, new_scales, self.split_differentiated(state.params)[1])
        ema = None if state.ema is None else ema_update(state.ema, new_optimized, self.learner_cfg.ema_decay)
        metrics["grad_norm"] = weighted(optax.global_norm(grads))
        metrics["learning_rate"] = weighted(self.lr_fn(state.step))
        metrics["skipped_steps"] = weighted(skipped_steps(opt_state))
        new_state = TrainState(state.step + 1, new_params, nt_state, opt_state, ema, key)
        return new_state, StepOutputs(metrics, summaries)

    def eval_step(self, state: TrainState, batch: dict) -> StepOutputs:
        fwd = self.forward(self.inference_params(state), state.nt_state, batch, None, Mode.EVAL)
        return StepOutputs(fwd.metrics, fwd.summaries, fwd.per_example)

    def decode_examples(self, state: TrainState, batch: dict) -> dict[str, Array]:
        """The model's `decode_examples` of `batch` with what the eval step uses: the inference
        parameters, the non-trainable state (moving statistics) and the activation dtype."""
        model = self.model(self.inference_params(state))
        ctx = Context(state=state.nt_state, mode=Mode.EVAL, dtype=self.dtype)
        return model.decode_examples(batch, ctx)

    def _gradients(self, params, frozen, nt_state, batch: dict, key):
        """Gradients w.r.t. `params` (the trainable part); `frozen` (or None) completes the model."""
        n = self.learner_cfg.num_microbatches
        whole_params = (lambda p: p) if frozen is None else (lambda p: eqx.combine(p, frozen))
        if n == 1:

            def whole(p):
                fwd = self.forward(whole_params(p), nt_state, batch, key, Mode.TRAIN)
                return fwd.metrics["total_loss"].value, fwd

            grads, fwd = jax.grad(whole, has_aux=True)(params)
            return grads, fwd.metrics, fwd.nt_state, fwd.summaries
        loss = self._loss if frozen is None else (lambda p, s, b, k: self._loss(whole_params(p), s, b, k))
        grads, outs, nt_state = accumulate_gradients(loss, params, nt_state, batch, key, n, MeanSync(self.mean_sync))
        summaries = {name: jnp.mean(v, axis=0) for name, v in outs.summaries.items()}
        return grads, merge_stacked(outs.metrics), nt_state, summaries


def _split(params: Any, mask: Any) -> tuple[Any, Any]:
    if mask is None:
        return params, None
    return eqx.partition(params, mask, is_leaf=lambda x: x is None)


def _combine(*parts: Any) -> Any:
    """The parts' union (each has None where another holds the leaf); None parts are skipped."""
    present = [p for p in parts if p is not None]
    return present[0] if len(present) == 1 else eqx.combine(*present, is_leaf=lambda x: x is None)
