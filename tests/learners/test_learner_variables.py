"""Frozen variables and per-variable learners (Pax's bprop_variable_exclusion and MultiOptimizer),
chosen by regexes on parameter names: frozen ones keep their bits and have no optimizer state;
each group trains at the rate (and with the optimizer) it asks, checked against the formulas."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.learners import LearnerConfig, build_optimizer
from pax_eqx.learners.optimizer_configs import AdamConfig, SgdConfig
from pax_eqx.learners.optimizers import VariableGroupConfig
from pax_eqx.learners.variables import param_names
from pax_eqx.models import LanguageModelConfig
from pax_eqx.tasks.task import Task

LM = LanguageModelConfig(vocab_size=11, max_seq_len=6, num_layers=2, model_dims=8, hidden_dims=16, num_heads=2)
FROZEN = (r"stack\.layers\.attention\..*", r"embedding\..*")


def _batch(seed: int) -> dict:
    ids = np.random.default_rng(seed).integers(0, 11, (4, 6)).astype(np.int32)
    return {"ids": ids, "labels": np.roll(ids, -1, 1), "weights": np.ones((4, 6), np.float32)}


def _named(tree) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(x) for p, x in leaves}


@pytest.mark.parametrize("microbatches, ema", [(1, 0.0), (2, 0.9)])
def test_frozen_variables_keep_their_bits_and_have_no_optimizer_state(microbatches, ema):
    learner = LearnerConfig(learning_rate=1e-2, weight_decay=0.1, ema_decay=ema, num_microbatches=microbatches)
    task = Task(LM, learner.replace(frozen=FROZEN))
    state = task.init_state(jax.random.PRNGKey(0))
    before = _named(state.params)
    frozen = {n for n in before if any(re.fullmatch(p, n) for p in FROZEN)}
    assert frozen and len(frozen) < len(before)
    step = jax.jit(task.train_step)
    for i in range(3):
        state, _ = step(state, _batch(i))
    after = _named(state.params)
    for name in before:
        if name in frozen:
            assert after[name].tobytes() == before[name].tobytes(), name
        else:
            assert not np.array_equal(after[name], before[name]), name
    # Adam's two moments exist for the trainable parameters only (plus scalar counters).
    trainable_size = sum(before[n].size for n in before if n not in frozen)
    opt_size = sum(np.size(x) for x in jax.tree.leaves(state.opt_state))
    assert 2 * trainable_size <= opt_size < 2 * trainable_size + 10
    if ema:
        assert set(_named(state.ema)) == set(before) - frozen
        model = task.model(task.inference_params(state))  # eval sees the EMA and the frozen values
        assert _named(eqx.filter(model, eqx.is_array)).keys() == before.keys()


def test_frozen_variables_get_no_gradient_even_from_the_optimizer_alone():
    params = {"a": jnp.ones((2, 3)), "b": jnp.ones(3)}
    tx = build_optimizer(LearnerConfig(optimizer=AdamConfig(), frozen=("a",)), params)
    state = tx.init(params)
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
    assert not np.any(np.asarray(updates["a"])) and np.all(np.asarray(updates["b"]) < 0)
    shapes = [np.shape(x) for x in jax.tree.leaves(state)]
    assert (2, 3) not in shapes and shapes.count((3,)) == 2  # b's two moments, none for a


def test_two_groups_train_at_the_rates_they_ask_adam_and_sgd():
    """Group 0 (`w.*`): Adam at 0.1 x lr; group 1 (`b`): SGD (momentum 0.9) at 2 x lr; `c`: the
    learner's Adam at lr. Two steps, each against the formula."""
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    params = {"w1": jnp.ones((2, 2)), "w2": jnp.ones(3), "b": jnp.ones(2), "c": jnp.ones(2)}
    groups = (
        VariableGroupConfig(pattern="w.*", lr_multiplier=0.1),
        VariableGroupConfig(pattern="b", lr_multiplier=2.0, optimizer=SgdConfig()),
    )
    cfg = LearnerConfig(optimizer=AdamConfig(), learning_rate=lr, variable_groups=groups)
    tx = build_optimizer(cfg, params)
    state = tx.init(params)
    grads = [
        jax.tree.map(lambda p, s=s: jnp.sin(jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape) + s), params)
        for s in (1.0, 2.0)
    ]
    m = {k: 0.0 for k in params}
    v = {k: 0.0 for k in params}
    trace = 0.0
    for t, g in enumerate(grads, start=1):
        updates, state = tx.update(g, state, params)
        g = {k: np.asarray(x, np.float64) for k, x in g.items()}
        for k, mult in (("w1", 0.1), ("w2", 0.1), ("c", 1.0)):
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            adam = (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
            np.testing.assert_allclose(updates[k], -lr * mult * adam, rtol=1e-4, err_msg=k)
        trace = 0.9 * trace + g["b"]
        np.testing.assert_allclose(updates["b"], -lr * 2.0 * trace, rtol=1e-6)


def test_the_first_matching_group_wins_and_frozen_wins_over_groups():
    params = {"x": jnp.ones(2), "y": jnp.ones(2)}
    groups = (VariableGroupConfig(pattern="x", lr_multiplier=0.5), VariableGroupConfig(pattern=".*", lr_multiplier=3.0))
    cfg = LearnerConfig(optimizer=SgdConfig(momentum=0.0), learning_rate=1.0, variable_groups=groups, frozen=("y",))
    tx = build_optimizer(cfg, params)
    g = {"x": jnp.ones(2), "y": jnp.ones(2)}
    updates, _ = tx.update(g, tx.init(params), params)
    np.testing.assert_array_equal(updates["x"], [-0.5, -0.5])
    np.testing.assert_array_equal(updates["y"], [0.0, 0.0])


def test_parameter_names_are_dotted_paths():
    task = Task(LM, LearnerConfig())
    names = param_names(task.init_state(jax.random.PRNGKey(0)).params)
    assert "embedding.w" in names and any(n.startswith("stack.layers.attention.") for n in names)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: LearnerConfig(frozen=("nothing\\.here",)),
            r"learner.frozen: the pattern 'nothing\\\\.here' matches no",
        ),
        (lambda: LearnerConfig(frozen=("(",)), r"learner.frozen holds '\(', which is not a valid regex"),
        (lambda: LearnerConfig(frozen=(3,)), r"learner.frozen holds 3"),
        (lambda: VariableGroupConfig(pattern="x", lr_multiplier=0.0), r"lr_multiplier must be > 0"),
        (lambda: VariableGroupConfig(pattern="x", optimizer="adamm"), r"optimizer='adamm' is not an optimizer config"),
        (
            lambda: LearnerConfig(variable_groups=(VariableGroupConfig(pattern="nope"),)),
            r"learner.variable_groups: the pattern 'nope' matches no parameter",
        ),
    ],
)
def test_bad_values_are_one_config_error_naming_the_field(make, match):
    with pytest.raises(ConfigError, match=match):
        Task(LM, make())
