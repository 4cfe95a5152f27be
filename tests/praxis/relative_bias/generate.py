"""Writes expected.npz here: Praxis 1.4's T5 relative position bias (`layers.attentions.RelativeBias`)
for given query and key positions, bidirectional and causal, and the gradient of
<bias, cotangent> to its [num_heads, num_buckets] table `wrb`.

Cases: T5's 32 buckets / max distance 128 on explicit positions (use_length_as_position=False)
whose key - query distances run from -250 to 299, so every exact and logarithmic bucket and the
distances beyond max_distance are hit; and a small table (16 buckets, max distance 20) with
Praxis' default use_length_as_position=True in training, where the positions are
arange(query_len) and arange(key_len) whatever is passed. The cotangent's entries are multiples of
1/8, so the gradient (sums of many of them) is exact in float32 in any order.

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/praxis/relative_bias/generate.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, pax_fiddle  # noqa: E402
from praxis.layers import attentions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N = 3
Q_T5 = np.stack([np.arange(6) * 50, np.arange(6) * 50 + 3]).astype(np.int32)
K_T5 = np.stack([np.arange(300), np.arange(300) + 1]).astype(np.int32)
Q_SMALL = np.arange(6, dtype=np.int32)[None]
K_SMALL = np.arange(9, dtype=np.int32)[None]
# name: (bidirectional, num_buckets, max_distance, use_length_as_position, query_pos, key_pos)
CASES = {
    "t5_bidirectional": (True, 32, 128, False, Q_T5, K_T5),
    "t5_causal": (False, 32, 128, False, Q_T5, K_T5),
    "small_bidirectional_lengths": (True, 16, 20, True, Q_SMALL, K_SMALL),
    "small_causal_lengths": (False, 16, 20, True, Q_SMALL, K_SMALL),
}


def main() -> None:
    rng = np.random.default_rng(0)
    out = {}
    for name, (bidirectional, buckets, max_distance, use_length, q, k) in CASES.items():
        layer = base_layer.instantiate(
            pax_fiddle.Config(
                attentions.RelativeBias, name="rb", num_heads=N, relative_attention_num_buckets=buckets,
                relative_attention_max_distance=max_distance, bidirectional=bidirectional,
                use_length_as_position=use_length,
            )
        )  # fmt: skip
        wrb = rng.standard_normal((N, buckets)).astype(np.float32)
        # Multiples of 1/8: the table's gradient sums up to 1800 of them per entry, exactly in float32
        # whatever the summation order (random normals would leave ~1e-6 relative rounding).
        cotangent = (rng.integers(-8, 9, (q.shape[0], N, q.shape[1], k.shape[1])) / 8).astype(np.float32)

        def bias_of(wrb, q=q, k=k, layer=layer):
            return layer.apply({"params": {"wrb": wrb}}, jnp.asarray(q), jnp.asarray(k))

        # do_eval=False: in training, use_length_as_position=True replaces the positions by aranges.
        with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=False)):
            bias, vjp = jax.vjp(bias_of, jnp.asarray(wrb))
            (grad_wrb,) = vjp(jnp.asarray(cotangent))
        assert bias.shape == cotangent.shape, (bias.shape, cotangent.shape)
        out[f"{name}/query_pos"] = q
        out[f"{name}/key_pos"] = k
        out[f"{name}/wrb"] = wrb
        out[f"{name}/bias"] = np.asarray(bias)
        out[f"{name}/cotangent"] = cotangent
        out[f"{name}/grad_wrb"] = np.asarray(grad_wrb)
        print(name, bias.shape)
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
