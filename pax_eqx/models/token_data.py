"""Whether a token model's data fits it: the kind of rows and their lengths.

A language model trains on rows of tokens (data.layout 'stream' or 'packed'), an encoder-decoder
on (input, target) pairs (span corruption, seq2seq jsonl); either refuses the other kind, and
every length the data makes must fit the model's max_seq_len. Shared by both families'
`ModelConfig.check_data`, so the experiment never tests which family it holds.
"""

from __future__ import annotations

from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.data import DataConfig, is_seq2seq, target_length


def check_token_data(model: Any, data: DataConfig, *, pairs: bool) -> None:
    """ConfigError naming the field when `data` does not give `model` (with `max_seq_len`) its
    rows: input/target pairs when `pairs`, else language-model rows."""
    if pairs != is_seq2seq(data):
        want = (
            "a sequence-to-sequence layout (data.layout='span_corruption' or data.source='seq2seq_jsonl')"
            if pairs
            else "language-model rows (data.layout 'stream' or 'packed', not span_corruption or seq2seq_jsonl)"
        )
        raise ConfigError(
            f"model is a {type(model).__name__}, which trains on {want}; {data.source.describe(data)} "
            "gives the other kind. Change the data or the model."
        )
    lengths = {"data.seq_len": data.seq_len}
    if pairs:
        lengths["data.target_seq_len (as resolved)"] = target_length(data)
    for name, length in lengths.items():
        if length > model.max_seq_len:
            raise ConfigError(
                f"{name}={length} is longer than model.max_seq_len={model.max_seq_len}; "
                f"lower {name.split(' ')[0]} or raise model.max_seq_len."
            )
