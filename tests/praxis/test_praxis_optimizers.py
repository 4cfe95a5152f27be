"""pax_eqx's optimizers against Praxis 1.4's own, run by Paxml's Learner (optimizers/expected.npz,
written by optimizers/generate.py in Praxis' environment; see its docstring for the cases).

Each case builds the learner as a user would (`LearnerConfig` with an optimizer config, or
`pax_adam`), runs `build_optimizer` on the same parameters and gradients, and must give Praxis'
parameters after every step within ATOL (absolute; the parameters are O(1), the updates O(lr), so
no rtol is needed). The settings each case matches are the documentation of the mapping:

- Adam (sharded_adam) = `pax_adam(...)`, i.e. AdamWConfig + clip_update_rms + weight decay on all;
- ShardedSgd / Sgd (optax.sgd) = SgdConfig; BaseOptimizer's decoupled_weight_decay = the learner's
  weight_decay, its l2_regularizer_weight = l2_regularization (weight_decay_mask="all" for both);
- ShardedAdafactor as Pax's LM experiments set it = AdafactorConfig(decay_method="adam",
  decay_rate=0.99, beta1=0.9, multiply_by_parameter_scale=False, factored_dims="last"), its
  momentum in float32 (Praxis' quantized_dtype="float32"), or with momentum_dtype="int8" (Praxis'
  default; its stored values: test_praxis_quantized_momentum.py);
- ShardedAdafactor in optax's form (pow 0.8, parameter scale, sorted factoring) = AdafactorConfig().
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import registry
from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError
from pax_eqx.learners import (
    AdafactorConfig,
    LearnerConfig,
    SgdConfig,
    build_optimizer,
    linear_rampup_exponential_decay,
    pax_adam,
)

EXPECTED = np.load(os.path.join(os.path.dirname(__file__), "optimizers", "expected.npz"))
NAMES = ("w", "b", "t", "k")
STEPS = EXPECTED["adam_lm/w"].shape[0]
ATOL = 1e-5
# Praxis' default ShardedAdafactor stores its momentum as int8 (quantized_dtype="int8"): after 8
# steps at lr 0.1 the float32 momentum (momentum_dtype="float32") is 1.9e-3 from Praxis' int8 run
# (generate.py's adafactor_lm_int8) at most, where momentum_dtype="int8" is within ATOL.
INT8_MOMENTUM_GAP = (5e-4, 5e-3)

WARMUP = linear_rampup_exponential_decay(warmup_steps=4, decay_start=5, decay_end=8, min_ratio=0.1, max=1.0)
# Pax's ShardedAdafactor momentum averages lr(s) * update(s); ours averages update(s) and the
# learning rate multiplies the average: the same under a constant rate, not under a changing one.
# Under WARMUP (lr 0, 0.025, 0.05, 0.075, 0.1, then decaying to 0.01 by step 8) the two are up to
# 0.13 apart after 8 steps (generate.py's adafactor_lm_warmup): the bounds below.
MOMENTUM_UNDER_SCHEDULE_GAP = (0.05, 0.25)

PAX_LM_ADAFACTOR = AdafactorConfig(
    decay_method="adam", decay_rate=0.99, beta1=0.9, multiply_by_parameter_scale=False, factored_dims="last"
)

CASES = {
    "adam_lm": pax_adam(learning_rate=0.01, beta1=0.9, beta2=0.99, weight_decay=1e-2, clip_gradient_norm_to_value=5.0),
    "adam_orghp": pax_adam(
        learning_rate=0.02, beta1=0.9, beta2=0.95, epsilon=1e-8, epsilon_root=1e-4, clip_threshold=-1.0,
        weight_decay=0.1, clip_gradient_norm_to_value=1.0,
    ),
    "sgd_momentum": LearnerConfig(optimizer=SgdConfig(momentum=0.9), learning_rate=0.1),
    "sgd_nesterov_wd": LearnerConfig(
        optimizer=SgdConfig(momentum=0.9, nesterov=True), learning_rate=0.1, weight_decay=0.05,
        weight_decay_mask="all",
    ),
    "sgd_l2": LearnerConfig(
        optimizer=SgdConfig(momentum=0.0), learning_rate=0.1, l2_regularization=0.05, weight_decay_mask="all"
    ),
    "adafactor_lm": LearnerConfig(
        optimizer=PAX_LM_ADAFACTOR, learning_rate=0.1, weight_decay=1e-2, weight_decay_mask="all", clip_grad_norm=5.0
    ),
    "adafactor_lm_int8": LearnerConfig(
        optimizer=PAX_LM_ADAFACTOR.replace(momentum_dtype="int8"), learning_rate=0.1, weight_decay=1e-2,
        weight_decay_mask="all", clip_grad_norm=5.0,
    ),
    "adafactor_optax_form": LearnerConfig(optimizer=AdafactorConfig(), learning_rate=0.05),
    # Pax's warmup + exponential decay, without momentum: the schedule alone.
    "adafactor_lm_warmup_no_momentum": LearnerConfig(
        optimizer=PAX_LM_ADAFACTOR.replace(beta1=0.0), learning_rate=0.1, weight_decay=1e-2, weight_decay_mask="all",
        clip_grad_norm=5.0, schedule=WARMUP,
    ),
}  # fmt: skip

# One setting of each case moved a little: the comparison must then fail by well over ATOL.
PERTURBED = {
    "adam_lm": CASES["adam_lm"].replace(optimizer=CASES["adam_lm"].optimizer.replace(b1=0.85)),
    "sgd_nesterov_wd": CASES["sgd_nesterov_wd"].replace(optimizer=SgdConfig(momentum=0.9)),
    "sgd_l2": CASES["sgd_l2"].replace(l2_regularization=0.045),
    "adafactor_lm": CASES["adafactor_lm"].replace(optimizer=PAX_LM_ADAFACTOR.replace(decay_rate=0.98)),
    "adafactor_lm/beta1": CASES["adafactor_lm"].replace(optimizer=PAX_LM_ADAFACTOR.replace(beta1=0.85)),
    "adafactor_lm/factored_dims": CASES["adafactor_lm"].replace(
        optimizer=PAX_LM_ADAFACTOR.replace(factored_dims="largest")
    ),
    "adafactor_lm/pow": CASES["adafactor_lm"].replace(optimizer=PAX_LM_ADAFACTOR.replace(decay_method="pow")),
    "adafactor_lm/parameter_scale": CASES["adafactor_lm"].replace(
        optimizer=PAX_LM_ADAFACTOR.replace(multiply_by_parameter_scale=True)
    ),
    "adafactor_optax_form": CASES["adafactor_optax_form"].replace(optimizer=AdafactorConfig(decay_rate=0.7)),
}


@functools.cache
def run(cfg: LearnerConfig) -> dict[str, np.ndarray]:
    """The parameters after each step, {name: [STEPS, *shape]}, from Praxis' start and gradients."""
    params = {k: jnp.asarray(EXPECTED[f"params/{k}"]) for k in NAMES}
    tx = build_optimizer(cfg, params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state, out = tx.init(params), []
    for i in range(STEPS):
        params, state = step(params, state, {k: jnp.asarray(EXPECTED[f"grads/{i}/{k}"]) for k in NAMES})
        out.append(params)
    return {k: np.stack([np.asarray(p[k]) for p in out]) for k in NAMES}


def max_gap(ours: dict[str, np.ndarray], case: str) -> float:
    return max(float(np.max(np.abs(ours[k] - EXPECTED[f"{case}/{k}"]))) for k in NAMES)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_praxis_at_every_step(case):
    ours = run(CASES[case])
    for k in NAMES:
        np.testing.assert_allclose(ours[k], EXPECTED[f"{case}/{k}"], rtol=0, atol=ATOL, err_msg=f"{case}: {k}")
    assert max_gap(ours, case) < ATOL
    assert np.max(np.abs(ours["w"][-1] - EXPECTED["params/w"])) > 100 * ATOL  # the optimizer moved


@pytest.mark.parametrize("perturbed", list(PERTURBED))
def test_a_perturbed_setting_misses_praxis(perturbed):
    """The comparison has teeth: one setting moved a little is off by more than 10 x ATOL."""
    assert max_gap(run(PERTURBED[perturbed]), perturbed.split("/")[0]) > 10 * ATOL


def test_a_float32_momentum_differs_from_praxis_int8_by_its_quantization():
    """Praxis' default ShardedAdafactor keeps beta1's momentum in int8; with momentum_dtype="float32"
    (and Praxis' quantized_dtype="float32") it stays float32: the gap is the quantization's, of
    the documented size (the int8 case itself is in CASES)."""
    gap = max_gap(run(CASES["adafactor_lm"]), "adafactor_lm_int8")
    assert INT8_MOMENTUM_GAP[0] < gap < INT8_MOMENTUM_GAP[1], gap


def test_adafactor_momentum_under_a_changing_learning_rate_differs_from_praxis():
    """The one formula-level difference left: where the learning rate enters beta1's average (see
    MOMENTUM_UNDER_SCHEDULE_GAP). Without momentum the same schedule matches (CASES)."""
    cfg = CASES["adafactor_lm_warmup_no_momentum"].replace(optimizer=PAX_LM_ADAFACTOR)
    gap = max_gap(run(cfg), "adafactor_lm_warmup")
    assert MOMENTUM_UNDER_SCHEDULE_GAP[0] < gap < MOMENTUM_UNDER_SCHEDULE_GAP[1], gap


def test_optax_default_adafactor_is_far_from_paxs_lm_adafactor():
    """Without the Praxis settings (optax's defaults: pow decay, parameter scale, no momentum, no
    factoring below 128), Adafactor is a different optimizer from Pax's LM one."""
    default = CASES["adafactor_lm"].replace(optimizer=AdafactorConfig())
    assert max_gap(run(default), "adafactor_lm") > 1e-3


def test_last_dims_factoring_keeps_row_and_column_statistics_of_the_last_two_dims():
    """factored_dims="last" (Praxis' default): every >= 2-D parameter keeps, per leading index, a
    row statistic (the last dimension dropped) and a column one (the second-last dropped)."""
    params = {k: jnp.asarray(EXPECTED[f"params/{k}"]) for k in NAMES}
    state = build_optimizer(CASES["adafactor_lm"], params).init(params)
    factored = next(s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.FactoredState))
                    if isinstance(s, optax.FactoredState))  # fmt: skip
    assert {k: v.shape for k, v in factored.v_row.items()} == {"w": (4,), "b": (1,), "t": (3, 4), "k": (6, 2)}
    assert {k: v.shape for k, v in factored.v_col.items()} == {"w": (6,), "b": (1,), "t": (3, 5), "k": (6, 3)}
    assert {k: v.shape for k, v in factored.v.items()} == {"w": (1,), "b": (6,), "t": (1,), "k": (1,)}


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(decay_rate=0.0), "decay_rate"),
        (dict(decay_rate=1.5), "decay_rate"),
        (dict(decay_rate=float("nan")), "decay_rate"),
        (dict(decay_method="adam", decay_rate=1.0), "decay_rate"),  # 0 / 0 at every step
        (dict(decay_method="rms"), "decay_method"),
        (dict(beta1=1.0), "beta1"),
        (dict(beta1=-0.1), "beta1"),
        (dict(factored_dims="first"), "factored_dims"),
        (dict(beta1=0.9, momentum_dtype="int4"), "momentum_dtype"),
        (dict(momentum_dtype="int8"), "momentum_dtype"),  # beta1 = 0: no momentum to store
    ],
)
def test_adafactor_settings_are_checked(fields, named):
    with pytest.raises(ConfigError, match=rf"learner\.optimizer\.{named}\b"):
        AdafactorConfig(**fields)


def test_adafactor_settings_round_trip_and_parse():
    """The Praxis settings as flags (on t5_1_1_small, whose learner is Adafactor) and in config.json."""
    exp = registry.load_experiment("t5_1_1_small")
    args = ["--learner.optimizer.decay-method", "adam", "--learner.optimizer.decay-rate", "0.99",
            "--learner.optimizer.beta1", "0.9", "--learner.optimizer.no-multiply-by-parameter-scale",
            "--learner.optimizer.factored-dims", "last"]  # fmt: skip
    assert cli.parse_fields(exp, args, "test").learner.optimizer == PAX_LM_ADAFACTOR
    int8 = cli.parse_fields(exp, [*args, "--learner.optimizer.momentum-dtype", "int8"], "test").learner.optimizer
    assert int8 == PAX_LM_ADAFACTOR.replace(momentum_dtype="int8")
    cfg = CASES["adafactor_lm_int8"]
    assert LearnerConfig.from_json(cfg.to_json()) == cfg
