"""Writes attention.npz here: Praxis' DotProductAttention on padded inputs, with the masks Praxis'
Transformer stack builds without folding (`compute_attention_masks_for_fprop`: the padding mask
merged with the causal and/or segment masks by `merge_masks`), returning (encoded, atten_probs),
and the gradients of <encoded, cotangent> for a random cotangent at every position (the padded
ones, whose rows are fully masked, included) to the input and every weight and bias.

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/layers/praxis_padding/generate_attention.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, pax_fiddle  # noqa: E402
from praxis.layers import attentions, transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, D, N, H = 3, 6, 8, 2, 4
# Right padding, padding inside a row, and left padding (a causal query at position 0 then has
# no key at all, in either mask mode).
PADDINGS = np.asarray([[0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0]], np.float32)
SEGMENT_IDS = np.asarray([[1, 1, 2, 2, 0, 0], [1, 0, 1, 1, 2, 0], [0, 0, 1, 1, 1, 2]], np.int32)
PROJECTIONS = {"q": "query", "k": "key", "v": "value", "o": "post"}
# (causal, segments): the cases the tests of mask_mode="praxis" cover.
CASES = {"causal": (True, False), "causal_segments": (True, True), "segments": (False, True), "keys": (False, False)}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    weights = {name: (rng.standard_normal((D, N, H)) * 0.5).astype(np.float32) for name in ("q", "k", "v", "o")}
    layer = base_layer.instantiate(
        pax_fiddle.Config(
            attentions.DotProductAttention, name="atten", input_dim=D, hidden_dim=N * H, num_heads=N,
            dim_per_head=H, use_bias=True, internal_enable_per_dim_scale=False,
        )
    )  # fmt: skip
    biases = {name: (rng.standard_normal((N, H)) * 0.5).astype(np.float32) for name in ("q", "k", "v")}
    biases["o"] = (rng.standard_normal((D,)) * 0.5).astype(np.float32)
    params = {PROJECTIONS[k]: {"w": weights[k], "b": biases[k]} for k in PROJECTIONS}
    out = dict(x=x, paddings=PADDINGS, segment_ids=SEGMENT_IDS, **{f"w_{k}": v for k, v in weights.items()})
    out.update({f"b_{k}": v for k, v in biases.items()})
    for name, (causal, segments) in CASES.items():
        segment_mask = attentions.segment_mask(jnp.asarray(SEGMENT_IDS)) if segments else None
        mask, _ = transformers.compute_attention_masks_for_fprop(
            jnp.asarray(x), jnp.asarray(PADDINGS), causal_attention=causal, segment_mask=segment_mask
        )
        cotangent = rng.standard_normal((B, T, D)).astype(np.float32)

        def encoded_of(params, x, mask=mask):
            return layer.apply({"params": params}, x, x, x, mask)

        with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
            (encoded, probs), vjp = jax.vjp(encoded_of, params, jnp.asarray(x))
            grads, grad_x = vjp((jnp.asarray(cotangent), jnp.zeros_like(probs)))
        out[f"{name}/encoded"] = np.asarray(encoded)
        out[f"{name}/probs"] = np.asarray(probs)
        out[f"{name}/cotangent"] = cotangent
        out[f"{name}/grad_x"] = np.asarray(grad_x)
        for k, praxis_name in PROJECTIONS.items():
            out[f"{name}/grad_w_{k}"] = np.asarray(grads[praxis_name]["w"])
            out[f"{name}/grad_b_{k}"] = np.asarray(grads[praxis_name]["b"])
        print(name, "done")
    np.savez(os.path.join(HERE, "attention.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
