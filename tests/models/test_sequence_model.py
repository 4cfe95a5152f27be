"""SequenceModel: the loss against its formula, incremental decoding == the teacher-forced forward,
encoder padding, and search on a model trained to copy (greedy, beam 1 == greedy, beam >= greedy)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode
from pax_eqx.models import GreedyStrategy
from pax_eqx.models.beam_search import beam_search
from pax_eqx.models.decoding import SampleConfig, sample
from pax_eqx.models.sequence_model import SequenceModelConfig, SequenceModelDecoder

VOCAB, BOS, EOS, PAD = 12, 2, 3, 0
EVAL = Context(mode=Mode.EVAL)
GREEDY = SampleConfig(eos_id=EOS, strategy=GreedyStrategy())


def tiny(**kw) -> SequenceModelConfig:
    base = dict(
        vocab_size=VOCAB, max_seq_len=16, num_encoder_layers=2, num_decoder_layers=2, model_dims=16, hidden_dims=32,
        num_heads=4,
    )  # fmt: skip
    return SequenceModelConfig(**{**base, **kw})


def make_batch(inputs: np.ndarray, input_lengths, targets: np.ndarray, target_lengths) -> dict:
    """Right-padded rows in the data's format: targets end with EOS, target_ids = [BOS] + targets[:-1]."""
    b, s = inputs.shape
    t = targets.shape[1]
    input_paddings = (np.arange(s)[None] >= np.asarray(input_lengths)[:, None]).astype(np.float32)
    target_paddings = (np.arange(t)[None] >= np.asarray(target_lengths)[:, None]).astype(np.float32)
    inputs = np.where(input_paddings > 0, PAD, inputs).astype(np.int32)
    targets = np.where(target_paddings > 0, PAD, targets).astype(np.int32)
    target_ids = np.concatenate([np.full((b, 1), BOS, np.int32), targets[:, :-1]], axis=1)
    target_ids = np.where(target_paddings > 0, PAD, target_ids).astype(np.int32)
    return dict(
        inputs=inputs, input_paddings=input_paddings, target_ids=target_ids, targets=targets,
        target_paddings=target_paddings,
    )  # fmt: skip


def random_batch(seed=0, b=3, s=7, t=6):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(4, VOCAB, (b, s))
    targets = rng.integers(4, VOCAB, (b, t))
    return make_batch(inputs, [s, 4, 2][:b], targets, [t, 5, 3][:b])


def test_compute_loss_matches_the_formula():
    model = tiny().build(jax.random.key(0))
    batch = random_batch()
    logits, _ = model(batch, EVAL)
    metrics = model.compute_loss(model.compute_predictions(batch, EVAL)[0], batch)
    lp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))
    xent = -np.take_along_axis(lp, batch["targets"][..., None], -1)[..., 0]
    w = 1.0 - batch["target_paddings"]
    np.testing.assert_allclose(metrics["avg_xent"].value, (xent * w).sum() / w.sum(), rtol=1e-5)
    correct = np.asarray(logits).argmax(-1) == batch["targets"]
    np.testing.assert_allclose(metrics["accuracy"].value, (correct * w).sum() / w.sum(), rtol=1e-6)
    assert float(metrics["avg_xent"].weight) == w.sum()


@pytest.mark.parametrize(
    "repeat, position, share",
    [(r, p, False) for r in (True, False) for p in ("relative_bias", "trainable", "rotary")]
    + [(True, "relative_bias", True), (False, "trainable", True)],
)
def test_incremental_decoding_equals_the_teacher_forced_forward(repeat, position, share):
    """The decoder fed target_ids one token at a time (encoder once, cross-attention keys/values
    projected once, a self-attention cache) gives the logits of the whole forward pass; also
    with each stack one shared layer (share_layers: a cache per application)."""
    model = tiny(repeat=repeat, position_embedding=position, num_kv_heads=2, share_layers=share)
    model = model.build(jax.random.key(1))
    batch = random_batch(seed=1)
    full, _ = model(batch, EVAL)
    t = batch["targets"].shape[1]
    decoder = SequenceModelDecoder(
        model, jnp.asarray(batch["inputs"]), jnp.asarray(batch["input_paddings"]), max_new_tokens=t, start_id=BOS
    )
    logits, carry = decoder.start()
    steps = [logits]
    for i in range(t - 1):
        logits, carry = decoder.extend(jnp.asarray(batch["target_ids"][:, i + 1]), carry, jnp.int32(i))
        steps.append(logits)
    got = np.stack([np.asarray(s) for s in steps], axis=1)
    valid = batch["target_paddings"] < 0.5
    assert_same_math(got[valid], np.asarray(full)[valid])


@pytest.mark.parametrize("position", ["relative_bias", "trainable"])
def test_encoder_padding_never_changes_the_outputs(position):
    """Other tokens under the input padding, or more padding, leave every target's logits unchanged."""
    model = tiny(position_embedding=position).build(jax.random.key(2))
    batch = random_batch(seed=2)
    base, _ = model(batch, EVAL)
    noisy = dict(batch, inputs=np.where(batch["input_paddings"] > 0, 9, batch["inputs"]).astype(np.int32))
    longer = dict(
        batch,
        inputs=np.pad(batch["inputs"], ((0, 0), (0, 4)), constant_values=5),
        input_paddings=np.pad(batch["input_paddings"], ((0, 0), (0, 4)), constant_values=1.0),
    )
    valid = batch["target_paddings"] < 0.5
    for other in (noisy, longer):
        logits, _ = model(other, EVAL)
        assert_same_math(np.asarray(logits)[valid], np.asarray(base)[valid])


def test_bad_configs_name_the_field():
    with pytest.raises(ConfigError, match="model.num_encoder_layers"):
        tiny(num_encoder_layers=0).validate()
    with pytest.raises(ConfigError, match="model.relative_bias"):
        tiny(position_embedding="trainable", relative_bias=tiny().relative_bias.replace(num_buckets=8)).validate()
    with pytest.raises(ConfigError, match="causal"):
        block = tiny().block
        tiny(block=block.replace(attention=block.attention.replace(causal=False))).validate()
    model = tiny().build(jax.random.key(0))
    with pytest.raises(ConfigError, match="model.max_seq_len=16"):
        model(random_batch(s=20), EVAL)


# A model trained to copy its input ------------------------------------------------------------
COPY_LEN = 5


def copy_batch(rng: np.random.Generator, b: int) -> dict:
    tokens = rng.integers(4, VOCAB, (b, COPY_LEN))
    inputs = np.concatenate([tokens, np.full((b, 1), EOS)], axis=1)
    return make_batch(inputs, [COPY_LEN + 1] * b, inputs, [COPY_LEN + 1] * b)


@pytest.fixture(scope="module")
def copier():
    """A small encoder-decoder trained to copy 5 tokens: 800 steps, ~10 s on CPU."""
    model = tiny(max_seq_len=8, model_dims=32, hidden_dims=64, num_heads=4).build(jax.random.key(0))
    steps = 800
    tx = optax.adam(optax.warmup_cosine_decay_schedule(0.0, 3e-3, 50, steps, 0.05))
    opt_state = tx.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, opt_state, batch):
        def loss(model):
            x, _ = model.compute_predictions(batch, EVAL)
            return model.compute_loss(x, batch)["avg_xent"].value

        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, value

    rng = np.random.default_rng(0)
    for _ in range(steps):
        model, opt_state, value = step(model, opt_state, copy_batch(rng, 32))
    assert float(value) < 1e-3, f"the copy task did not train (loss {float(value)})"
    return model


def _decoder(model, batch):
    return SequenceModelDecoder(
        model, jnp.asarray(batch["inputs"]), jnp.asarray(batch["input_paddings"]), max_new_tokens=COPY_LEN + 2,
        start_id=BOS,
    )  # fmt: skip


def test_greedy_and_beam_search_return_the_copy(copier):
    batch = copy_batch(np.random.default_rng(123), 8)  # held out: never seen in training
    decoder = _decoder(copier, batch)
    greedy, _ = sample(decoder, GREEDY, jax.random.key(0), PAD, COPY_LEN + 2)
    np.testing.assert_array_equal(np.asarray(greedy)[:, : COPY_LEN + 1], batch["targets"])
    result = beam_search(decoder, beam_size=4, max_new_tokens=COPY_LEN + 2, eos_id=EOS, pad_id=PAD,
                         length_norm_alpha=0.8)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(result.tokens)[:, 0, : COPY_LEN + 1], batch["targets"])


def test_beam_one_is_greedy_and_wider_beams_score_at_least_greedy(copier):
    """On a half-trained model (so search matters): beam_size=1 is greedy exactly, and a beam of 4
    finds, for every example, a hypothesis scoring at least greedy's."""
    batch = copy_batch(np.random.default_rng(7), 8)
    # Perturb the trained weights so the model is unsure and greedy is not always optimal.
    leaves, treedef = jax.tree.flatten(eqx.filter(copier, eqx.is_inexact_array))
    noisy = [leaf + 0.05 * jax.random.normal(jax.random.key(i), leaf.shape) for i, leaf in enumerate(leaves)]
    model = eqx.combine(jax.tree.unflatten(treedef, noisy), copier)
    decoder = _decoder(model, batch)
    n = COPY_LEN + 2
    greedy, greedy_logp = sample(decoder, GREEDY, jax.random.key(0), PAD, n)
    one = beam_search(decoder, beam_size=1, max_new_tokens=n, eos_id=EOS, pad_id=PAD, length_norm_alpha=0.8)
    np.testing.assert_array_equal(np.asarray(one.tokens)[:, 0], np.asarray(greedy))
    assert_same_math(np.asarray(one.log_probs)[:, 0], greedy_logp)
    four = beam_search(decoder, beam_size=4, max_new_tokens=n, eos_id=EOS, pad_id=PAD, length_norm_alpha=0.8)
    assert np.all(np.asarray(four.scores)[:, 0] >= np.asarray(one.scores)[:, 0] - 1e-5)
