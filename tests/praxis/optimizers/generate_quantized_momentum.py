"""Writes quantized_momentum.npz here: Praxis 1.4's ShardedAdafactor with its momentum stored
quantized (its default quantized_dtype="int8", and "int16", "bfloat16"), driven by Paxml's
Learner as generate.py drives it, with the *state* saved as well as the parameters.

Why a second file: expected.npz (generate.py) holds the parameters only, and on parameters of
two or more dimensions. Here the parameters are a matrix w [4, 6] whose gradients' first column
is zero at every step (so that column's momentum, and its int8 scale, stay 0: Praxis' guard
against dividing by a zero scale), a vector b [6] (one scale for the whole vector), a 3-D kernel
k [6, 2, 3] (scales [2, 3]) and a scalar s [] (Praxis keeps a 0-D parameter's momentum in
float32), and the state Praxis writes after each step is saved: its int8 (int16, bfloat16)
momentum `m` and the float32 scales `m_scale`.

Settings: Pax's LM Adafactor (model_params.set_default_adafactor: decay_method='adam',
decay_adam=0.99, beta1=0.9, weight decay 1e-2, clip 5.0) at a constant learning rate. Praxis'
momentum averages lr * update; pax_eqx's averages the update, the learning rate multiplying the
average: at lr 0.1 Praxis' int8 momentum is 0.1 x ours up to float32 rounding of the scale. The
bfloat16 case runs at lr 0.125, a power of two, where rounding to bfloat16 commutes with the
learning rate; "bfloat16_lr0.1" shows the gap at 0.1 (a bfloat16 rounding of lr * m is not lr
times a rounding of m).

npz keys: "params/<name>" (the start), "grads/<step>/<name>", and for each case
"<case>/params/<name>", "<case>/updates/<name>", "<case>/m/<name>" (in Praxis' dtype),
"<case>/m_scale/<name>", each [STEPS, *shape]: the value after steps 1..STEPS.

Runs only in Praxis' Python 3.10 environment (praxis 1.4.0 / paxml 1.4 / jax 0.4.26):

    cd /tmp && JAX_PLATFORMS=cpu /work/paxenv/bin/python /path/to/tests/praxis/optimizers/generate_quantized_momentum.py

tests/praxis/test_praxis_quantized_momentum.py reads it with pax_eqx's Adafactor.
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
SHAPES = {"w": (4, 6), "b": (6,), "k": (6, 2, 3), "s": ()}


def lm_adafactor(quantized_dtype: str, learning_rate: float) -> pax_fiddle.Config:
    return pax_fiddle.Config(
        optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99, beta1=0.9, weight_decay=1e-2,
        quantized_dtype=quantized_dtype, clip_gradient_norm_to_value=5.0, learning_rate=learning_rate,
        lr_schedule=pax_fiddle.Config(schedules.Constant),
    )  # fmt: skip


CASES = {
    "int8": lm_adafactor("int8", 0.1),  # Praxis' default
    "int16": lm_adafactor("int16", 0.1),
    "bfloat16": lm_adafactor("bfloat16", 0.125),
    "bfloat16_lr0.1": lm_adafactor("bfloat16", 0.1),
}


def adafactor_state(state):
    """The ShardedAdafactorState inside the learner's state (a chain of transformations)."""
    found = [
        s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optimizers.ShardedAdafactorState))
        if isinstance(s, optimizers.ShardedAdafactorState)
    ]  # fmt: skip
    assert len(found) == 1, found
    return found[0]


def run(optimizer, params, grads):
    learner = pax_fiddle.instantiate(pax_fiddle.Config(learners.Learner, name="learner", optimizer=optimizer))
    hparams = py_utils.NestedMap({k: base_layer.WeightHParams(shape=list(s)) for k, s in SHAPES.items()})
    with base_layer.JaxContext.new_context():
        tx = learner.get_grad_tx(hparams)
        state = tx.init(params)

        @jax.jit
        def step(params, state, grad):
            updates, state = learner.update_states(grad, state, params, hparams)
            return learner.apply_gradient(params, updates, hparams), updates, state

        out = {"params": [], "updates": [], "m": [], "m_scale": []}
        for grad in grads:
            params, updates, state = step(params, state, grad)
            adafactor = adafactor_state(state)
            for key, tree in (("params", params), ("updates", updates), ("m", adafactor.m),
                              ("m_scale", adafactor.m_scale)):  # fmt: skip
                out[key].append(jax.tree.map(np.asarray, tree))
    # bfloat16 has no numpy dtype of its own in an npz: bfloat16 momentum is saved as float32 (exact).
    as_saved = lambda a: a.astype(np.float32) if a.dtype.name == "bfloat16" else a  # noqa: E731
    return {f"{key}/{k}": np.stack([as_saved(t[k]) for t in trees]) for key, trees in out.items() for k in SHAPES}


def main() -> None:
    rng = np.random.default_rng(53)
    params = py_utils.NestedMap({k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()})
    grads = []
    for _ in range(STEPS):
        g = py_utils.NestedMap({k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()})
        g["w"][:, 0] = 0.0  # w's first column never moves: its momentum scale stays 0
        grads.append(g)
    out = {f"params/{k}": np.asarray(v) for k, v in params.items()}
    for i, g in enumerate(grads):
        out.update({f"grads/{i}/{k}": np.asarray(v) for k, v in g.items()})
    for name, optimizer in CASES.items():
        result = run(optimizer, params, grads)
        out.update({f"{name}/{key}": v for key, v in result.items()})
        print(name, {k: (str(result[f"m/{k}"].dtype), result[f"m_scale/{k}"].shape[1:]) for k in SHAPES})
    np.savez(os.path.join(HERE, "quantized_momentum.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
