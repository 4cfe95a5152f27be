"""Writes expected.npz here: the parameters after each of STEPS steps of Praxis 1.4's own
optimizers, driven as Paxml trains: a `pax_fiddle.Config` of the optimizer (its learning rate and
schedule included) in a `paxml.learners.Learner`, whose `get_grad_tx(...).init`
starts the state and whose `update_states` (gradient-norm clipping, the optimizer's
`get_grad_transformation`, the skip of non-finite steps) and `apply_gradient` make each step.

The parameters (a NestedMap): w [4, 6], b [6], t [3, 4, 5] and k [6, 2, 3] (an attention-like
kernel whose last two dimensions are not its largest), and one fixed random gradient per step.
npz keys: "params/<name>" (the start), "grads/<step>/<name>", and "<case>/<name>" of shape
[STEPS, *shape]: the parameter after steps 1..STEPS. The cases (CASES below): Adam as Pax's LM
experiments set it (model_params.set_default_adam and an OrgHP-like variant), ShardedSgd with
momentum and with Nesterov momentum + decoupled weight decay, Sgd with L2, and ShardedAdafactor
as Pax's LM experiments set it (set_default_adafactor: decay_method='adam', decay_adam=0.99,
beta1=0.9) with its momentum in float32 and with Praxis' default int8-quantized momentum, the
same under a warmup + exponential decay schedule (with and without momentum), and
ShardedAdafactor in optax's (T5's) form (pow decay 0.8, parameter scale, sorted factoring).
Every case but the *_warmup ones has a constant learning rate.

Runs only in Praxis' Python 3.10 environment (praxis 1.4.0 / paxml 1.4 / jax 0.4.26):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/praxis/optimizers/generate.py

tests/praxis/test_praxis_optimizers.py reads the file with pax_eqx's optimizers.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from paxml import learners  # noqa: E402
from praxis import base_layer, optimizers, pax_fiddle, py_utils, schedules  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 8
SHAPES = {"w": (4, 6), "b": (6,), "t": (3, 4, 5), "k": (6, 2, 3)}
LR = pax_fiddle.Config(schedules.Constant)
WARMUP = pax_fiddle.Config(
    schedules.LinearRampupExponentialDecay, warmup_steps=4, decay_start=5, decay_end=8, min_ratio=0.1, max=1.0
)

# case -> the optimizer's config (learning rate and clipping included), as Paxml's learner gets it.
CASES = {
    # paxml/tasks/lm/model_params.py set_default_adam (c4.py's recipe), the learning rate and
    # weight decay being the experiment's.
    "adam_lm": pax_fiddle.Config(
        optimizers.Adam, beta1=0.9, beta2=0.99, weight_decay=1e-2, clip_gradient_norm_to_value=5.0,
        learning_rate=0.01, lr_schedule=LR,
    ),
    # The OrgHP-style Adam (nvidia.py / c4.py with overrides): b2 0.95, eps 1e-8, epsilon_root,
    # no update cap, weight decay 0.1, gradient clipping at 1.
    "adam_orghp": pax_fiddle.Config(
        optimizers.Adam, beta1=0.9, beta2=0.95, epsilon=1e-8, epsilon_root=1e-4, clip_threshold=-1.0,
        weight_decay=0.1, clip_gradient_norm_to_value=1.0, learning_rate=0.02, lr_schedule=LR,
    ),
    "sgd_momentum": pax_fiddle.Config(optimizers.ShardedSgd, momentum=0.9, learning_rate=0.1, lr_schedule=LR),
    # imagenet_resnets.py's ShardedSgd(momentum=0.9, nesterov=True), with BaseOptimizer's decoupled
    # weight decay (applied after the optimizer, times the learning rate).
    "sgd_nesterov_wd": pax_fiddle.Config(
        optimizers.ShardedSgd, momentum=0.9, nesterov=True, decoupled_weight_decay=0.05, learning_rate=0.1,
        lr_schedule=LR,
    ),
    # Plain (optax) Sgd with BaseOptimizer's L2 regularizer (added to the gradient).
    "sgd_l2": pax_fiddle.Config(optimizers.Sgd, l2_regularizer_weight=0.05, learning_rate=0.1, lr_schedule=LR),
    # paxml/tasks/lm/model_params.py set_default_adafactor, momentum kept in float32.
    "adafactor_lm": pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99, beta1=0.9, weight_decay=1e-2,
        quantized_dtype="float32", clip_gradient_norm_to_value=5.0, learning_rate=0.1, lr_schedule=LR,
    ),
    # The same with Praxis' default quantized_dtype='int8': the momentum is stored as int8.
    "adafactor_lm_int8": pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99, beta1=0.9, weight_decay=1e-2,
        clip_gradient_norm_to_value=5.0, learning_rate=0.1, lr_schedule=LR,
    ),
    # Pax's LM Adafactor under Pax's warmup + exponential decay schedule: with beta1 = 0.9, and
    # without momentum (beta1 = 0), where the schedule alone is compared.
    "adafactor_lm_warmup": pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99, beta1=0.9, weight_decay=1e-2,
        quantized_dtype="float32", clip_gradient_norm_to_value=5.0, learning_rate=0.1, lr_schedule=WARMUP,
    ),
    "adafactor_lm_warmup_no_momentum": pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99, weight_decay=1e-2,
        clip_gradient_norm_to_value=5.0, learning_rate=0.1, lr_schedule=WARMUP,
    ),
    # optax.adafactor's (T5X's) form: pow decay 0.8, relative step (parameter scale), factoring the
    # two largest dimensions when both are >= 128, no momentum.
    "adafactor_optax_form": pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="pow", decay_pow=0.8, multiply_by_parameter_scale=True,
        sort_factored_second_moment_dims=True, min_dim_size_to_factor=128, learning_rate=0.05, lr_schedule=LR,
    ),
}  # fmt: skip


def run(optimizer, params, grads):
    learner = pax_fiddle.instantiate(pax_fiddle.Config(learners.Learner, name="learner", optimizer=optimizer))
    hparams = py_utils.NestedMap({k: base_layer.WeightHParams(shape=list(s)) for k, s in SHAPES.items()})
    with base_layer.JaxContext.new_context():
        tx = learner.get_grad_tx(hparams)
        state = tx.init(params)

        @jax.jit
        def step(params, state, grad):
            updates, state = learner.update_states(grad, state, params, hparams)
            return learner.apply_gradient(params, updates, hparams), state

        out = []
        for grad in grads:
            params, state = step(params, state, grad)
            out.append(params)
    return {k: np.stack([np.asarray(p[k]) for p in out]) for k in SHAPES}


def main() -> None:
    rng = np.random.default_rng(0)
    params = py_utils.NestedMap({k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()})
    grads = [
        py_utils.NestedMap({k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()})
        for _ in range(STEPS)
    ]
    out = {f"params/{k}": v for k, v in params.items()}
    for i, g in enumerate(grads):
        out.update({f"grads/{i}/{k}": v for k, v in g.items()})
    for name, optimizer in CASES.items():
        result = run(optimizer, params, grads)
        out.update({f"{name}/{k}": v for k, v in result.items()})
        print(name, {k: float(np.max(np.abs(v[-1] - params[k]))) for k, v in result.items()})
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
