"""A language model whose every layer attends through a sliding window decodes against rolling
caches (memory bounded by the window): `generate` continues prompts to 3x the window as greedy
decoding of the whole-sequence forward would, and the caches hold the window, not the sequence."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.layers import AttentionConfig, Context, Mode, SlidingWindowConfig, TransformerConfig
from pax_eqx.layers.attention_position_bias import AlibiConfig, TransformerXLConfig
from pax_eqx.models import GreedyStrategy, LanguageModelConfig, SampleConfig, generate

WINDOW = 4
POSITION_TERMS = {"alibi": AlibiConfig(), "xl": TransformerXLConfig(embedding_dims=8)}


def filled(cfg):
    """`cfg.build`'s model with every weight drawn by numpy (N(0, 0.3^2)): its structure from
    `eval_shape`, so no init program or eager op is compiled (any weights serve the comparison)."""
    rng = np.random.default_rng(0)
    fill = lambda a: jnp.asarray(rng.standard_normal(a.shape) * 0.3, a.dtype)
    abstract = eqx.filter_eval_shape(cfg.build, jax.random.key(0))
    return jax.tree.map(lambda a: fill(a) if isinstance(a, jax.ShapeDtypeStruct) else a, abstract)


def windowed(repeat: bool, terms: str):
    attention = AttentionConfig(
        window=SlidingWindowConfig(left_context=WINDOW), position_bias=POSITION_TERMS[terms], implementation="xla"
    )
    cfg = LanguageModelConfig(
        vocab_size=13, max_seq_len=16, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4, num_kv_heads=2,
        position_embedding="none", repeat=repeat, block=TransformerConfig(attention=attention),
    )  # fmt: skip
    return filled(cfg)


def test_generate_with_rolling_caches_is_greedy_decoding_of_the_forward():
    """Prompts of 5 and 3 tokens (left-padded together) continued by 7 through a scanned stack of
    Transformer-XL layers: each new token is the argmax of the forward's logits over prompt +
    continuation at the position before it. (A list stack's caches, with ALiBi: the serving test,
    tests/serving/test_engine_window.py.)"""
    model = windowed(repeat=True, terms="xl")
    cache = model.init_cache(2, 12)  # [layers, batch, window, kv heads, head dim]: the window, not 12
    assert cache.k.shape == (2, 2, WINDOW, 2, 4) and cache.index.shape == (2, 2, WINDOW)
    listed = eqx.filter_eval_shape(lambda: windowed(repeat=False, terms="xl").init_cache(2, 12))
    assert all(c.k.shape == (2, WINDOW, 2, 4) for c in listed)

    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    new = generate(
        model, prompts, SampleConfig(max_new_tokens=7, eos_id=-1, strategy=GreedyStrategy()), jax.random.key(0)
    )
    rows = [p + n for p, n in zip(prompts, new, strict=True)]
    ids = np.zeros((2, 12), np.int32)
    valid = np.zeros((2, 12), bool)
    for r, row in enumerate(rows):
        ids[r, 12 - len(row) :], valid[r, 12 - len(row) :] = row, True
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)

    forward = eqx.filter_jit(lambda m, ids, pos, pad: m(ids, Context(mode=Mode.EVAL), segment_pos=pos, paddings=pad)[0])
    logits = forward(model, jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(1.0 - valid, jnp.float32))
    for r, (prompt, continuation) in enumerate(zip(prompts, new, strict=True)):
        first = 12 - len(rows[r]) + len(prompt) - 1  # the prompt's last token predicts the first new one
        assert np.argmax(np.asarray(logits[r, first : first + 7]), axis=-1).tolist() == continuation
