"""GShard top-2 gating and the MoE feed-forward layer against Praxis 1.4 itself.

moe/expected.npz is written by moe/generate.py in Praxis' own environment:

- `gshard_utils.top2_gating_on_logits` (legacy_mtf_behavior=True, second_expert_policy="all")
  on fixed logits with paddings and capacity 2, which both slots overflow: `top2_gating`'s
  combine and dispatch tensors, aux loss and per-slot dropped fractions (Praxis'
  over_capacity_{1,2} ratios) are Praxis';
- `TransformerFeedForwardMoe`'s routed part (IdentityNorm, no skip connection, no dropout) on a
  padded input in 2 groups with the same capacity, ReLU experts and gated SiLU experts with a
  gating logit cap, and its gating_func="dense_top2" (`dropless=True` with
  load_balance_loss_weight=0): `MoEFeedForward`'s output, its weighted `load_balance_loss`
  (Praxis' `aux_moe_load_balance_loss`) and the gradients of <output, cotangent> + c * aux_loss
  to the input and every parameter are Praxis'.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.layers import Context, Mode
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.moe_routing import top2_gating

EXPECTED = np.load(Path(__file__).resolve().parent / "moe" / "expected.npz")
ATOL = 1e-5


def test_praxis_top2_gating_combine_dispatch_and_aux_loss():
    e = EXPECTED
    capacity = e["gating/combine"].shape[-1]
    gating = jax.jit(top2_gating, static_argnums=2)
    routing = gating(jnp.asarray(e["gating/logits"]), jnp.asarray(e["gating/paddings"]), capacity)
    np.testing.assert_allclose(routing.combine, e["gating/combine"], rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(routing.dispatch, np.float32), e["gating/dispatch"])
    np.testing.assert_allclose(routing.aux_loss, e["gating/aux_loss"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(routing.stats.dropped_fraction_per_slot, e["gating/over_capacity"], rtol=0, atol=ATOL)
    # The case is one where capacity matters: both slots drop, and padding is never routed.
    assert (e["gating/over_capacity"] > 0).all()
    assert not e["gating/dispatch"][e["gating/paddings"] > 0].any()


# name: (activation, gated, gating_logit_cap, load_balance_loss_weight, dropless), as generate.py's CASES.
# Praxis' dense_top2 (no capacity) is dropless=True; it has no load-balancing loss (Praxis adds
# 0), which is load_balance_loss_weight=0.
CASES = {
    "relu": ("relu", False, 0.0, 1.0, False),
    "gated_silu_cap": ("silu", True, 2.0, 0.5, False),
    "dense_top2": ("relu", False, 0.0, 0.0, True),
}


def _layer(case: str):
    """pax_eqx's MoEFeedForward with the case's Praxis weights: capacity_factor=1.0 and
    min_capacity=2 give Praxis' unadjusted_expert_capacity_factor=1.0, expert_capacity_dim=2."""
    e = EXPECTED
    activation, gated, cap, weight, dropless = CASES[case]
    m, num_experts = e[f"{case}/gate"].shape
    capacity = {} if dropless else {"capacity_factor": 1.0, "min_capacity": 2}
    cfg = MoEFeedForwardConfig(
        num_experts=num_experts, num_groups=2, gating_logit_cap=cap, load_balance_loss_weight=weight,
        activation=ActivationConfig(name=activation, gated=gated), dropless=dropless, **capacity,
    )  # fmt: skip
    layer = cfg.build(jax.random.PRNGKey(0), model_dims=m, hidden_dims=e[f"{case}/wi_0"].shape[-1])
    weights = tuple(jnp.asarray(e[f"{case}/{k}"]) for k in ("gate", "wi_0", "wo_0"))
    layer = eqx.tree_at(lambda f: (f.gate, f.wi, f.wo), layer, weights)
    if gated:
        layer = eqx.tree_at(lambda f: f.wi_gate, layer, jnp.asarray(e[f"{case}/wi_gate_0"]))
    return layer


def _forward(layer, x, case):
    y, ctx = layer(x, Context(mode=Mode.EVAL), paddings=jnp.asarray(EXPECTED[f"{case}/paddings"]))
    return y, ctx.aux_losses.get("load_balance_loss", jnp.zeros(()))


@eqx.filter_jit
def _value_and_grads(layer, x, case: str):
    """(output, aux loss) and the gradients of <output, cotangent> + c * aux_loss, one program."""
    e = EXPECTED

    def objective(layer_and_x):
        y, aux = _forward(*layer_and_x, case)
        return jnp.sum(y * e[f"{case}/cotangent"]) + e[f"{case}/aux_cotangent"] * aux, (y, aux)

    (_, (y, aux)), grads = eqx.filter_value_and_grad(objective, has_aux=True)((layer, x))
    return y, aux, grads


@pytest.mark.parametrize("case", list(CASES))
def test_praxis_moe_layer_output_aux_loss_and_gradients(case):
    e = EXPECTED
    y, aux, (grad_layer, grad_x) = _value_and_grads(_layer(case), jnp.asarray(e[f"{case}/x"]), case)
    np.testing.assert_allclose(y, e[f"{case}/y"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(aux, e[f"{case}/aux_loss"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(grad_x, e[f"{case}/grad_x"], rtol=0, atol=ATOL)
    names = {"gate": "gate", "wi": "wi_0", "wo": "wo_0"} | ({"wi_gate": "wi_gate_0"} if CASES[case][1] else {})
    for ours, theirs in names.items():
        np.testing.assert_allclose(getattr(grad_layer, ours), e[f"{case}/grad_{theirs}"], rtol=0, atol=ATOL)
    assert np.abs(e[f"{case}/grad_gate"]).max() > 1e-3  # the router is trained through the gates and the aux loss
