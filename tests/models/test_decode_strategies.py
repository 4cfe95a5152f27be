"""A decode strategy is one class: a `DecodeStrategy` subclass that declares a kind and its draw,
defined in any imported module (here, a test function), is a choice of `SampleConfig.strategy`
that `sample` and `generate` run, and is listed among the choices while the class lives."""

import gc
from typing import ClassVar

import jax
from tolerances import assert_same_math

from pax_eqx.config import config, variant_choices
from pax_eqx.models import DecodeStrategy, GreedyStrategy, LanguageModelConfig, SampleConfig, generate, sample
from pax_eqx.models.language_model_decoder import LanguageModelDecoder
from pax_eqx.models.sampler import Draw


def test_a_strategy_defined_in_a_test_module_is_one_class():
    model = LanguageModelConfig(
        vocab_size=13, max_seq_len=32, num_layers=1, model_dims=16, hidden_dims=32, num_heads=4
    ).build(jax.random.key(0))
    assert "test_top1" not in variant_choices(DecodeStrategy)

    @config
    class TopOneStrategy(DecodeStrategy):
        """Sampling among the single most likely token: greedy, by another program (top-k 1)."""

        kind: ClassVar[str] = "test_top1"

        def draw(self, eos_id: int) -> Draw:
            return Draw.of(temperature=1.0, top_k=1, top_p=1.0, eos_id=eos_id)

    try:
        choices = variant_choices(DecodeStrategy)
        assert choices["test_top1"] is TopOneStrategy
        assert {"sample", "greedy", "beam"} <= set(choices)
        top_one = SampleConfig(max_new_tokens=6, strategy=TopOneStrategy())
        greedy = SampleConfig(max_new_tokens=6, strategy=GreedyStrategy())
        prompts = [[1, 2, 3], [4], [5, 6]]
        decoder = LanguageModelDecoder.from_prompts(model, prompts, 6)
        tokens, log_probs = sample(decoder, top_one, jax.random.key(3))
        greedy_tokens, greedy_log_probs = sample(decoder, greedy, jax.random.key(0))
        assert tokens.tolist() == greedy_tokens.tolist()
        assert_same_math(log_probs, greedy_log_probs)  # the same tokens' log-probs, in two programs
        # generate runs the strategy's best output (sampler.draw_tokens on the same decoder).
        continuations = generate(model, prompts, top_one, jax.random.key(3))
        assert continuations == generate(model, prompts, greedy, jax.random.key(0))
        assert [len(c) for c in continuations] == [6, 6, 6]
    finally:
        # Unregister it for the other tests of this process: subclasses are held weakly, so the
        # class goes with its last reference (the cycles a dataclass makes are the collector's).
        top_one = choices = TopOneStrategy = None
        gc.collect()
    assert "test_top1" not in variant_choices(DecodeStrategy)
