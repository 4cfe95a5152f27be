"""`--data.source random`: uniform random tokens of the tokenizer's vocabulary, deterministic per
example (a seed and an index): an LM that learns nothing, with real-looking ids."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import config
from pax_eqx.data import lm_examples
from pax_eqx.data.data_source import TokenIdRows, token_rows_input


@config
class RandomSource(TokenIdRows):
    """Random token rows, `num_synthetic_examples` an epoch."""

    kind: ClassVar[str] = "random"

    def draws_from_seed(self, split, data) -> bool:
        return True

    def build_input(self, data, split, tokenizer, shard):
        seed = getattr(data, split).input_random_seed
        examples = lm_examples.RandomTokens(self.num_synthetic_examples, data.seq_len, tokenizer.vocab_size, seed)
        return token_rows_input(examples, data, split, tokenizer, shard)
