"""T5's relative position bias against Praxis 1.4 itself (`layers.attentions.RelativeBias`).

relative_bias/expected.npz is written by relative_bias/generate.py in Praxis' own environment:
the [B, N, T, S] bias for given query and key positions, bidirectional and causal, with T5's
32 buckets / max distance 128 over distances -250..299 (every bucket and far beyond
max_distance), and a small table in Praxis' use_length_as_position=True mode (positions
arange(T), arange(S)); and the gradient of <bias, cotangent> to the table. Praxis' table `wrb`
is [num_heads, num_buckets]; pax_eqx's `embedding` is its transpose.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.layers import RelativePositionBiasConfig, relative_position_bucket

EXPECTED = np.load(Path(__file__).resolve().parent / "relative_bias" / "expected.npz")
# name: (bidirectional, num_buckets, max_distance), as generate.py's CASES
CASES = {
    "t5_bidirectional": (True, 32, 128),
    "t5_causal": (False, 32, 128),
    "small_bidirectional_lengths": (True, 16, 20),
    "small_causal_lengths": (False, 16, 20),
}


@eqx.filter_jit
def _bias_and_grad(bias_layer, q, k, cotangent):
    def objective(layer):
        bias = layer(q, k)
        return jnp.sum(bias * cotangent), bias

    (_, bias), grad = eqx.filter_value_and_grad(objective, has_aux=True)(bias_layer)
    return bias, grad.embedding


@pytest.mark.parametrize("case", list(CASES))
def test_praxis_relative_bias_and_its_gradient(case):
    e = {k.split("/", 1)[1]: v for k, v in EXPECTED.items() if k.startswith(case + "/")}
    bidirectional, num_buckets, max_distance = CASES[case]
    num_heads = e["wrb"].shape[0]
    layer = RelativePositionBiasConfig(num_buckets=num_buckets, max_distance=max_distance).build(
        jax.random.PRNGKey(0), num_heads=num_heads, bidirectional=bidirectional
    )
    layer = eqx.tree_at(lambda b: b.embedding, layer, jnp.asarray(e["wrb"].T))
    q, k = jnp.asarray(e["query_pos"]), jnp.asarray(e["key_pos"])
    bias, grad = _bias_and_grad(layer, q, k, jnp.asarray(e["cotangent"]))
    np.testing.assert_allclose(bias, e["bias"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(grad.T, e["grad_wrb"], rtol=0, atol=1e-5)
    # The positions reach every bucket T5 uses (bidirectional: all but num_buckets // 2).
    buckets = relative_position_bucket(
        k[:, None, :] - q[:, :, None], bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    unused = {num_buckets // 2} if bidirectional else set()
    if case.startswith("t5"):
        assert set(np.unique(np.asarray(buckets)).tolist()) == set(range(num_buckets)) - unused
