"""Continuous batching of a model whose layers attend through a sliding window (with ALiBi): its
rolling caches (the window's slots, each with the token index it holds; a list stack's, one per
layer) take per-row starts, prompts read in chunks with padded tails, and slots reused by the next
request; greedy outputs equal `generate`'s."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.layers import AttentionConfig, SlidingWindowConfig, TransformerConfig
from pax_eqx.layers.attention_position_bias import AlibiConfig
from pax_eqx.models import GreedyStrategy, LanguageModelConfig, SampleConfig, generate
from pax_eqx.serving.engine import Engine
from pax_eqx.serving.requests import Request


class Letters:
    eos_id = 12

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def filled(cfg):
    """`cfg.build`'s model with every weight drawn by numpy (N(0, 0.3^2)): its structure from
    `eval_shape`, so no init program or eager op is compiled (any weights serve the comparison)."""
    rng = np.random.default_rng(0)
    fill = lambda a: jnp.asarray(rng.standard_normal(a.shape) * 0.3, a.dtype)
    abstract = eqx.filter_eval_shape(cfg.build, jax.random.key(0))
    return jax.tree.map(lambda a: fill(a) if isinstance(a, jax.ShapeDtypeStruct) else a, abstract)


def test_a_windowed_model_serves_what_generate_continues():
    window = SlidingWindowConfig(left_context=3)
    attention = AttentionConfig(window=window, position_bias=AlibiConfig(), implementation="xla")
    cfg = LanguageModelConfig(
        vocab_size=13, max_seq_len=16, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4, repeat=False,
        position_embedding="none", block=TransformerConfig(attention=attention),
    )  # fmt: skip
    model = filled(cfg)
    engine = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5)
    assert engine.state.cache[0].k.shape[:2] == (2, 3)  # [slots, window, ...]: the window, not 16 positions
    prompts = [[1, 2, 3, 4, 5, 6], [4, 5], [2, 9, 4, 1, 0, 6, 7, 3, 8]]
    lengths = [7, 9, 4]
    done = [engine.submit(Request(tuple(p), max_tokens=n, temperature=0.0)) for p, n in zip(prompts, lengths)]
    while engine.busy():
        engine.step()
    cfg = SampleConfig(max_new_tokens=max(lengths), eos_id=-1, strategy=GreedyStrategy())
    expected = generate(model, prompts, cfg, jax.random.key(0))
    for n, c, ref in zip(lengths, done, expected, strict=True):
        assert c.result(timeout=1).text == Letters().decode(ref[:n])
