"""Writes attention.npz here: Praxis' DotProductAttention on padded inputs, with the masks Praxis'
Transformer stack builds without folding (`compute_attention_masks_for_fprop`: the padding mask
merged with the causal and/or segment masks by `merge_masks`), returning (encoded, atten_probs).

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
B, T, D, N, H = 2, 6, 8, 2, 4
PADDINGS = np.asarray([[0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 1]], np.float32)
SEGMENT_IDS = np.asarray([[1, 1, 2, 2, 0, 0], [1, 0, 1, 1, 2, 0]], np.int32)
# (causal, segments): the cases the tests of mask_mode="praxis" cover.
CASES = {"causal": (True, False), "causal_segments": (True, True), "segments": (False, True), "keys": (False, False)}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    weights = {name: (rng.standard_normal((D, N, H)) * 0.5).astype(np.float32) for name in ("q", "k", "v", "o")}
    layer = base_layer.instantiate(
        pax_fiddle.Config(
            attentions.DotProductAttention, name="atten", input_dim=D, hidden_dim=N * H, num_heads=N,
            dim_per_head=H, use_bias=False, internal_enable_per_dim_scale=False,
        )
    )  # fmt: skip
    params = {
        "query": {"w": weights["q"]}, "key": {"w": weights["k"]}, "value": {"w": weights["v"]},
        "post": {"w": weights["o"]},
    }  # fmt: skip
    out = dict(x=x, paddings=PADDINGS, segment_ids=SEGMENT_IDS, **{f"w_{k}": v for k, v in weights.items()})
    for name, (causal, segments) in CASES.items():
        segment_mask = attentions.segment_mask(jnp.asarray(SEGMENT_IDS)) if segments else None
        mask, _ = transformers.compute_attention_masks_for_fprop(
            jnp.asarray(x), jnp.asarray(PADDINGS), causal_attention=causal, segment_mask=segment_mask
        )
        with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
            encoded, probs = layer.apply({"params": params}, x, x, x, mask)
        out[f"{name}/encoded"] = np.asarray(encoded)
        out[f"{name}/probs"] = np.asarray(probs)
        print(name, "done")
    np.savez(os.path.join(HERE, "attention.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
