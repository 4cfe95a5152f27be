"""The generic Task against the math: exact microbatch gradients, the loss aggregator, aux
losses, variational noise, weighted metrics and summaries -- for the LM, the classifier and a
user's own model defined here."""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.config import ConfigError, config
from pax_eqx.layers import Context, MLPConfig, Mode
from pax_eqx.learners import LearnerConfig
from pax_eqx.learners.optimizer_configs import SgdConfig
from pax_eqx.metrics import HostAccumulator, Weighted, merge_stacked, weighted_mean
from pax_eqx.models import ClassificationModelConfig, LanguageModelConfig, Model, ModelConfig
from pax_eqx.task_config import TaskConfig, VariationalNoiseConfig
from pax_eqx.tasks.task import Task
from pax_eqx.tasks.variational_noise import add_variational_noise

SGD = LearnerConfig(
    optimizer=SgdConfig(momentum=0.0),
    learning_rate=1.0,
)


def _gradient(task: Task, state, batch) -> list[np.ndarray]:
    """The gradient the step applied: plain SGD with rate 1 moves params by -grad."""
    return _gradient_and_outputs(task, state, batch)[0]


def _gradient_and_outputs(task: Task, state, batch) -> tuple[list[np.ndarray], Any]:
    """The gradient the compiled step applied, and its outputs (metrics): one compile."""
    new_state, outputs = jax.jit(task.train_step)(state, batch)
    before, after = jax.tree.leaves(state.params), jax.tree.leaves(new_state.params)
    return [np.asarray(b - a) for a, b in zip(after, before)], outputs


# ----------------------------------------------------------------------------- a user's model


class TwoLossModel(Model):
    """A linear model with two losses of different weights, an aux loss and a summary: what a
    user writes to plug their own model family into the Task."""

    w: jax.Array
    input_keys: ClassVar[tuple[str, ...]] = ("x", "y", "w_a", "w_b")
    loss_name: ClassVar[str] = "loss_a"

    def compute_predictions(self, batch, ctx: Context):
        pred = batch["x"] @ self.w
        ctx = ctx.add_aux_loss("l2", 0.1 * jnp.sum(self.w**2))
        ctx = ctx.add_summary("pred_mean", jnp.mean(pred))
        return pred, ctx

    def compute_loss(self, predictions, batch):
        err = (predictions - batch["y"]) ** 2
        return {
            "loss_a": weighted_mean(jnp.sum(err * batch["w_a"]), jnp.sum(batch["w_a"])),
            "loss_b": weighted_mean(jnp.sum(jnp.abs(predictions) * batch["w_b"]), jnp.sum(batch["w_b"])),
        }


@config
class TwoLossConfig(ModelConfig):
    dims: int = 3

    def build(self, key):
        return TwoLossModel(w=jax.random.normal(key, (self.dims,)))


def _two_loss_batch():
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(8, 3)).astype(np.float32),
        "y": rng.normal(size=(8,)).astype(np.float32),
        # Microbatches of 2 hold 2, 1, 0 and 2 real rows for loss a, and other counts for loss b.
        "w_a": np.array([1, 1, 1, 0, 0, 0, 1, 1], np.float32),
        "w_b": np.array([1, 0, 1, 1, 1, 0, 0, 0], np.float32),
    }


def _two_loss_direct_gradient(w, batch, c_a, c_b, aux_weight):
    """The full-batch objective written out: c_a mean_a + c_b mean_b + aux_weight * 0.1 |w|^2."""

    def objective(w):
        pred = batch["x"] @ w
        loss_a = jnp.sum((pred - batch["y"]) ** 2 * batch["w_a"]) / jnp.sum(batch["w_a"])
        loss_b = jnp.sum(jnp.abs(pred) * batch["w_b"]) / jnp.sum(batch["w_b"])
        return c_a * loss_a + c_b * loss_b + aux_weight * 0.1 * jnp.sum(w**2)

    return np.asarray(jax.grad(objective)(w))


@pytest.mark.parametrize("num_microbatches", [1, 4])
def test_loss_aggregator_and_aux_losses_give_the_full_batch_gradient(num_microbatches):
    """Two losses with different weights per microbatch, plus an aux loss: the microbatched
    gradient (the forward pre-pass path) equals the full-batch objective's."""
    task_cfg = TaskConfig(losses=("loss_a", "loss_b"), loss_weights=(1.0, 0.5), aux_loss_weight=2.0)
    learner = SGD.replace(num_microbatches=num_microbatches)
    task = Task(TwoLossConfig(), learner, task_cfg)
    state = task.init_state(jax.random.PRNGKey(0))
    batch = _two_loss_batch()
    (got,) = _gradient(task, state, batch)
    want = _two_loss_direct_gradient(state.params.w, batch, 1.0, 0.5, 2.0)
    assert_same_math(got, want)
    _, out = task.train_step(state, batch)
    pred = batch["x"] @ np.asarray(state.params.w)
    mean_a = ((pred - batch["y"]) ** 2 * batch["w_a"]).sum() / batch["w_a"].sum()
    np.testing.assert_allclose(out.metrics["loss_a"].value, mean_a, rtol=1e-5)
    assert float(out.metrics["loss_a"].weight) == 5.0 and float(out.metrics["loss_b"].weight) == 4.0
    # Summaries come back averaged over the microbatches: the mean of the microbatch means.
    np.testing.assert_allclose(out.summaries["pred_mean"], pred.mean(), rtol=1e-5)


def test_a_loss_the_model_does_not_report_is_named():
    task = Task(TwoLossConfig(), SGD, TaskConfig(losses=("loss_c",)))
    state = task.init_state(jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match=r"task.losses names \['loss_c'\].*loss_a"):
        task.train_step(state, _two_loss_batch())


def test_a_batch_without_the_models_keys_is_named():
    task = Task(TwoLossConfig(), SGD)
    state = task.init_state(jax.random.PRNGKey(0))
    batch = {k: v for k, v in _two_loss_batch().items() if k != "y"}
    with pytest.raises(ConfigError, match=r"missing \['y'\]"):
        task.train_step(state, batch)


def test_an_aux_loss_weight_without_aux_losses_is_refused():
    task = Task(ClassificationModelConfig(input_shape=(5,), num_classes=3), SGD, TaskConfig(aux_loss_weight=2.0))
    state = task.init_state(jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match="task.aux_loss_weight=2.0 has no effect"):
        task.train_step(state, _classifier_batch([1, 1]))


def test_task_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="task.loss_weights"):
        TaskConfig(losses=("a", "b"), loss_weights=(1.0,))
    with pytest.raises(ConfigError, match="task.variational_noise.start_step"):
        VariationalNoiseConfig(start_step=5)
    with pytest.raises(ConfigError, match="task.variational_noise.scale"):
        VariationalNoiseConfig(scale=-1.0)


# ------------------------------------------------------------- microbatches, uneven padding


def _classifier_batch(weights):
    rng = np.random.default_rng(1)
    n = len(weights)
    return {
        "inputs": rng.normal(size=(n, 5)).astype(np.float32),
        "labels": rng.integers(0, 3, n).astype(np.int32),
        "weights": np.asarray(weights, np.float32),
    }


def test_microbatch_gradient_equals_full_batch_gradient_under_uneven_padding():
    """Microbatches of 2 rows holding 2, 1, 1 and 0 real examples: the accumulated gradient is
    the full-batch one (the mean over the 4 real examples), which averaging the microbatches'
    mean-loss gradients with equal weights is not."""
    cfg = ClassificationModelConfig(input_shape=(5,), num_classes=3, network=MLPConfig(hidden_dims=(4,)))
    batch = _classifier_batch([1, 1, 1, 0, 0, 1, 0, 0])
    whole = Task(cfg, SGD)
    micro = Task(cfg, SGD.replace(num_microbatches=4))
    state = whole.init_state(jax.random.PRNGKey(0))
    got = _gradient(micro, state, batch)
    model = whole.model(state.params)

    def mean_xent(model):  # the full-batch loss, written out
        logits, _ = model.compute_predictions(batch, Context(mode=Mode.EVAL))
        xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][:, None], -1)[:, 0]
        return jnp.sum(xent * batch["weights"]) / jnp.sum(batch["weights"])

    want = jax.tree.leaves(eqx.filter_grad(mean_xent)(model))
    assert_same_math_tree(got, want)
    assert_same_math_tree(_gradient(whole, state, batch), want)

    # The equal-weight average of the microbatch means is a different (wrong) gradient here.
    def microbatch_mean(model, rows):
        sub = {k: v[rows] for k, v in batch.items()}
        logits, _ = model.compute_predictions(sub, Context(mode=Mode.EVAL))
        xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), sub["labels"][:, None], -1)[:, 0]
        return jnp.sum(xent * sub["weights"]) / jnp.maximum(jnp.sum(sub["weights"]), 1.0)

    naive = [jax.tree.leaves(eqx.filter_grad(microbatch_mean)(model, slice(i, i + 2))) for i in range(0, 8, 2)]
    naive = [sum(parts) / 4 for parts in zip(*naive)]
    assert max(float(np.abs(n - w).max()) for n, w in zip(naive, want)) > 1e-3


def test_lm_microbatch_metrics_and_gradient_equal_the_whole_batch():
    """The language model through the same path: packed-style weights, uneven per microbatch."""
    cfg = LanguageModelConfig(vocab_size=11, max_seq_len=6, num_layers=1, model_dims=8, hidden_dims=16, num_heads=2)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 11, (4, 6)).astype(np.int32)
    weights = np.ones((4, 6), np.float32)
    weights[1, 2:] = 0.0
    weights[3, :] = 0.0
    batch = {"ids": ids, "labels": np.roll(ids, -1, 1), "weights": weights}
    whole = Task(cfg, SGD)
    micro = Task(cfg, SGD.replace(num_microbatches=2))
    state = whole.init_state(jax.random.PRNGKey(0))
    (grad_w, out_w), (grad_m, out_m) = (_gradient_and_outputs(t, state, batch) for t in (whole, micro))
    assert_same_math_tree(grad_m, grad_w, rtol=2e-5)
    for name in ("avg_xent", "accuracy", "total_loss"):
        assert_same_math(out_m.metrics[name].value, out_w.metrics[name].value, err_msg=name)
        assert float(out_m.metrics[name].weight) == float(weights.sum()) == 14.0


def test_mean_sync_state_is_averaged_over_microbatches():
    """BatchNorm's moving mean (mean_sync) after a 2-microbatch step is the mean of the values
    each microbatch computes from the same starting state."""
    cfg = ClassificationModelConfig(
        input_shape=(5,), num_classes=3, network=MLPConfig(hidden_dims=(4,), batch_norm=True)
    )
    batch = _classifier_batch([1] * 8)
    micro = Task(cfg, SGD.replace(num_microbatches=2))
    state = micro.init_state(jax.random.PRNGKey(0))
    new_state, _ = micro.train_step(state, batch)
    model = micro.model(state.params)
    expected = []
    for rows in (slice(0, 4), slice(4, 8)):
        sub = {k: v[rows] for k, v in batch.items()}
        _, ctx = model.compute_predictions(sub, Context(state=state.nt_state, mode=Mode.TRAIN, key=jax.random.key(0)))
        expected.append(jax.tree.leaves(ctx.state))
    got = jax.tree.leaves(new_state.nt_state)
    for g, a, b in zip(got, *expected):
        assert_same_math(g, (np.asarray(a) + np.asarray(b)) / 2)


# --------------------------------------------------------------------- variational noise


def test_variational_noise_has_the_scale_starts_at_its_step_and_is_fresh_every_step():
    params = {"w": jnp.zeros((200, 200)), "steps": jnp.zeros((3,), jnp.int32)}
    cfg = VariationalNoiseConfig(scale=0.3, start_step=2)
    before = add_variational_noise(params, jax.random.PRNGKey(0), jnp.int32(1), cfg)
    np.testing.assert_array_equal(before["w"], 0.0)
    at = add_variational_noise(params, jax.random.PRNGKey(0), jnp.int32(2), cfg)
    assert abs(float(jnp.std(at["w"])) - 0.3) < 0.01 and abs(float(jnp.mean(at["w"]))) < 0.01
    np.testing.assert_array_equal(at["steps"], 0)  # integer arrays are not weights
    other = add_variational_noise(params, jax.random.PRNGKey(1), jnp.int32(2), cfg)
    assert float(jnp.abs(other["w"] - at["w"]).max()) > 0.1


def test_variational_noise_perturbs_training_not_eval():
    """The gradient is taken at the noisy weights from the start step on; eval sees the clean ones."""
    noisy = Task(TwoLossConfig(), SGD, TaskConfig(variational_noise=VariationalNoiseConfig(scale=0.5, start_step=1)))
    clean = Task(TwoLossConfig(), SGD)
    state = clean.init_state(jax.random.PRNGKey(0))
    batch = _two_loss_batch()
    # Step 0 is before start_step: the same update.
    assert_same_math(_gradient(noisy, state, batch)[0], _gradient(clean, state, batch)[0])
    state1 = eqx.tree_at(lambda s: s.step, state, jnp.int32(1))
    assert float(np.abs(_gradient(noisy, state1, batch)[0] - _gradient(clean, state1, batch)[0]).max()) > 1e-3
    assert_same_math(
        noisy.eval_step(state1, batch).metrics["loss_a"].value, clean.eval_step(state1, batch).metrics["loss_a"].value
    )


# ------------------------------------------------------------------------- weighted metrics


def test_weighted_merges_are_sums_of_value_times_weight_over_total_weight():
    stacked = {"m": Weighted(jnp.array([1.0, 4.0, 7.0]), jnp.array([1.0, 3.0, 0.0]))}
    merged = merge_stacked(stacked)
    np.testing.assert_allclose(merged["m"].value, (1.0 + 12.0) / 4.0)
    assert float(merged["m"].weight) == 4.0
    nothing = merge_stacked({"m": Weighted(jnp.array([2.0, 3.0]), jnp.zeros(2))})
    assert float(nothing["m"].value) == 0.0
    acc = HostAccumulator()
    acc.add({"m": Weighted(np.float32(2.0), np.float32(3.0))})
    acc.add({"m": Weighted(np.float32(5.0), np.float32(1.0))})
    assert acc.result()["m"] == Weighted((6.0 + 5.0) / 4.0, 4.0)


def test_a_model_that_is_not_a_model_is_refused():
    @config
    class NotAModel(ModelConfig):
        def build(self, key):
            return eqx.nn.Linear(2, 2, key=key)

    with pytest.raises(ConfigError, match="not a pax_eqx.models.Model"):
        Task(NotAModel(), SGD)
