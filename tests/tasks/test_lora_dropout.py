"""LoRA dropout (`lora.dropout`) in the Task: eval, decode and dropout-0 training compute with the
merged weights bit for bit; training with dropout puts a LowRankAdapted (tests/layers/test_low_rank.py
checks its math) in each multiplied weight's place, with its own mask per layer of the scanned stack
and per step (tests/hf/test_lora_end_to_end.py trains with it through the command line, resumes
and exports); the config's refusals name the field and the fix."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_tiny import batch, tiny

from experiments import registry
from pax_eqx.command_line.inert_flags import InertFlagError, refuse_inert_flags
from pax_eqx.config import ConfigError
from pax_eqx.layers import Mode
from pax_eqx.layers.base import split_state
from pax_eqx.layers.linears import dense
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.programs.runtime import build_task
from pax_eqx.tasks.lora_adapters import LoraParams

TARGETS = (r"stack\.layers\.attention\.w_[qo]", r"stack\.layers\.ff_in\.linear\.w", r"embedding\.w")
LORA = LoraConfig(targets=TARGETS, rank=4, alpha=8.0, base_job_dir="runs/base", dropout=0.25)


@functools.cache
def task_and_params(dropout: float = LORA.dropout):
    """The Task and parameters whose adapters are random (B too, so each adapter changes the output)."""
    task = build_task(tiny(LORA.replace(dropout=dropout)))
    model, nt_state = split_state(task.model_cfg.build(jax.random.PRNGKey(0)))
    params = task.initial_params(model, jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    adapters = {
        n: eqx.tree_at(lambda a: (a.a, a.b), a, (jnp.asarray(rng.normal(size=a.a.shape) * 0.3, jnp.float32),
                                                 jnp.asarray(rng.normal(size=a.b.shape) * 0.3, jnp.float32)))
        for n, a in params.adapters.items()
    }  # fmt: skip
    return task, LoraParams(params.base, adapters), nt_state


def loss(task, params, nt_state, key, mode: Mode):
    """The forward's total loss on `batch()`, jitted (the eager forward takes seconds)."""
    forward = jax.jit(lambda p, k: task.forward(p, nt_state, batch(), k, mode).metrics["total_loss"].value)
    return forward(params, key)


def weights(model) -> list:
    return jax.tree.leaves(eqx.filter(model, eqx.is_array))


def assert_same(a, b):
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))


def test_eval_decode_and_training_without_dropout_compute_with_the_merged_weights_exactly():
    task, params, nt_state = task_and_params()
    plain, _, _ = task_and_params(0.0)
    merged = eqx.combine(task.merged_params(params), task.static)
    key = jax.random.PRNGKey(9)
    for mode in (Mode.EVAL, Mode.DECODE):
        assert_same(weights(task.model(params, key, mode)), weights(merged))
    assert_same(weights(plain.model(params, key, Mode.TRAIN)), weights(merged))
    assert_same(loss(task, params, nt_state, None, Mode.EVAL), loss(plain, params, nt_state, None, Mode.EVAL))


def test_training_adapts_multiplied_weights_keeps_embeddings_merged_and_draws_per_layer_and_step():
    task, params, nt_state = task_and_params()
    merged = task.merged_params(params)
    model = task.model(params, jax.random.PRNGKey(9), Mode.TRAIN)
    attention = model.stack.layers.attention
    assert isinstance(attention.w_q, LowRankAdapted) and isinstance(attention.w_o, LowRankAdapted)
    assert isinstance(model.stack.layers.ff_in.linear.w, LowRankAdapted)
    assert not isinstance(attention.w_v, LowRankAdapted)  # not a target: the base weight
    np.testing.assert_array_equal(np.asarray(model.embedding.w), np.asarray(merged.embedding.w))  # looked up: merged
    # one key per layer of the scanned stack ([layers, 2]), as the scan slices W, A and B
    w_q = attention.w_q
    assert w_q.key.shape[0] == 2

    def mask(layer: int, adapted: LowRankAdapted) -> np.ndarray:  # W = 0, A = B = I, x = 1: s m / (1 - p)
        one = jax.tree.map(lambda a: a[layer], adapted)
        d = one.w.shape[0]
        probe = LowRankAdapted(jnp.zeros((d, d)), jnp.eye(d), jnp.eye(d), one.key, 1.0, one.rate, 1, one.name)
        return np.asarray(dense(jnp.ones((64, d)), probe)) != 0

    m0, m1 = mask(0, w_q), mask(1, w_q)
    assert not np.array_equal(m0, m1)
    assert abs(m0.mean() - 0.75) < 0.1 and abs(m1.mean() - 0.75) < 0.1  # p = 0.25 dropped
    # another step's key, another mask; and the training loss changes with it
    other = task.model(params, jax.random.PRNGKey(10), Mode.TRAIN).stack.layers.attention.w_q
    assert not np.array_equal(mask(0, other), m0)
    losses = [float(loss(task, params, nt_state, jax.random.PRNGKey(k), Mode.TRAIN)) for k in (9, 10)]
    evaluated = float(loss(task, params, nt_state, None, Mode.EVAL))
    assert len({*losses, evaluated}) == 3, (losses, evaluated)


def test_bad_dropout_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(
        ConfigError, match=r"lora\.dropout must be in \[0\.0, 1\.0\).*got -0\.1\. Pass e\.g\. --lora\.dropout 0\.05"
    ):
        LORA.replace(dropout=-0.1)
    with pytest.raises(ConfigError, match=r"lora\.dropout must be in \[0\.0, 1\.0\).*got 1\.0"):
        LORA.replace(dropout=1.0)
    with pytest.raises(InertFlagError, match=r"lora\.dropout.*LoRA is off"):
        refuse_inert_flags(registry.load_experiment("shakespeare_char"), ["--lora.dropout", "0.1"])
    # a trainable position table is looked up by position, not multiplied through dense: refused
    exp = tiny(LORA.replace(targets=(r"position\..*",)), **{"model.position_embedding": "trainable"})
    with pytest.raises(ConfigError, match=r"lora\.dropout=0\.25 .*position\.emb_var.*--lora\.dropout 0"):
        build_task(exp)
    build_task(exp.replace(lora=exp.lora.replace(dropout=0.0)))  # merged, it adapts any matrix
