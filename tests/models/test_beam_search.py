"""Beam search on the IncrementalDecoder protocol, against independent computations:

- beam_size 1 is greedy `sample` exactly (tokens and log-prob), on both layer-stack layouts;
- with a pool as large as every sequence, the n-best list is the brute-force ranking of all
  V^3 continuations, each scored by teacher forcing through the model's full forward;
- a hand-written bigram decoder (a user's own model: three methods) whose sequence
  probabilities are known in closed form: EOS handling, lengths, padding, the GNMT formula,
  and alpha changing the winner;
- an LM trained for seconds to copy returns the copy for held-out prompts;
- the decode CLI prints an n-best list with --beam-size; bad settings are refused by name.
"""

import itertools
import re
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode
from pax_eqx.layers.initializers import gaussian
from pax_eqx.models import BeamStrategy, GreedyStrategy, LanguageModelConfig, SampleConfig, SampleStrategy, generate
from pax_eqx.models.beam_search import beam_search, length_normalize
from pax_eqx.models.decoding import beam_search_lm, sample
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.language_model_decoder import LanguageModelDecoder


def random_lm(vocab: int = 20, repeat: bool = True, seed: int = 0):
    """Random weights, scaled up so the next-token distributions are far from uniform (few
    near-ties between candidates)."""
    cfg = LanguageModelConfig(
        vocab_size=vocab, max_seq_len=32, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4,
        repeat=repeat, init=gaussian(0.3), embedding_init=gaussian(1.0),
    )  # fmt: skip
    return cfg.build(jax.random.key(seed))


PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [3, 3], [10, 11], [12, 13, 14, 15], [16], [17, 18, 19]]


def greedy(decoder, new, eos_id, pad_id=0):
    cfg = SampleConfig(max_new_tokens=new, eos_id=eos_id, strategy=GreedyStrategy())
    tokens, log_probs = sample(decoder, cfg, jax.random.key(0), pad_id)
    return np.asarray(tokens), np.asarray(log_probs)


def lengths_of(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Tokens up to and including the first EOS (all of them without one)."""
    hit = tokens == eos_id
    return np.where(hit.any(-1), hit.argmax(-1) + 1, tokens.shape[-1])


@pytest.mark.parametrize("repeat", [True, False], ids=["repeated-stack", "list-stack"])
def test_beam_size_one_is_greedy_exactly(repeat):
    model = random_lm(repeat=repeat)
    decoder = LanguageModelDecoder.from_prompts(model, PROMPTS, 8, pad_id=0)
    tokens, _ = greedy(decoder, 8, eos_id=-1)
    eos = int(tokens[0, 2])  # a token greedy emits mid-way: rows stop early and some pad after it
    tokens, log_probs = greedy(decoder, 8, eos_id=eos)
    assert (tokens == 0).any()
    out = beam_search(decoder, beam_size=1, max_new_tokens=8, eos_id=eos, pad_id=0, length_norm_alpha=0.8)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_array_equal(np.asarray(out.log_probs[:, 0]), log_probs)
    np.testing.assert_array_equal(np.asarray(out.lengths[:, 0]), lengths_of(tokens, eos))
    if repeat:  # the log-prob `sample` reports is the teacher-forced one, up to and including EOS
        rows = zip(PROMPTS, tokens, lengths_of(tokens, eos), strict=True)
        forced = [teacher_forced(model, prompt, row[None, :n]).sum() for prompt, row, n in rows]
        assert_same_math(log_probs, forced, rtol=1e-4)


def test_beam_search_scores_at_least_greedy_on_every_example():
    """Not a theorem (beam search can prune greedy's path), but it holds on this batch, and a
    broken ranking or reordering would break it."""
    model = random_lm(seed=1)
    decoder = LanguageModelDecoder.from_prompts(model, PROMPTS, 10, pad_id=0)
    eos, alpha = 7, 0.8
    tokens, log_probs = greedy(decoder, 10, eos_id=eos)
    greedy_score = np.asarray(length_normalize(jnp.asarray(log_probs), jnp.asarray(lengths_of(tokens, eos)), alpha))
    out = beam_search(decoder, beam_size=4, max_new_tokens=10, eos_id=eos, pad_id=0, length_norm_alpha=alpha)
    best = np.asarray(out.scores[:, 0])
    assert (best >= greedy_score - 1e-6).all(), (best, greedy_score)
    assert (best > greedy_score + 1e-3).any()  # and beam search does find better ones
    assert (np.diff(np.asarray(out.scores), axis=1) <= 0).all()  # best first


def teacher_forced(model, prompt: list[int], seqs: np.ndarray) -> np.ndarray:
    """[n, steps]: the model's log-prob of each token of each continuation, from one full
    forward over prompt + continuation (no cache, no padding)."""
    ids = jnp.asarray(np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], axis=1), jnp.int32)
    logits, _ = model(ids, Context(mode=Mode.EVAL))
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p, steps = len(prompt), seqs.shape[1]
    return np.asarray(jnp.take_along_axis(lp[:, p - 1 : p - 1 + steps], ids[:, p:, None], axis=-1)[..., 0])


@pytest.mark.parametrize("eos_id, alpha", [(-1, 0.0), (2, 0.0), (2, 0.8)])
def test_a_pool_of_every_sequence_is_the_brute_force_ranking(eos_id, alpha):
    """Vocab 5, 3 steps: K = 125 keeps every candidate at every step, so the pool must end as
    all distinct continuations (cut at EOS) ranked by score: the brute force."""
    v, steps = 5, 3
    model = random_lm(vocab=v)
    prompts = [[1, 3, 4], [4, 1]]  # different lengths: the beam decoder left-pads one
    decoder = LanguageModelDecoder.from_prompts(model, prompts, steps, pad_id=0)
    out = beam_search(decoder, beam_size=v**steps, max_new_tokens=steps, eos_id=eos_id, pad_id=0,
                      length_norm_alpha=alpha)  # fmt: skip
    seqs = np.array(list(itertools.product(range(v), repeat=steps)))
    for i, prompt in enumerate(prompts):
        token_lp = teacher_forced(model, prompt, seqs)
        brute: dict[tuple[int, ...], float] = {}
        for seq, lp in zip(seqs.tolist(), token_lp):
            n = seq.index(eos_id) + 1 if eos_id in seq else steps
            brute[tuple(seq[:n])] = float(lp[:n].sum()) / ((5 + n) / 6) ** alpha
        ranked = sorted(brute.items(), key=lambda kv: -kv[1])
        tokens, lengths, scores = (np.asarray(a[i]) for a in (out.tokens, out.lengths, out.scores))
        found = [(tuple(row[:n].tolist()), float(s)) for row, n, s in zip(tokens, lengths, scores) if np.isfinite(s)]
        assert len(found) == len(brute) == (v**steps if eos_id < 0 else 1 + 4 + 16 + 64)
        assert {ids for ids, _ in found} == set(brute)
        assert_same_math([s for _, s in found], [brute[ids] for ids, _ in found], rtol=1e-4)
        assert ranked[0][1] - ranked[1][1] > 1e-3  # a clear winner, so the order is meaningful
        assert found[0][0] == ranked[0][0]
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
        for row, n, s in zip(tokens, lengths, scores):  # after EOS: pad; lengths count the EOS
            if np.isfinite(s):
                assert (row[n:] == 0).all() and (n == steps or row[n - 1] == eos_id)


class BigramDecoder(IncrementalDecoder):
    """A user's own model in three methods: the next token's log-probs depend only on the last
    token (`table[last]`), so every sequence's probability is a product read off the table."""

    table: jax.Array  # [vocab, vocab] log-probs
    prompt_last: jax.Array  # [rows] the last prompt token

    def start(self):
        return self.table[self.prompt_last], self.prompt_last

    def extend(self, tokens, carry, t):
        return self.table[tokens], tokens

    def select(self, carry, rows):
        return carry[rows]


PAD, EOS, A, S = 0, 1, 2, 3  # S starts every prompt


def bigram_table() -> np.ndarray:
    """From S: EOS 0.52, A 0.48; from A: A 0.98, EOS 0.02 (a little mass elsewhere so no log is
    -inf). Short [EOS] wins on raw log-prob, [A, A, A] once length is rewarded."""
    p = np.full((4, 4), 1e-6)
    p[S, [EOS, A]] = [0.52, 0.48]
    p[A, [A, EOS]] = [0.98, 0.02]
    p[[PAD, EOS], PAD] = 1.0
    return np.log(p / p.sum(1, keepdims=True)).astype(np.float32)


def test_length_normalize_is_the_gnmt_formula():
    lp, n = jnp.array([-1.0, -3.0, -6.0]), jnp.array([1, 3, 10])
    for alpha in (0.0, 0.6, 1.0):
        expected = np.array([-1.0, -3.0, -6.0]) / ((5 + np.array([1, 3, 10])) / 6) ** alpha
        np.testing.assert_allclose(np.asarray(length_normalize(lp, n, alpha)), expected, rtol=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.8])
def test_eos_and_length_normalisation_on_a_known_bigram_model(alpha):
    table = bigram_table()
    decoder = BigramDecoder(jnp.asarray(table), jnp.array([S, S]))
    out = beam_search(decoder, beam_size=3, max_new_tokens=3, eos_id=EOS, pad_id=PAD, length_norm_alpha=alpha)
    logp = {  # every sequence with more than ~1e-6 probability
        (EOS,): table[S, EOS],
        (A, EOS): table[S, A] + table[A, EOS],
        (A, A, EOS): table[S, A] + table[A, A] + table[A, EOS],
        (A, A, A): table[S, A] + 2 * table[A, A],
    }
    score = {seq: lp / ((5 + len(seq)) / 6) ** alpha for seq, lp in logp.items()}
    best3 = sorted(score, key=lambda s: -score[s])[:3]
    for row in range(2):  # two identical examples: the batch axis is independent
        tokens, lengths = np.asarray(out.tokens[row]), np.asarray(out.lengths[row])
        got = [tuple(t[:n].tolist()) for t, n in zip(tokens, lengths)]
        assert got == best3
        for t, n, seq in zip(tokens, lengths, got):
            assert n == len(seq) and (t[n:] == PAD).all()  # EOS counts; pads after it
        np.testing.assert_allclose(np.asarray(out.log_probs[row]), [logp[s] for s in best3], rtol=1e-5)
        np.testing.assert_allclose(np.asarray(out.scores[row]), [score[s] for s in best3], rtol=1e-5)
    # alpha 0 keeps the short, likelier [EOS]; alpha 0.8 rewards the length of [A, A, A].
    assert best3[0] == ((EOS,) if alpha == 0.0 else (A, A, A))
    # Greedy stops at once (EOS 0.52 > A 0.48), and beam_size 1 does the same.
    one = beam_search(decoder, beam_size=1, max_new_tokens=3, eos_id=EOS, pad_id=PAD, length_norm_alpha=alpha)
    assert np.asarray(one.tokens[0, 0]).tolist() == [EOS, PAD, PAD] and int(one.lengths[0, 0]) == 1


def test_an_lm_trained_to_copy_beam_searches_the_copy_of_held_out_prompts():
    """Rows `x1 x2 x3 x4 SEP x1 x2 x3 x4 EOS`, trained (loss on the copy) for a few seconds;
    the held-out prompts `x1..x4 SEP` never occur in training."""
    sep, eos, v, n = 1, 2, 12, 4
    rng = np.random.default_rng(0)
    held_out = rng.integers(3, v, size=(8, n))
    unseen = {tuple(x) for x in held_out.tolist()}

    def rows(m: int) -> np.ndarray:
        x = rng.integers(3, v, size=(m, n))
        x = x[[tuple(r) not in unseen for r in x.tolist()]][: m // 2 * 2]
        return np.concatenate([x, np.full((len(x), 1), sep), x, np.full((len(x), 1), eos)], 1)

    cfg = LanguageModelConfig(vocab_size=v, max_seq_len=16, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4)
    params, static = eqx.partition(cfg.build(jax.random.key(0)), eqx.is_array)
    opt = optax.adam(3e-3)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, seqs):
        ids, labels = seqs[:, :-1], seqs[:, 1:]
        weights = jnp.zeros(labels.shape).at[:, n:].set(1.0)  # the copy and its EOS

        def loss_fn(p):
            m = eqx.combine(p, static)
            logits, _ = m(ids, Context(mode=Mode.TRAIN))
            return m.metrics_from_logits(logits, labels, weights)["avg_xent"].value

        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    for _ in range(150):
        params, opt_state, loss = step(params, opt_state, jnp.asarray(rows(64)[:60]))
    assert float(loss) < 0.05
    model = eqx.combine(params, static)
    prompts = [x + [sep] for x in held_out.tolist()]
    cfg = SampleConfig(max_new_tokens=n + 2, eos_id=eos, strategy=BeamStrategy(beam_size=3))
    nbest = beam_search_lm(model, prompts, cfg, pad_id=0)
    assert [hyps[0][0] for hyps in nbest] == held_out.tolist()
    assert all(len(hyps) == 3 and hyps[0][1] > hyps[1][1] for hyps in nbest)
    # generate with a beam strategy returns each prompt's best hypothesis.
    assert generate(model, prompts[:2], cfg, jax.random.key(0)) == held_out[:2].tolist()


def test_bad_beam_settings_are_refused_by_name():
    """Each strategy holds only its own fields: a sampling field on a beam (or a beam's on
    sampling) does not exist, so it is refused by name as it is constructed."""
    model = random_lm()
    bad = [
        (BeamStrategy, dict(beam_size=0), {}, "decode.beam_size must be >= 1"),
        (BeamStrategy, dict(beam_size=4, length_norm_alpha=-0.5), {}, "decode.length_norm_alpha must be >= 0"),
        (BeamStrategy, dict(beam_size=4, top_k=40), {}, "BeamStrategy has no field 'top_k'"),
        (BeamStrategy, dict(beam_size=4, top_p=0.9), {}, "BeamStrategy has no field 'top_p'"),
        (SampleStrategy, dict(length_norm_alpha=0.6), {}, "SampleStrategy has no field 'length_norm_alpha'"),
        (BeamStrategy, dict(beam_size=2), dict(max_new_tokens=30), "more than model.max_seq_len=32"),  # no window
    ]
    for strategy, fields, cfg_fields, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            beam_search_lm(model, [[1, 2, 3]], SampleConfig(strategy=strategy(**fields), **cfg_fields), pad_id=0)
    with pytest.raises(ConfigError, match="beam_search_lm needs decode.strategy beam, not 'sample'"):
        beam_search_lm(model, [[1, 2, 3]], SampleConfig(max_new_tokens=4), pad_id=0)
    decoder = LanguageModelDecoder.from_prompts(model, [[1]], 4)
    with pytest.raises(ConfigError, match="decode.strategy='beam' does not draw one token a step"):
        sample(decoder, SampleConfig(strategy=BeamStrategy(beam_size=2)), jax.random.key(0))


sys.path.insert(0, str(Path(__file__).parents[1] / "programs"))  # the CLI tests' tiny job flags


def test_decode_cli_prints_the_beam_n_best_list(tmp_path, capsys):
    from tiny import tiny_args

    from pax_eqx import decode, train

    args = tiny_args(tmp_path / "job", "--train.no-sample-at-end")
    assert train.main(args) == 0
    capsys.readouterr()
    beam = ["--decode.strategy", "beam", "--decode.beam-size", "3"]
    assert decode.main(args + ["--prompt", "ROMEO:", *beam, "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "Beam search from the checkpoint" in out and "3 best of beam_size 3" in out
    ranks = re.findall(r"^--- (\d+) \(score (-?[\d.]+)\) ---$", out, re.MULTILINE)
    assert [r for r, _ in ranks] == ["1", "2", "3"]
    scores = [float(s) for _, s in ranks]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert out.count("\nROMEO:") == 3
    # shakespeare_char samples with top_k=40: that does not stop a beam (the beam has no top_k),
    # but a flag of another strategy, or one the beam ignores, given on the command line, is
    # refused before anything is restored. The short --beam-size N chooses the beam itself.
    for flags, message in [
        (["--beam-size", "2", "--num-samples", "2"], "--decode.num-samples has no effect: decode.strategy='beam' "
         "prints one n-best list of the prompt"),
        (["--beam-size", "2", "--top-k", "5"], "--decode.top-k: decode.strategy is 'beam' here, which has no "
         "top_k; sample reads it. Switch with --decode.strategy sample, or drop the flag."),
        (["--length-norm-alpha", "0.5"], "--decode.length-norm-alpha: decode.strategy is 'sample' here, which has "
         "no length_norm_alpha; beam reads it. Switch with --decode.strategy beam"),
        (["--decode.beam-size", "3"], "--decode.beam-size: decode.strategy is 'sample' here, which has no "
         "beam_size; beam reads it."),
        (["--beam-size", "0"], "decode.beam_size must be >= 1"),
    ]:  # fmt: skip
        with pytest.raises((ConfigError, SystemExit)) as refused:
            decode.main(args + flags)
        said = str(refused.value) if isinstance(refused.value, ConfigError) else capsys.readouterr().err
        assert message in said, said


def test_decode_beam_style_reaches_the_search_and_is_refused_without_a_beam():
    """decode.beam_style='praxis' runs Praxis' search (beam_search_lm = beam_search(style=...)),
    which returns only ended hypotheses; a strategy that does not search has no such field, and
    giving it one is refused, naming it."""
    model = random_lm()
    decoder = LanguageModelDecoder.from_prompts(model, PROMPTS[:3], 6, pad_id=0)
    eos = 5
    cfg = SampleConfig(max_new_tokens=6, eos_id=eos, strategy=BeamStrategy(beam_size=3, beam_style="praxis"))
    direct = beam_search(decoder, beam_size=3, max_new_tokens=6, eos_id=eos, pad_id=0, style="praxis")
    got = beam_search_lm(model, PROMPTS[:3], cfg, pad_id=0)
    for row, nbest in enumerate(got):
        scores = np.asarray(direct.scores[row])
        np.testing.assert_allclose([s for _, s in nbest], scores[np.isfinite(scores)], rtol=1e-6)
    ended = np.asarray(direct.tokens) == eos
    lengths = np.asarray(direct.lengths)
    finite = np.isfinite(np.asarray(direct.scores))
    assert all(ended[r, k, lengths[r, k] - 1] for r, k in zip(*np.nonzero(finite)))  # every one ends with EOS
    for strategy in (SampleStrategy, GreedyStrategy):
        with pytest.raises(ConfigError, match=f"{strategy.__name__} has no field 'beam_style'"):
            strategy(beam_style="praxis")
