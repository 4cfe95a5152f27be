"""LoRA's Task against the math: step 0 is the base exactly, the base holds no optimizer state and
keeps its bits, only the adapters move, the merge is W + (alpha / r) A @ B (numpy), on a sharded
mesh (the conftest's 8 CPU devices); and the config's refusals name the field."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_tiny import batch, tiny

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.mesh import build_mesh
from pax_eqx.tasks.lora_adapters import LoraParams

TARGETS = (r"stack\.layers\.attention\.w_[qv]", r"stack\.layers\.attention\.w_o", r"stack\.layers\.ff_in\.linear\.w")
LORA = LoraConfig(targets=TARGETS, rank=4, alpha=8.0, base_job_dir="runs/base")


@pytest.fixture(scope="module")
def run():
    exp = tiny(LORA)
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    return exp, programs, programs.init_state(exp.train.seed)


def test_step_zero_is_the_base_model_exactly(run):
    exp, programs, state = run
    ids = jnp.asarray(batch()["ids"])
    plain = eqx.combine(state.params.base, programs.task.static)  # the model on the base weights, no adapter
    want = np.asarray(plain(ids, Context(mode=Mode.EVAL))[0])
    np.testing.assert_array_equal(np.asarray(programs.task.model(state.params)(ids, Context(mode=Mode.EVAL))[0]), want)


def test_the_base_has_no_optimizer_state_and_keeps_its_bits(run):
    exp, programs, state = run
    adapter_sizes = sorted(a.size for a in jax.tree.leaves(state.params.adapters))
    base_sizes = {a.shape for a in jax.tree.leaves(state.params.base)}
    moments = [a for a in jax.tree.leaves(state.opt_state) if a.ndim > 0]
    # Adam: two moments per adapter array, nothing of the base's shapes (not even zeros)
    assert sorted(a.size for a in moments) == sorted(adapter_sizes * 2)
    assert not any(a.shape in base_sizes for a in moments)
    base_before = jax.tree.map(np.asarray, state.params.base)
    adapters_before = jax.tree.map(np.asarray, state.params.adapters)
    state = jax.tree.map(lambda a: a + 0, state)  # the step donates its input
    for i in range(2):
        state, out = programs.train_step(state, programs.global_batch(batch(i)))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.params.base), base_before)
    for name, adapter in state.params.adapters.items():
        assert not np.array_equal(np.asarray(adapter.b), adapters_before[name].b), name  # B left zero
        assert not np.array_equal(np.asarray(adapter.a), adapters_before[name].a), name
    # the adapters are sharded by their weights' logical axes (fsdp on embed, tensor on heads/mlp)
    specs = {n: tuple(a.a.sharding.spec) + tuple(a.b.sharding.spec) for n, a in state.params.adapters.items()}
    assert "fsdp" in specs["stack.layers.attention.w_q"] and "tensor" in specs["stack.layers.attention.w_q"]


def _ab(adapter):
    return np.asarray(adapter.a), np.asarray(adapter.b)


def test_the_merged_weights_are_w_plus_scaled_a_times_b(run):
    exp, programs, state = run
    task = programs.task
    rng = np.random.default_rng(3)
    adapters = {
        n: a.__class__(jnp.asarray(rng.normal(size=a.a.shape), jnp.float32),
                       jnp.asarray(rng.normal(size=a.b.shape), jnp.float32), a.a_axes, a.b_axes)
        for n, a in state.params.adapters.items()
    }  # fmt: skip
    params = LoraParams(jax.tree.map(jnp.asarray, jax.device_get(state.params.base)), adapters)
    merged = task.merged_params(params)
    s = exp.lora.alpha / exp.lora.rank
    base = params.base.stack.layers
    w_o, a, b = np.asarray(base.attention.w_o), *_ab(adapters["stack.layers.attention.w_o"])
    for layer in range(2):  # w_o [heads, head_dim, embed]: input heads x head_dim, output embed
        n, h, d = w_o.shape[1:]
        want = w_o[layer].reshape(n * h, d) + s * a[layer].reshape(n * h, -1) @ b[layer]
        got = np.asarray(merged.stack.layers.attention.w_o[layer]).reshape(n * h, d)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    w_q, a, b = np.asarray(base.attention.w_q), *_ab(adapters["stack.layers.attention.w_q"])
    d, n, h = w_q.shape[1:]  # w_q [embed, heads, head_dim]: input embed
    want = w_q[1].reshape(d, n * h) + s * a[1] @ b[1].reshape(-1, n * h)
    np.testing.assert_allclose(
        np.asarray(merged.stack.layers.attention.w_q[1]).reshape(d, n * h), want, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(merged.stack.layers.ff_out.w), np.asarray(base.ff_out.w))  # not adapted


@pytest.mark.parametrize(
    "lora, match",
    [
        (LORA.replace(targets=(r"stack\.layers\.attention\.w_z",)), r"lora.targets: the pattern .*w_z.* matches no"),
        (LORA.replace(targets=(r"stack\.layers\.ff_norm\.scale",)), r"ff_norm.scale.*is not a matrix"),
        (LORA.replace(rank=100_000), r"lora\.rank=100000 is larger than the smaller side of .* Pass --lora\.rank"),
    ],
)
def test_targets_that_choose_no_matrix_are_refused(lora, match):
    with pytest.raises(ConfigError, match=match):
        build_task(tiny(lora))


def test_bad_values_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"lora\.rank must be > 0.*got 0"):
        LORA.replace(rank=0)
    with pytest.raises(ConfigError, match=r"lora\.rank must be > 0.*got -2"):
        LORA.replace(rank=-2)
    with pytest.raises(ConfigError, match=r"lora\.alpha must be > 0"):
        LORA.replace(alpha=0.0)
    with pytest.raises(ConfigError, match=r"lora\.targets=.*no lora\.base_job_dir"):
        LORA.replace(base_job_dir="")
    with pytest.raises(ConfigError, match=r"learner\.frozen.*lora\.targets"):
        build_task(tiny(LORA).override("learner.frozen", (r"embedding\..*",)))
    assert set(LoraConfig().inert_fields()) == {"rank", "alpha", "base_job_dir", "base_step", "dropout"}
    assert LORA.inert_fields() == {}
