"""LanguageModel: forward shapes, loss metrics against the formula, extend_step == forward, decoding."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode
from pax_eqx.models import (
    GreedyStrategy,
    LanguageModelConfig,
    SampleConfig,
    SampleStrategy,
    filter_logits,
    generate,
    sample,
)
from pax_eqx.models.language_model_decoder import LanguageModelDecoder
from pax_eqx.models.sampler import Draw, draw_tokens


def tiny(**kw) -> LanguageModelConfig:
    base = dict(vocab_size=13, max_seq_len=32, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4)
    return LanguageModelConfig(**{**base, **kw})


@pytest.mark.parametrize("repeat", [True, False])
@pytest.mark.parametrize(
    "position, kv_heads",
    [(p, kv) for p in ("trainable", "sinusoidal", "rotary") for kv in (0, 1, 2)] + [("relative_bias", 2)],
)
def test_extend_step_matches_full_forward(repeat, position, kv_heads):
    model = tiny(repeat=repeat, position_embedding=position, num_kv_heads=kv_heads).build(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, 13)
    full, _ = model(ids, Context(mode=Mode.EVAL))
    cache = model.init_cache(2, 12)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    valid = jnp.ones((2, 12), bool)
    got, cache = model.extend_step(ids[:, :5], cache, jnp.int32(0), positions[:, :5], valid)
    steps = [got]
    for t in range(5, 9):
        logits, cache = model.extend_step(ids[:, t : t + 1], cache, jnp.int32(t), positions[:, t : t + 1], valid)
        steps.append(logits)
    assert_same_math(jnp.concatenate(steps, axis=1), full)


def test_relative_bias_is_each_layers_own_table_of_causal_buckets():
    """position_embedding='relative_bias': each layer's attention adds table[bucket(k - q)] to its
    logits (T5's causal bucketing, Praxis' per-layer RelativeBias): the layer equals the same
    layer without a table given that bias explicitly."""
    from pax_eqx.layers.relative_position_bias import relative_position_bucket

    model = tiny(repeat=False, position_embedding="relative_bias").build(jax.random.key(0))
    tables = [layer.attention.relative_bias.embedding for layer in model.stack.layers]
    assert tables[0].shape == (32, 4) and not np.array_equal(tables[0], tables[1])
    attention = model.stack.layers[1].attention
    t = 7
    relative = jnp.arange(t)[None, :] - jnp.arange(t)[:, None]
    buckets = relative_position_bucket(relative, bidirectional=False, num_buckets=32, max_distance=128)
    bias = jnp.transpose(tables[1][buckets], (2, 0, 1))[None]  # [1, heads, q, k]
    x = jax.random.normal(jax.random.key(2), (2, t, 16))
    plain = eqx.tree_at(lambda a: a.relative_bias, attention, None, is_leaf=lambda v: v is None)
    ctx = Context(mode=Mode.EVAL)
    assert_same_math(attention(x, ctx)[0], plain(x, ctx, bias=bias)[0])


def test_relative_bias_in_packed_rows_is_each_documents_own():
    """Index differences stand for position differences (Praxis' use_length_as_position): a row
    packing two documents gives each the logits it has alone."""
    model = tiny(position_embedding="relative_bias").build(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (1, 9), 0, 13)
    segment_ids = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2]])
    segment_pos = jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    ctx = Context(mode=Mode.EVAL)
    packed, _ = model(ids, ctx, segment_ids=segment_ids, segment_pos=segment_pos)
    first, _ = model(ids[:, :4], ctx)
    second, _ = model(ids[:, 4:], ctx)
    assert_same_math(packed, jnp.concatenate([first, second], axis=1))


def test_compute_loss_matches_formula():
    model = tiny(separate_embedding=True).build(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 6), 0, 13)
    labels = jnp.roll(ids, -1, axis=1)
    weights = jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], jnp.float32)
    logits, _ = model(ids, Context(mode=Mode.EVAL))
    m = {k: v.value for k, v in model.metrics_from_logits(logits, labels, weights).items()}
    lp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))
    xent = -np.take_along_axis(lp, np.asarray(labels)[..., None], -1)[..., 0]
    w = np.asarray(weights)
    expected = (xent * w).sum() / w.sum()
    np.testing.assert_allclose(m["avg_xent"], expected, rtol=1e-5)
    np.testing.assert_allclose(m["log_pplx"], expected, rtol=1e-5)
    acc = ((np.asarray(logits).argmax(-1) == np.asarray(labels)) * w).sum() / w.sum()
    np.testing.assert_allclose(m["accuracy"], acc, rtol=1e-6)
    assert float(model.metrics_from_logits(logits, labels, weights)["avg_xent"].weight) == 8.0


@pytest.mark.parametrize(
    "kw, chunk",  # 3 divides the 9 positions; 4 and 16 pad them
    [(dict(), 3), (dict(separate_embedding=True, soft_cap_logits=5.0), 4), (dict(label_smoothing_prob=0.1), 16)],
    ids=["tied", "separate-softcap", "smoothing"],
)
def test_chunked_loss_equals_the_whole_sequence_loss_and_its_gradients(kw, chunk):
    """`model.loss_chunk_size` computes each chunk's logits separately (and again in the backward):
    metrics and gradients must be those of the logits of the whole sequence at once."""
    whole = tiny(**kw).build(jax.random.key(0))
    chunked = tiny(loss_chunk_size=chunk, **kw).build(jax.random.key(0))  # same key: same weights
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, 13)
    labels = jnp.roll(ids, -1, axis=1)
    weights = jnp.ones((2, 9), jnp.float32).at[1, 6:].set(0.0)

    batch = {"ids": ids, "labels": labels, "weights": weights}

    def total(model):
        x, _ = model.compute_predictions(batch, Context(mode=Mode.EVAL))
        metrics = model.compute_loss(x, batch)
        return metrics["avg_xent"].value, metrics

    grad = eqx.filter_jit(eqx.filter_value_and_grad(total, has_aux=True))
    (loss_w, m_w), g_w = grad(whole)
    (loss_c, m_c), g_c = grad(chunked)
    logits, _ = whole(ids, Context(mode=Mode.EVAL))  # and both equal compute_loss on full logits
    direct = whole.metrics_from_logits(logits, labels, weights)
    for key in direct:
        assert_same_math_tree(m_w[key], direct[key], err_msg=key)
        assert_same_math_tree(m_c[key], direct[key], err_msg=key)
    assert float(m_c["avg_xent"].weight) == 15.0
    assert_same_math_tree(g_c, g_w, rtol=2e-5)


def test_negative_loss_chunk_size_names_the_field():
    with pytest.raises(ValueError, match="model.loss_chunk_size must be >= 0"):
        tiny(loss_chunk_size=-1).build(jax.random.key(0))


def test_sequence_longer_than_max_position_fails_clearly():
    model = tiny(max_seq_len=8).build(jax.random.key(0))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(jnp.zeros((1, 9), jnp.int32), Context(mode=Mode.EVAL))


def test_filter_logits_top_k_and_top_p_against_numpy():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = np.isfinite(np.asarray(filter_logits(logits, 2, 1.0))) & (np.asarray(filter_logits(logits, 2, 1.0)) > -1e30)
    assert kept.tolist() == [[True, True, False, False, False]]
    # Nucleus 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 is needed too; 0.1 is not.
    out = np.asarray(filter_logits(logits, 0, 0.8))
    assert (out > -1e30).tolist() == [[True, True, True, False, False]]


def _train_copy_model(pattern: list[int], steps: int = 200):
    """A tiny LM trained on a repeating pattern, with plain optax (no pax_eqx learner)."""
    cfg = tiny(vocab_size=8, num_layers=1, max_seq_len=32)
    model = cfg.build(jax.random.key(0))
    # Every rotation of the pattern, so the model must read the context, not the position.
    seqs = jnp.array([(pattern[r:] + pattern[:r]) * 4 for r in range(len(pattern))])[:, :17]
    ids, labels = seqs[:, :-1], seqs[:, 1:]
    opt = optax.adam(1e-2)
    params, static = eqx.partition(model, eqx.is_array)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state):
        def loss_fn(p):
            m = eqx.combine(p, static)
            logits, _ = m(ids, Context(mode=Mode.TRAIN))
            return m.metrics_from_logits(logits, labels, jnp.ones_like(labels, jnp.float32))["avg_xent"].value

        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state)
    assert float(loss) < 0.05
    return eqx.combine(params, static)


def test_greedy_decode_reproduces_a_learned_pattern():
    pattern = [1, 2, 3, 4, 5]
    model = _train_copy_model(pattern)
    greedy = SampleConfig(max_new_tokens=7, strategy=GreedyStrategy())
    out = generate(model, [[1, 2, 3], [4, 5]], greedy, jax.random.key(0))
    assert out[0] == [4, 5, 1, 2, 3, 4, 5]
    assert out[1] == [1, 2, 3, 4, 5, 1, 2]
    # Batched prompts of different lengths give what each prompt gives alone.
    alone = generate(model, [[4, 5]], greedy, jax.random.key(0))
    assert alone[0] == out[1]
    # EOS stops the row: everything from the first 1 onwards is cut.
    stopped = generate(model, [[4, 5]], greedy.replace(eos_id=1), jax.random.key(0))
    assert stopped[0] == []
    stopped = generate(model, [[1, 2]], greedy.replace(eos_id=5), jax.random.key(0))
    assert stopped[0] == [3, 4]


def test_sampling_is_seeded_and_respects_top_k():
    model = tiny().build(jax.random.key(0))
    cfg = SampleConfig(max_new_tokens=6, strategy=SampleStrategy(temperature=1.0, top_k=1))
    greedy = generate(model, [[1, 2]], SampleConfig(max_new_tokens=6, strategy=GreedyStrategy()), jax.random.key(0))
    assert generate(model, [[1, 2]], cfg, jax.random.key(3)) == greedy  # top-1 sampling is greedy
    cold = SampleConfig(max_new_tokens=6, strategy=SampleStrategy(temperature=0.0))
    assert generate(model, [[1, 2]], cold, jax.random.key(3)) == greedy  # and so is temperature 0
    cfg = SampleConfig(max_new_tokens=6, strategy=SampleStrategy(temperature=1.0))
    a = generate(model, [[1, 2]], cfg, jax.random.key(3))
    assert a == generate(model, [[1, 2]], cfg, jax.random.key(3))


_SAMPLER_TRACES = []


class _CountedDecoder(LanguageModelDecoder):
    """A language model's decoder that counts how often the sampler traces it (once per compile)."""

    def start(self):
        _SAMPLER_TRACES.append(1)
        return super().start()


def test_a_new_temperature_top_p_or_eos_id_reuses_the_compiled_sampler():
    """Only what shapes the program is static in the sampler (`sampler.draw_tokens`: greedy or
    not, top-k's k, top-p on or off, lengths); the temperature, top-p and EOS id are traced (a
    `Draw`'s arrays), so a decode sweeping them compiles once. Each still takes effect: the first
    token is drawn from softmax(filtered logits / temperature), and a row stops at its EOS."""
    model = tiny().build(jax.random.key(0))
    decoder = _CountedDecoder.from_prompts(model, [[1, 2], [3]], 6)
    logits = decoder.start()[0].astype(jnp.float32)
    key = jax.random.key(5)
    _SAMPLER_TRACES.clear()
    for temperature, top_p in [(1.0, 0.9), (0.5, 0.6), (2.0, 0.99)]:
        cfg = SampleConfig(max_new_tokens=6, strategy=SampleStrategy(temperature=temperature, top_p=top_p))
        tokens, _ = sample(decoder, cfg, key)
        expected = jax.random.categorical(
            jax.random.split(key)[1], filter_logits(logits / temperature, 0, top_p), axis=-1
        )
        np.testing.assert_array_equal(tokens[:, 0], expected)
    assert len(_SAMPLER_TRACES) == 1
    first = int(tokens[0, 0])
    cfg = SampleConfig(max_new_tokens=6, eos_id=first, strategy=SampleStrategy(temperature=2.0, top_p=0.99))
    stopped, _ = sample(decoder, cfg, key)
    assert int(stopped[0, 0]) == first and (np.asarray(stopped[0, 1:]) == 0).all()  # pads after the EOS
    assert len(_SAMPLER_TRACES) == 1
    # `sample` is the strategy's Draw in sampler.draw_tokens: called directly, the same program.
    direct, _ = draw_tokens(decoder, Draw.of(temperature=2.0, top_k=0, top_p=0.99, eos_id=first), key, 0, 6)
    np.testing.assert_array_equal(direct, stopped)
    assert len(_SAMPLER_TRACES) == 1


def test_bad_sample_config_is_reported():
    model = tiny().build(jax.random.key(0))
    with pytest.raises(ValueError, match=re.escape("decode.top_p must be in (0, 1]")):
        generate(model, [[1]], SampleConfig(strategy=SampleStrategy(top_p=0.0)), jax.random.key(0))
    # top_p is the sampling strategy's field, no longer SampleConfig's: a flat one is refused by name.
    with pytest.raises(ConfigError, match="SampleConfig has no field 'top_p'"):
        SampleConfig(top_p=0.9)


def test_generation_longer_than_the_position_table_slides_a_window():
    model = tiny(max_seq_len=8).build(jax.random.key(0))
    cfg = SampleConfig(max_new_tokens=20, strategy=GreedyStrategy())
    out = generate(model, [[1, 2, 3]], cfg, jax.random.key(0))
    assert len(out[0]) == 20
    # The first window is an ordinary generation from the (cropped) prompt.
    first = generate(model, [[1, 2, 3][-4:]], cfg.replace(max_new_tokens=4), jax.random.key(0))
    assert out[0][:4] == first[0]
