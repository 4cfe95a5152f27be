"""Local and relative-position attention against Praxis 1.4 itself, and against a dense masked
numpy formula.

local_attention/expected.npz is written by local_attention/generate.py in Praxis' environment:
LocalSelfAttention (causal, and with a right context), LocalSelfAttentionRelativeBias,
LocalSelfAttentionAlibi and LocalSelfAttentionXL (each causal and bidirectional, blocks of 3 over
10 tokens), and DotProductAttentionXL (causal with PerDimScale and biases, bidirectional without):
their weights, outputs, and the gradients of <output, cotangent> to the input and every weight
(outputs within 1e-5; gradients, up to ~35 here, within 1e-5 of their largest entry).
Each loads into pax_eqx's Attention: a sliding window (left_context, right_context: Praxis' own
meaning), causal when Praxis' right_context is 0, and the position term of the class --
`relative_bias` (a T5 bias with a bucket per distance), `position_bias` alibi or xl.

Padded positions. Praxis' LocalSelfAttention masks the padded keys ([B, 1, 1, T]), as pax_eqx's
mask_mode "pax_eqx" does, and computes attention a block at a time, padding the sequence to whole
blocks with keys no query may see. Every real position matches (within 1e-5), and so does every
padded query whose window holds a real key. A padded query whose window holds none (here row 1's
position 0) has a softmax over masked logits only: uniform over Praxis' block context (the block's
padding included: zeros) and over every key here; those two rows differ, nothing real reads them,
and no gradient flows through them in either (the cotangent is 0 there, as it is at every padded
position).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.layers import AttentionConfig, Context, Mode, RelativePositionBiasConfig
from pax_eqx.layers.attention_position_bias import AlibiConfig, TransformerXLConfig, alibi_slopes
from pax_eqx.layers.attention_window import GlobalWindowConfig, SlidingWindowConfig

EXPECTED = np.load(Path(__file__).resolve().parent / "local_attention" / "expected.npz")
CASES = sorted({k.split("/", 1)[0] for k in EXPECTED})
ATOL = 1e-5


def _case(name: str) -> tuple[dict, dict]:
    e = {k.split("/", 1)[1]: v for k, v in EXPECTED.items() if k.startswith(name + "/")}
    return json.loads(str(e.pop("meta"))), e


def _buckets(meta: dict) -> RelativePositionBiasConfig:
    """A T5 bias with a bucket of its own for every distance the window lets through."""
    left, right = meta["left_context"], meta["right_context"]
    exact = max(left, right + 1)
    return RelativePositionBiasConfig(num_buckets=2 * exact if meta["causal"] else 4 * exact, max_distance=4 * exact)


def _praxis_relative_index(meta: dict, d: np.ndarray) -> np.ndarray:
    """The column of Praxis' [heads, L + R + 2 (W - 1)] table that key - query distance d reads."""
    left, right, w = meta["left_context"], meta["right_context"], meta["block_size"]
    return (d + left + w - 3) % (left + right + 2 * (w - 1))


def _in_window(meta: dict) -> np.ndarray:
    """The key - query distances the window lets through."""
    return np.arange(-(meta["left_context"] - 1), meta["right_context"] + 1)


def _build(meta: dict, p: dict):
    """pax_eqx's Attention with Praxis' weights."""
    local = meta["cls"] != "DotProductAttentionXL"
    window = GlobalWindowConfig()
    if local:
        window = SlidingWindowConfig(left_context=meta["left_context"], right_context=meta["right_context"])
    position_bias = {"LocalSelfAttentionAlibi": AlibiConfig()}.get(meta["cls"])
    if meta["cls"].endswith("XL"):
        position_bias = TransformerXLConfig(embedding_dims=meta["rel_pos_emb_dim"], content_bias=meta["use_bias"])
    cfg = AttentionConfig(
        implementation="xla", causal=meta["causal"], use_bias=meta["use_bias"], per_dim_scale=meta["per_dim_scale"],
        window=window,
        **({"position_bias": position_bias} if position_bias is not None else {}),
    )  # fmt: skip
    relative = _buckets(meta) if meta["cls"] == "LocalSelfAttentionRelativeBias" else None
    n, h = meta["num_heads"], meta["dim_per_head"]
    d = p["query/w"].shape[0]
    # The structure only (no init: each eager random op would compile); every array is Praxis'.
    att = eqx.filter_eval_shape(
        lambda key: cfg.build(key, input_dims=d, num_heads=n, dim_per_head=h, relative_bias=relative),
        jax.random.key(0),
    )
    a = jnp.asarray
    att = eqx.tree_at(lambda m: (m.w_q, m.w_k, m.w_v), att, (a(p["query/w"]), a(p["key/w"]), a(p["value/w"])))
    att = eqx.tree_at(lambda m: m.w_o, att, a(p["post/w"].transpose(1, 2, 0)))
    if meta["use_bias"]:
        biases = (a(p["query/b"]), a(p["key/b"]), a(p["value/b"]), a(p["post/b"]))
        att = eqx.tree_at(lambda m: (m.b_q, m.b_k, m.b_v, m.b_o), att, biases)
    if meta["per_dim_scale"]:
        att = eqx.tree_at(lambda m: m.per_dim_scale, att, a(p["per_dim_scale/per_dim_scale"]))
    if meta["cls"].endswith("XL"):
        att = eqx.tree_at(lambda m: m.position_bias.w_pos, att, a(p["pos_proj/w"]))
        if meta["use_bias"]:
            att = eqx.tree_at(lambda m: (m.position_bias.u, m.position_bias.v), att, (a(p["u"]), a(p["v"])))
    if relative is not None:
        table = np.zeros(att.relative_bias.embedding.shape, np.float32)
        d = _in_window(meta)
        buckets = np.asarray(_table_buckets(meta, relative, d))
        table[buckets] = p["pos_emb_compressed"][:, _praxis_relative_index(meta, d)].T
        att = eqx.tree_at(lambda m: m.relative_bias.embedding, att, a(table))
    assert not any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(att)), "a weight left unset"
    return att


def _table_buckets(meta: dict, cfg: RelativePositionBiasConfig, d: np.ndarray) -> np.ndarray:
    """T5's bucket of each key - query distance d in the window: its exact ones (n = -d < num_buckets
    / 2 causal; bidirectional, keys after the query in the upper half), one per distance."""
    if meta["causal"]:
        return -d
    return np.where(d > 0, cfg.num_buckets // 2 + d, -d)


def _forward_and_grads(att, x, paddings, cotangent):
    """The output, and the gradients of <output, cotangent> to the layer and to x: one program,
    compiled without XLA's backend optimisations (the same numbers, a faster compile)."""
    params, static = eqx.partition(att, eqx.is_array)
    run = lambda params, *inputs: _objective_and_grads(eqx.combine(params, static), *inputs)
    return jax.jit(run, compiler_options={"xla_backend_optimization_level": 0})(params, x, paddings, cotangent)


def _objective_and_grads(att, x, paddings, cotangent):

    def objective(att_and_x):
        att, x = att_and_x
        y, _ = att(x, Context(mode=Mode.EVAL), paddings=paddings)
        return jnp.sum(y * cotangent), y

    (_, y), grads = eqx.filter_value_and_grad(objective, has_aux=True)((att, x))
    return y, grads


def _mask(meta: dict, paddings: np.ndarray) -> np.ndarray:
    """[B, T, T]: query t sees key s, written from the definitions pair by pair."""
    b, t = paddings.shape
    local = meta["cls"] != "DotProductAttentionXL"
    m = np.zeros((b, t, t), bool)
    for bi in range(b):
        for i in range(t):
            for j in range(t):
                ok = paddings[bi, j] == 0
                if meta["causal"]:
                    ok &= j <= i
                if local:
                    ok &= i - meta["left_context"] < j <= i + meta["right_context"]
                m[bi, i, j] = ok
    return m


def _sinusoid(d: np.ndarray, dims: int) -> np.ndarray:
    """[len(d), dims] float64: Praxis' PositionalEmbedding of each d, [sin(d / 10^(4 i / (n - 1))),
    cos(...)] for i < n = dims / 2 (dims even here)."""
    inv = np.exp(np.arange(dims // 2) * -(math.log(1e4) / max(dims // 2 - 1, 1)))
    angle = d[:, None] * inv[None]
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


def _numpy_reference(meta: dict, p: dict, x: np.ndarray, paddings: np.ndarray) -> np.ndarray:
    """The layer as a dense masked formula in float64, from Praxis' weights and the papers:
    logits = q' . k + term(t, s) with q' the scaled query, then softmax over the visible keys."""
    f = lambda name: np.asarray(p[name], np.float64)
    x = np.asarray(x, np.float64)
    q, k, v = (np.einsum("btd,dnh->btnh", x, f(f"{n}/w")) for n in ("query", "key", "value"))
    if meta["use_bias"]:
        q, k, v = q + f("query/b"), k + f("key/b"), v + f("value/b")
    h = q.shape[-1]
    if meta["per_dim_scale"]:
        q = q * (1.442695041 / math.sqrt(h) * np.log1p(np.exp(f("per_dim_scale/per_dim_scale"))))
    else:
        q = q / math.sqrt(h)
    t = x.shape[1]
    ti, si = np.arange(t)[:, None], np.arange(t)[None, :]  # query t, key s
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    if meta["cls"] == "LocalSelfAttentionRelativeBias":
        logits = logits + f("pos_emb_compressed")[:, _praxis_relative_index(meta, si - ti)][None]
    if meta["cls"] == "LocalSelfAttentionAlibi":
        logits = logits + alibi_slopes(q.shape[2]).astype(np.float64)[None, :, None, None] * (si - ti)
    if meta["cls"].endswith("XL"):
        r = np.einsum("de,enh->dnh", _sinusoid(np.arange(-(t - 1), t), meta["rel_pos_emb_dim"]), f("pos_proj/w"))
        qu, qv = (q + f("u"), q + f("v")) if meta["use_bias"] else (q, q)
        by_distance = np.einsum("btnh,dnh->bntd", qv, r)
        which = np.broadcast_to((ti - si) + t - 1, by_distance.shape[:3] + (t,))
        logits = np.einsum("btnh,bsnh->bnts", qu, k) + np.take_along_axis(by_distance, which, axis=-1)
    mask = _mask(meta, paddings)[:, None]
    logits = np.where(mask, logits, -1e30)  # a row without a key: uniform (not compared)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = probs / probs.sum(-1, keepdims=True)
    out = np.einsum("bnts,bsnh->btnh", probs, v)
    y = np.einsum("btnh,dnh->btd", out, f("post/w"))
    return y + f("post/b") if meta["use_bias"] else y


def _close_grad(ours, theirs) -> None:
    """Within 1e-5 of the gradient's own scale: each entry sums B x T products, so its float32
    rounding grows with its size (the largest here are ~35; the differences seen ~1e-5 there)."""
    theirs = np.asarray(theirs)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL * max(1.0, float(np.abs(theirs).max())))


@pytest.mark.parametrize("case", CASES)
def test_praxis_local_attention(case):
    meta, e = _case(case)
    p = {k.removeprefix("params/"): v for k, v in e.items() if k.startswith("params/")}
    att = _build(meta, p)
    x, paddings, cotangent = jnp.asarray(e["x"]), jnp.asarray(e["paddings"]), jnp.asarray(e["cotangent"])
    y, (grads, grad_x) = _forward_and_grads(att, x, paddings, cotangent)
    y = np.asarray(y)

    # Every position whose window holds a real key: the real ones and most padded ones.
    live = _mask(meta, e["paddings"]).any(-1)
    assert live.sum() >= 18 and (e["paddings"][~live] == 1).all()
    np.testing.assert_allclose(y[live], e["out"][live], rtol=0, atol=ATOL)
    np.testing.assert_allclose(_numpy_reference(meta, p, e["x"], e["paddings"])[live], e["out"][live], atol=ATOL)

    _close_grad(grad_x, e["grad_x"])
    g = {k.removeprefix("grad/"): v for k, v in e.items() if k.startswith("grad/")}
    _close_grad(grads.w_q, g["query/w"])
    _close_grad(grads.w_k, g["key/w"])
    _close_grad(grads.w_v, g["value/w"])
    _close_grad(grads.w_o, g["post/w"].transpose(1, 2, 0))
    if meta["use_bias"]:
        ours = (grads.b_q, grads.b_k, grads.b_v, grads.b_o)
        for mine, theirs in zip(ours, ("query/b", "key/b", "value/b", "post/b"), strict=True):
            _close_grad(mine, g[theirs])
    if meta["per_dim_scale"]:
        _close_grad(grads.per_dim_scale, g["per_dim_scale/per_dim_scale"])
    if meta["cls"].endswith("XL"):
        _close_grad(grads.position_bias.w_pos, g["pos_proj/w"])
        if meta["use_bias"]:
            _close_grad(grads.position_bias.u, g["u"])
            _close_grad(grads.position_bias.v, g["v"])
    if meta["cls"] == "LocalSelfAttentionRelativeBias":
        d = _in_window(meta)
        buckets = np.asarray(_table_buckets(meta, _buckets(meta), d))
        used = _praxis_relative_index(meta, d)
        table_grad = np.asarray(grads.relative_bias.embedding)[buckets].T
        _close_grad(table_grad, g["pos_emb_compressed"][:, used])
        # Praxis' other columns are never read inside the window: their gradient is 0.
        unused = np.setdiff1d(np.arange(g["pos_emb_compressed"].shape[1]), used)
        assert not g["pos_emb_compressed"][:, unused].any()
