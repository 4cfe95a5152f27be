"""build_optimizer against optax's own aliases, clipping, weight decay, the non-finite guard, errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import registry
from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError
from pax_eqx.learners import LearnerConfig, build_optimizer, learning_rate_fn, pax_adam, skipped_steps
from pax_eqx.learners.optimizer_configs import AdafactorConfig, AdamConfig, AdamWConfig, LionConfig, SgdConfig
from pax_eqx.learners.schedules import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    LinearSchedule,
    RsqrtSchedule,
)

KEY = jax.random.PRNGKey(0)
PARAMS = {
    "w": jax.random.normal(KEY, (3, 4)),
    "b": jnp.linspace(-1.0, 1.0, 4),
}
NO_DECAY_ON_B = {"w": True, "b": False}


def loss(params):
    """A non-isotropic quadratic, so each optimizer takes a distinctive path."""
    return sum(jnp.sum(jnp.linspace(0.5, 4.0, p.size).reshape(p.shape) * (p - 0.3) ** 2) for p in params.values())


def run(tx, params=PARAMS, steps=6):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(steps):
        updates, state = update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


COSINE = CosineSchedule(warmup_steps=2, decay_end=6, min_ratio=0.1)


@pytest.mark.parametrize(
    "cfg, reference",
    [
        (
            LearnerConfig(
                optimizer=AdamConfig(b1=0.8, b2=0.95, eps=1e-6),
                learning_rate=0.1,
            ),
            lambda: optax.adam(0.1, b1=0.8, b2=0.95, eps=1e-6),
        ),
        (
            LearnerConfig(optimizer=AdamWConfig(), learning_rate=0.05, weight_decay=0.1, schedule=COSINE),
            lambda: optax.adamw(
                optax.warmup_cosine_decay_schedule(0.0, 0.05, 2, 6, end_value=0.005),
                weight_decay=0.1,
                mask=NO_DECAY_ON_B,
            ),
        ),
        (
            LearnerConfig(
                optimizer=SgdConfig(momentum=0.9, nesterov=True),
                learning_rate=0.05,
            ),
            lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
        ),
        (
            LearnerConfig(
                optimizer=SgdConfig(momentum=0.0),
                learning_rate=0.05,
            ),
            lambda: optax.sgd(0.05),
        ),
        (
            LearnerConfig(optimizer=LionConfig(b1=0.9, b2=0.99), learning_rate=0.01, weight_decay=0.5),
            lambda: optax.lion(0.01, b1=0.9, b2=0.99, weight_decay=0.5, mask=NO_DECAY_ON_B),
        ),
        (
            LearnerConfig(
                optimizer=AdafactorConfig(),
                learning_rate=0.1,
                schedule=LinearSchedule(warmup_steps=1, decay_end=6),
            ),
            lambda: optax.adafactor(
                optax.join_schedules([optax.linear_schedule(0.0, 0.1, 1), optax.linear_schedule(0.1, 0.001, 5)], [1])
            ),
        ),
    ],
    ids=["adam", "adamw+cosine", "sgd-nesterov", "sgd", "lion", "adafactor+linear"],
)
def test_matches_optax(cfg, reference):
    ours, _ = run(build_optimizer(cfg, PARAMS))
    theirs, _ = run(reference())
    assert_trees_close(ours, theirs)
    assert not np.allclose(ours["w"], PARAMS["w"])  # the optimizer moved


def test_adafactor_factors_large_matrices_like_optax():
    params = {"w": jax.random.normal(KEY, (128, 160)) * 0.1, "b": jnp.zeros((160,))}
    ours, state = run(
        build_optimizer(LearnerConfig(optimizer=AdafactorConfig(), learning_rate=0.01), params), params, 3
    )
    theirs, _ = run(optax.adafactor(0.01), params, 3)
    assert_trees_close(ours, theirs)
    factored = [x for x in jax.tree.leaves(state) if getattr(x, "shape", None) in ((128,), (160,))]
    assert factored, "expected row/column second-moment factors for the 128x160 matrix"


def test_clipping_scales_the_gradient_to_the_norm():
    cfg = LearnerConfig(optimizer=SgdConfig(momentum=0.0), learning_rate=1.0, clip_grad_norm=2.0)
    tx = build_optimizer(cfg, PARAMS)
    big = {"w": jnp.full((3, 4), 3.0), "b": jnp.full((4,), 3.0)}  # norm 3 * 4 = 12
    updates, _ = tx.update(big, tx.init(PARAMS), PARAMS)
    assert float(optax.global_norm(updates)) == pytest.approx(2.0, rel=1e-6)
    np.testing.assert_allclose(updates["w"], -big["w"] * 2.0 / 12.0, rtol=1e-6)
    small = jax.tree.map(lambda g: g / 100, big)  # norm 0.12: untouched
    updates, _ = tx.update(small, tx.init(PARAMS), PARAMS)
    np.testing.assert_allclose(updates["b"], -small["b"], rtol=1e-6)


def test_weight_decay_skips_vectors_by_default_and_follows_a_given_mask():
    cfg = LearnerConfig(optimizer=AdamWConfig(), learning_rate=0.1, weight_decay=0.5)
    zero = jax.tree.map(jnp.zeros_like, PARAMS)  # Adam's direction is 0: only the decay moves params

    def one_step(tx):
        updates, _ = tx.update(zero, tx.init(PARAMS), PARAMS)
        return optax.apply_updates(PARAMS, updates)

    default = one_step(build_optimizer(cfg, PARAMS))
    np.testing.assert_allclose(default["w"], PARAMS["w"] * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(default["b"], PARAMS["b"])
    inverted = one_step(build_optimizer(cfg, PARAMS, decay_mask={"w": False, "b": True}))
    np.testing.assert_array_equal(inverted["w"], PARAMS["w"])
    np.testing.assert_allclose(inverted["b"], PARAMS["b"] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_a_mask_that_does_not_fit_the_params_fails_at_build_time():
    cfg = LearnerConfig(optimizer=AdamWConfig(), weight_decay=0.1)
    with pytest.raises(ConfigError, match="decay_mask does not match"):
        build_optimizer(cfg, PARAMS, decay_mask={"w": True, "bias": False})


def test_nonfinite_gradient_is_skipped_and_counted():
    cfg = LearnerConfig(
        optimizer=AdamConfig(),
        learning_rate=0.1,
        skip_nonfinite=True,
        schedule=LinearSchedule(warmup_steps=2, decay_end=10),
    )
    tx = build_optimizer(cfg, PARAMS)
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    assert int(skipped_steps(state)) == 0
    params = PARAMS
    good = jax.grad(loss)
    bad_grads = {"w": jnp.ones((3, 4)), "b": jnp.array([1.0, jnp.nan, 1.0, jnp.inf])}
    for step in range(4):
        grads = bad_grads if step in (1, 2) else good(params)
        updates, state = update(grads, state, params)
        new_params = optax.apply_updates(params, updates)
        if step in (1, 2):
            assert_trees_close(new_params, params, rtol=0, atol=0)
        params = new_params
    assert int(skipped_steps(state)) == 2
    assert int(jax.jit(skipped_steps)(state)) == 2

    # The skipped steps changed nothing but the schedule's step: Adam saw two gradients, the
    # first at the lr of step 0, the second at the lr of step 3.
    lr = learning_rate_fn(cfg)
    adam = optax.scale_by_adam(b1=cfg.optimizer.b1, b2=cfg.optimizer.b2, eps=cfg.optimizer.eps)
    ref, ref_state = PARAMS, adam.init(PARAMS)
    for step in (0, 3):
        direction, ref_state = adam.update(good(ref), ref_state)
        ref = jax.tree.map(lambda p, d, s=step: p - lr(s) * d, ref, direction)
    assert_trees_close(params, ref)


def test_without_the_guard_a_nan_gradient_poisons_the_params():
    tx = build_optimizer(LearnerConfig(optimizer=SgdConfig(), learning_rate=0.1), PARAMS)
    nan = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), PARAMS)
    updates, state = tx.update(nan, tx.init(PARAMS), PARAMS)
    assert np.isnan(np.asarray(optax.apply_updates(PARAMS, updates)["w"])).all()
    assert int(skipped_steps(state)) == 0


def test_learning_rate_applied_is_the_logged_one():
    """Plain SGD on a gradient of ones moves each param by -lr(step): compare with learning_rate_fn."""
    cfg = LearnerConfig(
        optimizer=SgdConfig(momentum=0.0),
        learning_rate=0.2,
        schedule=ExponentialSchedule(warmup_steps=2, decay_end=5, min_ratio=0.1),
    )
    tx, lr = build_optimizer(cfg), learning_rate_fn(cfg)
    params, state = {"x": jnp.zeros(())}, tx.init({"x": jnp.zeros(())})
    for step in range(7):
        updates, state = tx.update({"x": jnp.ones(())}, state, params)
        assert float(updates["x"]) == pytest.approx(-float(lr(step)), rel=1e-6)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(learning_rate=-1e-3), r"learner.learning_rate must be a finite number > 0, got -0.001"),
        (dict(learning_rate=float("nan")), "learner.learning_rate"),
        (dict(num_microbatches=0), r"learner.num_microbatches must be >= 1 \(1 = no accumulation\), got 0"),
        (dict(optimizer="adamm"), "'adamm' is not an optimizer config; choose one of adamw, adam"),
        (dict(optimizer=AdamConfig(), weight_decay=0.1), "--learner.optimizer adamw"),
        (dict(ema_decay=1.0), "learner.ema_decay"),
        (dict(clip_grad_norm=-1.0), "learner.clip_grad_norm must be >= 0"),
        (dict(weight_decay=-0.1), "learner.weight_decay"),
    ],
)
def test_bad_values_name_the_field(fields, match):
    with pytest.raises(ConfigError, match=match):
        LearnerConfig(**fields)


def test_unknown_optimizer_from_dict():
    with pytest.raises(ConfigError, match="'adagrad' is not one of"):
        LearnerConfig.from_dict({"optimizer": {"kind": "adagrad"}})
    with pytest.raises(ConfigError, match="Did you mean 'clip_grad_norm'"):
        LearnerConfig.from_dict({"clip_norm": 1.0})


def test_json_round_trip_and_cli_parsing():
    cfg = LearnerConfig(optimizer=LionConfig(), weight_decay=0.1, schedule=COSINE, skip_nonfinite=True, ema_decay=0.99)
    assert LearnerConfig.from_json(cfg.to_json()) == cfg
    base = registry.load_experiment("shakespeare_char")
    args = ["--learner.schedule.warmup-steps", "100", "--learner.optimizer", "sgd", "--learner.schedule", "rsqrt"]
    parsed = cli.parse_fields(base, args, "test").learner
    assert parsed.optimizer == SgdConfig() and parsed.schedule == RsqrtSchedule(warmup_steps=100)
    # The shared fields stay: the experiment's learning rate, clipping and weight decay.
    assert parsed.replace(optimizer=base.learner.optimizer, schedule=base.learner.schedule) == base.learner


def test_an_older_config_json_with_a_named_optimizer_still_loads():
    """config.json before the choices: the optimizer's name beside every optimizer's fields."""
    old = {"optimizer": "sgd", "learning_rate": 0.1, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "eps_root": 0.0,
           "momentum": 0.5, "nesterov": True, "schedule": {"kind": "constant", "warmup_steps": 3, "decay_start": 0,
           "decay_end": 0, "min_ratio": 0.01, "max": 1.0, "boundaries": [], "values": []}}  # fmt: skip
    cfg = LearnerConfig.from_dict(old)
    assert cfg == LearnerConfig(
        optimizer=SgdConfig(momentum=0.5, nesterov=True), learning_rate=0.1, schedule=ConstantSchedule(warmup_steps=3)
    )


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda: AdamWConfig(b2=1.0), "learner.optimizer.b2 must be in [0, 1)"),
        (lambda: SgdConfig(b2=0.95), "SgdConfig has no field 'b2'"),
        (lambda: AdafactorConfig(b1=0.8), "AdafactorConfig has no field 'b1'"),
        (lambda: LionConfig(eps=1e-6), "LionConfig has no field 'eps'"),
        (lambda: AdamWConfig(momentum=0.5), "AdamWConfig has no field 'momentum'"),
        (lambda: SgdConfig(momentum=0.0, nesterov=True), "learner.optimizer.nesterov=True has no effect"),
        (lambda: LearnerConfig(weight_decay_mask="all"), "learner.weight_decay_mask='all' has no effect"),
    ],
)
def test_a_field_the_optimizer_would_ignore_is_not_one_of_its_fields(make, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        make()


def test_pax_adam_without_weight_decay_leaves_the_mask_alone():
    assert pax_adam(learning_rate=1e-3).weight_decay_mask == "matrices"
    assert pax_adam(learning_rate=1e-3, weight_decay=0.1).weight_decay_mask == "all"


def test_l2_regularization_is_added_to_the_gradient_before_momentum():
    """Pax's coupled L2: the direction is Nesterov momentum over (g + l2 * w), masked like weight
    decay (the 1-D bias gets none); checked against the update written out for two steps."""
    params = {"w": jnp.array([[1.0, -2.0]]), "b": jnp.array([0.5])}
    grads = {"w": jnp.array([[0.1, 0.2]]), "b": jnp.array([0.3])}
    cfg = LearnerConfig(optimizer=SgdConfig(momentum=0.9, nesterov=True), learning_rate=0.1, l2_regularization=0.01)
    tx = build_optimizer(cfg, params)
    state = tx.init(params)
    direction = {"w": np.asarray(grads["w"]) + 0.01 * np.asarray(params["w"]), "b": np.asarray(grads["b"])}
    trace = {k: np.zeros_like(v) for k, v in direction.items()}
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
        for k, g in direction.items():
            trace[k] = g + 0.9 * trace[k]
            np.testing.assert_allclose(updates[k], -0.1 * (g + 0.9 * trace[k]), rtol=1e-6)
