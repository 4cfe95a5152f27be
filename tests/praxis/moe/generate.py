"""Writes expected.npz here: Praxis 1.4's GShard top-2 gating and MoE feed-forward layer.

(a) `gshard_utils.top2_gating_on_logits` on fixed [G, S, E] logits with paddings and a capacity
    of 2 (so that some assignments overflow, in both slots): its aux loss, combine and dispatch
    tensors and over-capacity ratios (legacy_mtf_behavior=True, second_expert_policy="all", as
    TransformerFeedForwardMoe calls it).
(b) `layers.transformers.TransformerFeedForwardMoe`, its routed part alone (IdentityNorm, no
    skip connection, no dropout), on a padded [B, T, M] input in num_groups=2 groups with the
    same capacity: the output, the weighted aux loss it adds (`aux_moe_load_balance_loss`), and
    the gradients of <output, cotangent> + aux_cotangent * aux_loss to the input and to every
    parameter. Three cases: ReLU experts, gated SiLU experts with a gating logit cap, and
    gating_func="dense_top2" (no capacity: every expert on every token, the top-2 gates
    renormalised; no load-balancing loss, Praxis adds 0).

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/praxis/moe/generate.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, gshard_utils, pax_fiddle  # noqa: E402
from praxis.layers import activations, normalizations, transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
G, S, E, CAPACITY = 2, 8, 4, 2
B, T, M, H = 2, 8, 8, 16
GATING_PADDINGS = np.asarray([[0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]], np.float32)
LAYER_PADDINGS = np.asarray([[0, 0, 0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0]], np.float32)
# name: (activation, gated, gating_logit_cap, moe_load_balance_loss_weight, gating_func)
CASES = {
    "relu": (activations.ReLU, False, 0.0, 1.0, "top2"),
    "gated_silu_cap": (activations.SiLU, True, 2.0, 0.5, "top2"),
    "dense_top2": (activations.ReLU, False, 0.0, 1.0, "dense_top2"),
}


def gating(rng, out) -> None:
    # Logits skewed towards experts 0 and 1, so that they overflow in both slots.
    logits = (rng.standard_normal((G, S, E)) + np.asarray([1.5, 1.0, 0.0, -0.5])).astype(np.float32)
    aux_loss, combine, dispatch, stats = gshard_utils.top2_gating_on_logits(
        paddings=jnp.asarray(GATING_PADDINGS), logits=jnp.asarray(logits), experts_dim=E,
        expert_capacity_dim=CAPACITY, fprop_dtype=jnp.float32, second_expert_policy="all",
        legacy_mtf_behavior=True, capacity_factor=None, mask_dtype=jnp.int32,
    )  # fmt: skip
    out["gating/logits"] = logits
    out["gating/paddings"] = GATING_PADDINGS
    out["gating/aux_loss"] = np.asarray(aux_loss)
    out["gating/combine"] = np.asarray(combine)
    out["gating/dispatch"] = np.asarray(dispatch)
    out["gating/over_capacity"] = np.asarray([stats[0], stats[1]], np.float32)
    print("gating over capacity", out["gating/over_capacity"], "aux", float(aux_loss))


def layer_case(rng, out, name, activation, gated, cap, weight, gating_func) -> None:
    layer = base_layer.instantiate(
        pax_fiddle.Config(
            transformers.TransformerFeedForwardMoe, name="moe", input_dims=M, hidden_dims=H, num_experts=E,
            num_groups=2, expert_capacity_dim=CAPACITY, unadjusted_expert_capacity_factor=1.0,
            ln_tpl=pax_fiddle.Config(normalizations.IdentityNorm), add_skip_connection=False,
            activation_tpl=pax_fiddle.Config(activation), use_gated_activation=gated, gating_logit_cap=cap,
            moe_load_balance_loss_weight=weight, gating_func=gating_func,
        )
    )  # fmt: skip
    x = rng.standard_normal((B, T, M)).astype(np.float32)
    init = layer.init(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(LAYER_PADDINGS))["params"]
    params = {}
    for k, v in init.items():
        if k == "gate":  # skewed, so that the group's tokens crowd two experts and overflow
            params[k] = (rng.standard_normal(v.shape) * 0.5 + np.asarray([0.4, 0.2, 0.0, -0.3])).astype(np.float32)
        elif k in ("wi_0", "wi_gate_0", "wo_0"):
            params[k] = (rng.standard_normal(v.shape) * 0.5).astype(np.float32)
        else:
            params[k] = v
    assert set(k for k in params if jax.tree.leaves(params[k])) == (
        {"gate", "wi_0", "wo_0"} | ({"wi_gate_0"} if gated else set())
    ), list(params)
    cotangent = rng.standard_normal((B, T, M)).astype(np.float32)
    aux_cotangent = np.float32(0.7)

    def forward(params, x):
        y, coll = layer.apply(
            {"params": params}, x, jnp.asarray(LAYER_PADDINGS), mutable=[base_layer.AUX_LOSS, base_layer.SUMMARIES]
        )
        aux = coll[base_layer.AUX_LOSS]["aux_moe_load_balance_loss"]
        return y, aux.value

    with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
        (y, aux), vjp = jax.vjp(forward, params, jnp.asarray(x))
        grads, grad_x = vjp((jnp.asarray(cotangent), jnp.asarray(aux_cotangent)))
    out[f"{name}/x"] = x
    out[f"{name}/paddings"] = LAYER_PADDINGS
    out[f"{name}/y"] = np.asarray(y)
    out[f"{name}/aux_loss"] = np.asarray(aux)
    out[f"{name}/cotangent"] = cotangent
    out[f"{name}/aux_cotangent"] = np.asarray(aux_cotangent)
    out[f"{name}/grad_x"] = np.asarray(grad_x)
    for k in ("gate", "wi_0", "wi_gate_0", "wo_0"):
        if k in params:
            out[f"{name}/{k}"] = np.asarray(params[k])
            out[f"{name}/grad_{k}"] = np.asarray(grads[k])
    print(name, "aux", float(aux), "|y|", float(jnp.abs(y).max()))


def main() -> None:
    rng = np.random.default_rng(0)
    out = {}
    gating(rng, out)
    for name, case in CASES.items():
        layer_case(rng, out, name, *case)
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
