"""Writes expected.npz here: Praxis 1.4's local and relative-position attention layers
(`layers.attentions`) on one small batch, their initialised weights, outputs and gradients.

Cases (CASES below; each Praxis class at least once):

  local_causal            LocalSelfAttention, left_context 4, right_context 0 (causal), blocks of 3
  local_bidirectional     LocalSelfAttention, left_context 3, right_context 2, blocks of 3
  relative_bias_causal    LocalSelfAttentionRelativeBias, 4 / 0, blocks of 3
  relative_bias_bidir     LocalSelfAttentionRelativeBias, 3 / 2, blocks of 3
  alibi_causal            LocalSelfAttentionAlibi, 4 / 0, blocks of 3
  alibi_bidirectional     LocalSelfAttentionAlibi, 3 / 2, blocks of 3
  local_xl_causal         LocalSelfAttentionXL, 4 / 0, blocks of 3, use_bias (u, v, projection biases)
  local_xl_bidirectional  LocalSelfAttentionXL, 3 / 2, blocks of 3, no biases
  xl_causal               DotProductAttentionXL, a causal mask, use_bias, PerDimScale
  xl_bidirectional        DotProductAttentionXL, no causal mask, no biases

Every layer is 4 heads of 4 over a width of 16 (4 heads: Praxis' ALiBi slopes fail for a head
count that is not a power of two), the XL ones with a relative embedding of 8 dims. The batch is
2 rows of 10 tokens; row 1 is padded at position 0 and at 8, 9 (the mask is Praxis' key padding
mask, [B, 1, 1, T], merged with the causal one for xl_causal). 10 tokens in blocks of 3 leave the
last block with 2 positions past the sequence, which Praxis pads. PerDimScale is off except in
xl_causal (1 / sqrt(4) then).

Recorded per case, under "<case>/": `x` [B, T, D], `paddings` [B, T], `params/<Praxis name>`
(every variable as Praxis initialised it, then moved off its init by a small random amount so
that zero biases, u and v matter), `out` [B, T, D] (Praxis' fprop), `cotangent` (random at the real
positions, 0 at the padded ones), `grad_x` and `grad/<Praxis name>` (the gradient of
<out, cotangent>), and `meta`, a JSON string of the layer's settings.

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /work/paxenv/bin/python /path/to/tests/praxis/local_attention/generate.py
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, pax_fiddle  # noqa: E402
from praxis.layers import attentions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, D, N, H, REL = 2, 10, 16, 4, 4, 8
PADDINGS = np.zeros((B, T), np.float32)
PADDINGS[1, [0, 8, 9]] = 1.0

LOCAL = {
    "LocalSelfAttention": attentions.LocalSelfAttention,
    "LocalSelfAttentionRelativeBias": attentions.LocalSelfAttentionRelativeBias,
    "LocalSelfAttentionAlibi": attentions.LocalSelfAttentionAlibi,
    "LocalSelfAttentionXL": attentions.LocalSelfAttentionXL,
    "DotProductAttentionXL": attentions.DotProductAttentionXL,
}
# name: (class, left_context, right_context, use_bias, per_dim_scale, causal mask (global XL only))
CASES = {
    "local_causal": ("LocalSelfAttention", 4, 0, False, False, False),
    "local_bidirectional": ("LocalSelfAttention", 3, 2, True, False, False),
    "relative_bias_causal": ("LocalSelfAttentionRelativeBias", 4, 0, False, False, False),
    "relative_bias_bidir": ("LocalSelfAttentionRelativeBias", 3, 2, False, False, False),
    "alibi_causal": ("LocalSelfAttentionAlibi", 4, 0, False, False, False),
    "alibi_bidirectional": ("LocalSelfAttentionAlibi", 3, 2, False, False, False),
    "local_xl_causal": ("LocalSelfAttentionXL", 4, 0, True, False, False),
    "local_xl_bidirectional": ("LocalSelfAttentionXL", 3, 2, False, False, False),
    "xl_causal": ("DotProductAttentionXL", 0, 0, True, True, True),
    "xl_bidirectional": ("DotProductAttentionXL", 0, 0, False, False, False),
}
BLOCK = 3


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "/"))
        else:
            out[name] = np.asarray(v)
    return out


def unflatten(flat):
    tree = {}
    for name, v in flat.items():
        node = tree
        *path, leaf = name.split("/")
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def make_layer(cls_name, left, right, use_bias, per_dim_scale):
    kw = dict(
        name="atten", input_dim=D, hidden_dim=N * H, num_heads=N, dim_per_head=H, use_bias=use_bias,
        internal_enable_per_dim_scale=per_dim_scale,
    )  # fmt: skip
    if cls_name != "DotProductAttentionXL":
        kw.update(block_size=BLOCK, left_context=left, right_context=right)
    if cls_name.endswith("XL"):
        kw.update(rel_pos_emb_dim=REL)
    return base_layer.instantiate(pax_fiddle.Config(LOCAL[cls_name], **kw))


def main() -> None:
    rng = np.random.default_rng(0)
    out = {}
    for case, (cls_name, left, right, use_bias, per_dim_scale, causal) in CASES.items():
        layer = make_layer(cls_name, left, right, use_bias, per_dim_scale)
        x = rng.standard_normal((B, T, D)).astype(np.float32)
        mask = attentions.convert_paddings_to_mask(jnp.asarray(PADDINGS))
        if causal:
            mask = jnp.minimum(mask, attentions.causal_mask(jnp.asarray(x)))
        ctx = base_layer.JaxContext.HParams(do_eval=True)
        with base_layer.JaxContext.new_context(hparams=ctx):
            variables = layer.init(jax.random.PRNGKey(len(out)), x, x, x, mask)
        params = flatten(variables["params"])
        # Off the init: zero biases, u, v and the per-dim scale would hide a misplaced term.
        params = {k: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in params.items()}
        cotangent = rng.standard_normal((B, T, D)).astype(np.float32) * (1.0 - PADDINGS)[..., None]

        def fprop(p, x, layer=layer, mask=mask, hparams=ctx):
            with base_layer.JaxContext.new_context(hparams=hparams):
                encoded, _ = layer.apply({"params": unflatten(p)}, x, x, x, mask)
            return encoded

        encoded, vjp = jax.vjp(fprop, {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x))
        grad_params, grad_x = vjp(jnp.asarray(cotangent))
        meta = dict(
            cls=cls_name, left_context=left, right_context=right, use_bias=use_bias, per_dim_scale=per_dim_scale,
            causal=causal or (cls_name != "DotProductAttentionXL" and right == 0), block_size=BLOCK,
            rel_pos_emb_dim=REL if cls_name.endswith("XL") else 0, num_heads=N, dim_per_head=H,
        )  # fmt: skip
        out[f"{case}/meta"] = np.array(json.dumps(meta))
        out[f"{case}/x"] = x
        out[f"{case}/paddings"] = PADDINGS
        out[f"{case}/out"] = np.asarray(encoded)
        out[f"{case}/cotangent"] = cotangent
        out[f"{case}/grad_x"] = np.asarray(grad_x)
        for k, v in params.items():
            out[f"{case}/params/{k}"] = v
            out[f"{case}/grad/{k}"] = np.asarray(grad_params[k])
        print(case, {k: v.shape for k, v in params.items()})
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
