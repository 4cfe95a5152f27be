"""A data source in one file, as a user adds one: a `DataSource` subclass that names its kind
and holds only its own fields is a `--data.source` choice as soon as its module is imported,
with no other file edited (tests/data/test_prepared_directory.py trains on it through the CLI).

Rows count up from the example's index in steps of `stride` (mod the vocabulary, above the
specials): ids[t] = 4 + (i + stride * t) % (vocab - 4), labels the next id."""

from __future__ import annotations

from typing import ClassVar

import grain
import numpy as np

from pax_eqx.config import check_range, config
from pax_eqx.data import DataConfig, InputConfig
from pax_eqx.data.data_source import TokenIdRows, token_rows_input
from pax_eqx.experiment import ExperimentConfig


@config
class CountingSource(TokenIdRows):
    """stride: how far each token is from the one before it."""

    kind: ClassVar[str] = "counting"

    stride: int = 1

    def validate(self) -> None:
        super().validate()
        check_range(self, "stride", gt=0, prefix="data.source")

    def build_input(self, data, split, tokenizer, shard):
        span, seq_len, stride = tokenizer.vocab_size - 4, data.seq_len, self.stride

        def row(i: int) -> dict:
            ids = 4 + (i + stride * np.arange(seq_len + 1)) % span
            real = np.ones(seq_len, np.int32)
            return {
                "ids": ids[:-1].astype(np.int32),
                "labels": ids[1:].astype(np.int32),
                "weights": real.astype(np.float32),
                "segment_ids": real,
                "segment_pos": np.arange(seq_len, dtype=np.int32),
            }

        examples = grain.MapDataset.range(self.num_synthetic_examples).map(row)
        return token_rows_input(examples, data, split, tokenizer, shard)


def tiny() -> ExperimentConfig:
    """shakespeare_char's model, tiny, on counting rows."""
    from experiments.shakespeare import shakespeare_char

    exp = shakespeare_char()
    rolling = InputConfig(batch_size=4, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=1)
    data = DataConfig(source=CountingSource(num_synthetic_examples=16), seq_len=16,
                      train=InputConfig(batch_size=4), eval=rolling)  # fmt: skip
    model = exp.model.replace(num_layers=1, model_dims=32, hidden_dims=64, num_heads=2)
    return exp.replace(name="counting_tiny", model=model, data=data)
