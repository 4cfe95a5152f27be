"""A Mixture-of-Experts LanguageModel: extend_step == forward (both stack kinds), the Task's train
step adds the routers' aux losses to the loss, and the MoE flags are refused where they do nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import ActivationConfig, Context, Mode, MoEFeedForwardConfig, TransformerConfig
from pax_eqx.learners import LearnerConfig
from pax_eqx.learners.optimizer_configs import SgdConfig
from pax_eqx.models import LanguageModelConfig
from pax_eqx.tasks.task import Task

V = 13


def tiny(**kw) -> LanguageModelConfig:
    base = dict(
        vocab_size=V, max_seq_len=32, num_layers=4, model_dims=16, hidden_dims=32, num_heads=4,
        moe_layer_interval=2, moe=MoEFeedForwardConfig(num_experts=4), moe_hidden_dims=16,
    )  # fmt: skip
    return LanguageModelConfig(**{**base, **kw})


@pytest.mark.parametrize("repeat, interval", [(True, 2), (False, 2), (True, 1)])
def test_moe_extend_step_matches_full_forward(repeat, interval):
    # Dropless routing: the forward routes groups of 9 tokens and decode steps groups of 1 (or 5),
    # so with a capacity the two may drop different tokens; without one both compute exactly
    # top-2 of 4 experts for every token, and must agree.
    moe = MoEFeedForwardConfig(num_experts=4, dropless=True)
    model = tiny(repeat=repeat, moe_layer_interval=interval, moe=moe).build(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, V)
    full, _ = model(ids, Context(mode=Mode.EVAL))
    cache = model.init_cache(2, 12)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    valid = jnp.ones((2, 12), bool)
    got, cache = model.extend_step(ids[:, :5], cache, jnp.int32(0), positions[:, :5], valid)
    steps = [got]
    for t in range(5, 9):
        logits, cache = model.extend_step(ids[:, t : t + 1], cache, jnp.int32(t), positions[:, t : t + 1], valid)
        steps.append(logits)
    assert_same_math(jnp.concatenate(steps, axis=1), full)


def test_task_train_step_adds_the_load_balance_loss():
    cfg = tiny(moe=MoEFeedForwardConfig(num_experts=4, load_balance_loss_weight=0.5))
    task = Task(
        cfg,
        LearnerConfig(
            optimizer=SgdConfig(momentum=0.0),
            learning_rate=0.1,
        ),
    )
    state = task.init_state(jax.random.PRNGKey(0))
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, V)
    batch = {"ids": ids, "labels": (ids + 1) % V, "weights": jnp.ones((2, 8))}
    new_state, out = jax.jit(task.train_step)(state, batch)
    m = {k: float(v.value) for k, v in out.metrics.items()}
    # Two MoE layers (0 and 2), each adding 0.5 * its GShard loss (about 1 for a near-uniform router).
    assert m["aux_loss"] > 0.5
    np.testing.assert_allclose(m["total_loss"], m["avg_xent"] + m["aux_loss"], rtol=1e-6)
    loads = [k for k in out.summaries if "expert_load_e" in k]
    assert len(loads) == 4 and all(out.summaries[k].shape == (2,) for k in loads)  # per MoE layer
    assert int(new_state.step) == 1


def test_moe_flags_are_refused_where_they_do_nothing():
    with pytest.raises(ConfigError, match=r"model\.moe\.num_experts has no effect with model\.moe_layer_interval=0"):
        tiny(moe_layer_interval=0, moe_hidden_dims=0).validate()
    with pytest.raises(ConfigError, match="model.moe_hidden_dims has no effect"):
        tiny(moe_layer_interval=0, moe=MoEFeedForwardConfig()).validate()
    with pytest.raises(ConfigError, match=r"model\.num_layers=4 is not a multiple of model\.moe_layer_interval=3"):
        tiny(moe_layer_interval=3).validate()
    gelu = TransformerConfig(activation=ActivationConfig(name="gelu"))
    with pytest.raises(ConfigError, match=r"model\.block\.activation\.name has no effect with model\.moe_layer_int"):
        tiny(moe_layer_interval=1, block=gelu).validate()
    tiny(moe_layer_interval=2, block=gelu).validate()  # the dense layers use it
