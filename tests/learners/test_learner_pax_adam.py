"""Praxis' Adam and Paxml's learner, written out in NumPy from their source, against `pax_adam`.

The reference follows praxis/optimizers.py `sharded_adam` and paxml/learners.py
`scale_gradients` line by line (not optax): bias-corrected decays instead of Adam's bias
correction, `m / (sqrt(v + epsilon_root) + epsilon)`, the per-tensor RMS cap
`u / max(1, rms(u) / clip_threshold)`, `u + weight_decay * param` on every parameter, then
`-lr(count) * u`, after clipping the gradient to a global norm. The schedules follow
praxis/schedules.py (Linear / Exponential / DelayedCosine joined at the boundaries).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import registry
from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError
from pax_eqx.learners import (
    LearnerConfig,
    build_optimizer,
    build_schedule,
    linear_rampup_cosine_decay,
    linear_rampup_exponential_decay,
    pax_adam,
)
from pax_eqx.learners.optimizer_configs import AdamWConfig, SgdConfig

KEY = jax.random.PRNGKey(3)
PARAMS = {
    "w": np.asarray(jax.random.normal(KEY, (4, 6)), np.float64),
    "b": np.linspace(-1.0, 1.0, 6),  # a bias: Praxis decays it too
    "scale": np.full((6,), 1.5),
}


def grad(params, step):
    """A gradient that changes with the step, large enough on `w` for the RMS cap to bite early."""
    g = {k: np.sin(np.arange(v.size).reshape(v.shape) + step) * (40.0 if k == "w" else 0.3) for k, v in params.items()}
    return {k: g[k] + 0.5 * (params[k] - 0.2) for k in params}


def pax_linear_rampup_exponential_decay(step, warmup, start, end, min_ratio, peak):
    if step < warmup:
        return peak * step / warmup
    if step < start:
        return peak
    x = min(step - start, end - start)
    return math.exp(math.log(peak) + x / (end - start) * (math.log(peak * min_ratio) - math.log(peak)))


def pax_linear_rampup_cosine_decay(step, warmup, start, end, min_ratio, peak):
    if step < warmup:
        return peak * step / warmup
    if step < start:
        return peak
    angle = math.pi * min(step - start, end - start) / (end - start)
    low = peak * min_ratio
    return low + 0.5 * (peak - low) * (1 + math.cos(angle))


def pax_reference(params, steps, lr, schedule, beta1, beta2, eps, eps_root, clip_threshold, wd, clip_norm):
    """praxis sharded_adam behind paxml's Learner.scale_gradients, in float64 NumPy."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    params = dict(params)

    def corrected(step, decay):  # _ShardedAdamHelper.bias_corrected_decay, step 0-based
        t = step + 1.0
        return decay * (1.0 - decay ** (t - 1.0)) / (1.0 - decay**t)

    for count in range(steps):
        g = grad(params, count)
        norm = math.sqrt(sum(float(np.sum(x**2)) for x in g.values()))
        scale = min(1.0, clip_norm / norm) if clip_norm else 1.0
        b1, b2 = corrected(count, beta1), corrected(count, beta2)
        for k in params:
            gk = g[k] * scale
            m[k] = (1.0 - b1) * gk + b1 * m[k]
            v[k] = (1.0 - b2) * gk**2 + b2 * v[k]
            u = m[k] / (np.sqrt(v[k] + eps_root) + eps)
            if clip_threshold > 0:
                u = u / max(1.0, math.sqrt(float(np.mean(u**2))) / clip_threshold)
            if wd > 0:
                u = u + wd * params[k]
            params[k] = params[k] - lr * schedule(count) * u
    return params


def run(cfg, steps):
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), PARAMS)
    tx = build_optimizer(cfg, params)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for step in range(steps):
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grad(jax.tree.map(np.asarray, params), step))
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params


def assert_close(ours, want, rtol=2e-5, atol=1e-6):
    for k in want:
        np.testing.assert_allclose(np.asarray(ours[k], np.float64), want[k], rtol=rtol, atol=atol, err_msg=k)


def test_c4_recipe_matches_praxis_adam_with_exponential_schedule():
    """The c4 / lm_cloud recipe (Adam 0.9/0.99, eps 1e-6, wd on everything, clip 5), with an RMS cap
    of 0.5 rather than 1.0: Adam's first updates are +-1 per entry, so a cap of 1 would not bite."""
    sched = dict(warmup=3, start=4, end=9, min_ratio=0.1, peak=1.0)
    cfg = pax_adam(
        learning_rate=0.05,
        schedule=linear_rampup_exponential_decay(warmup_steps=3, decay_start=4, decay_end=9, min_ratio=0.1, max=1.0),
        beta1=0.9,
        beta2=0.99,
        epsilon=1e-6,
        clip_threshold=0.5,
        weight_decay=1e-1,
        clip_gradient_norm_to_value=5.0,
    )
    want = pax_reference(
        PARAMS, 12, 0.05, lambda s: pax_linear_rampup_exponential_decay(s, **sched),
        0.9, 0.99, 1e-6, 0.0, 0.5, 1e-1, 5.0,
    )  # fmt: skip
    assert_close(run(cfg, 12), want)


def test_gpt3_orghp_recipe_matches_praxis_adam_with_cosine_schedule():
    """OrgHP: b2 0.95, eps 1e-8, no RMS cap (-1.0), wd 0.1, clip 1.0, LinearRampupCosineDecay."""
    sched = dict(warmup=2, start=3, end=10, min_ratio=0.1, peak=1.0)
    cfg = pax_adam(
        learning_rate=0.02,
        schedule=linear_rampup_cosine_decay(warmup_steps=2, decay_start=3, decay_end=10, min_ratio=0.1, max=1.0),
        beta1=0.9,
        beta2=0.95,
        epsilon=1e-8,
        epsilon_root=1e-4,
        clip_threshold=-1.0,
        weight_decay=0.1,
        clip_gradient_norm_to_value=1.0,
    )
    assert cfg.clip_update_rms == 0.0
    want = pax_reference(
        PARAMS, 13, 0.02, lambda s: pax_linear_rampup_cosine_decay(s, **sched),
        0.9, 0.95, 1e-8, 1e-4, -1.0, 0.1, 1.0,
    )  # fmt: skip
    assert_close(run(cfg, 13), want)


def test_each_pax_option_changes_the_result():
    """The reference distinguishes every option, so the tests above check each one."""
    base = dict(beta1=0.9, beta2=0.99, eps=1e-6, eps_root=0.0, clip_threshold=0.5, wd=0.1, clip_norm=5.0)
    const = lambda s: 1.0  # noqa: E731
    ref = pax_reference(PARAMS, 5, 0.05, const, **base)
    for change in (dict(eps_root=1e-2), dict(clip_threshold=-1.0), dict(wd=0.0)):
        other = pax_reference(PARAMS, 5, 0.05, const, **{**base, **change})
        assert max(float(np.max(np.abs(ref[k] - other[k]))) for k in ref) > 1e-4, change


def test_update_rms_cap_is_optax_clip_by_block_rms_per_tensor():
    cfg = LearnerConfig(optimizer=SgdConfig(momentum=0.0), learning_rate=1.0, clip_update_rms=0.5)
    params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros((3,))}
    g = {"w": jnp.full((2, 3), 2.0), "b": jnp.full((3,), 0.1)}  # rms 2.0 (capped), 0.1 (kept)
    tx = build_optimizer(cfg, params)
    updates, _ = tx.update(g, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -jnp.full((2, 3), 0.5), rtol=1e-6)
    np.testing.assert_allclose(updates["b"], -g["b"], rtol=1e-6)


def test_weight_decay_mask_all_decays_vectors_and_matrices_default_skips_vectors():
    params = {"w": jnp.ones((2, 3)), "b": jnp.ones((3,))}
    zero = jax.tree.map(jnp.zeros_like, params)
    for mask, b_after in (("all", 1 - 0.1 * 0.5), ("matrices", 1.0)):
        cfg = LearnerConfig(optimizer=AdamWConfig(), learning_rate=0.1, weight_decay=0.5, weight_decay_mask=mask)
        tx = build_optimizer(cfg, params)
        updates, _ = tx.update(zero, tx.init(params), params)
        new = optax.apply_updates(params, updates)
        np.testing.assert_allclose(new["w"], 1 - 0.1 * 0.5, rtol=1e-6)
        np.testing.assert_allclose(new["b"], b_after, rtol=1e-6)


def test_defaults_leave_the_chain_as_before():
    cfg = LearnerConfig()
    assert (cfg.optimizer.eps_root, cfg.clip_update_rms, cfg.weight_decay_mask) == (0.0, 0.0, "matrices")


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(optimizer=dict(eps_root=-1.0)), "learner.optimizer.eps_root"),
        (dict(clip_update_rms=-0.5), "learner.clip_update_rms"),
        (dict(weight_decay_mask="biases"), "learner.weight_decay_mask='biases'"),
    ],
)
def test_bad_new_fields_name_the_field(fields, match):
    with pytest.raises(ConfigError, match=match):
        if isinstance(fields.get("optimizer"), dict):
            AdamWConfig(**fields["optimizer"])
        else:
            LearnerConfig(**fields)


def test_pax_adam_round_trips_and_parses():
    cfg = pax_adam(learning_rate=6e-5, beta2=0.95, epsilon=1e-8, clip_threshold=-1.0, weight_decay=0.1)
    assert LearnerConfig.from_json(cfg.to_json()) == cfg
    exp = registry.load_experiment("shakespeare_char").replace(learner=cfg)
    args = [
        "--learner.optimizer.eps-root",
        "1e-3",
        "--learner.clip-update-rms",
        "2.0",
        "--learner.weight-decay-mask",
        "matrices",
    ]
    parsed = cli.parse_fields(exp, args, "test").learner
    assert (parsed.optimizer.eps_root, parsed.clip_update_rms, parsed.weight_decay_mask) == (1e-3, 2.0, "matrices")


def test_schedule_helpers_match_pax_formulas():
    cos = build_schedule(
        linear_rampup_cosine_decay(warmup_steps=265, decay_start=266, decay_end=108600, min_ratio=0.1, max=1.0)
    )
    exp = build_schedule(
        linear_rampup_exponential_decay(warmup_steps=4000, decay_start=4001, decay_end=300000, min_ratio=0.1, max=1.0)
    )
    for s in (0, 1, 100, 264, 265, 266, 267, 5000, 50_000, 108_599, 108_600, 200_000):
        assert float(cos(s)) == pytest.approx(
            pax_linear_rampup_cosine_decay(s, 265, 266, 108600, 0.1, 1.0), rel=1e-4, abs=1e-7
        )
    for s in (0, 1, 3999, 4000, 4001, 4002, 100_000, 299_999, 300_000, 10**7):
        assert float(exp(s)) == pytest.approx(
            pax_linear_rampup_exponential_decay(s, 4000, 4001, 300000, 0.1, 1.0), rel=1e-4
        )
