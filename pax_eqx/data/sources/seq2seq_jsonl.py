"""`--data.source seq2seq_jsonl --data.path pairs.jsonl`: (inputs, targets) pairs of JSON-lines
records, for encoder-decoders (seq2seq_examples.py); the eval split as `jsonl`'s."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, check_range, config
from pax_eqx.data import file_readers, seq2seq_examples
from pax_eqx.data.data_source import FileSource


@config
class Seq2SeqJsonlSource(FileSource):
    """jsonl_inputs_key: the record field of a pair's inputs. jsonl_targets_key: the record field
    of its targets. target_seq_len: the targets' length (0 = data.seq_len)."""

    kind: ClassVar[str] = "seq2seq_jsonl"
    trains_tokenizer: ClassVar[bool] = True

    jsonl_inputs_key: str = "inputs"
    jsonl_targets_key: str = "targets"
    target_seq_len: int = 0

    def validate(self) -> None:
        super().validate()
        check_range(self, "target_seq_len", ge=0, prefix="data", note="0 = data.seq_len")
        for name, default in (("jsonl_inputs_key", "inputs"), ("jsonl_targets_key", "targets")):
            if not getattr(self, name):
                raise ConfigError(f"data.{name} is empty; name the record field (default {default!r}).")

    def check(self, data, files: bool) -> None:
        if files:
            file_readers.resolve_paths(self.path, "data.path", suffixes=file_readers.JSONL_SUFFIXES)
            if self.eval_path:
                file_readers.resolve_paths(self.eval_path, "data.eval_path", suffixes=file_readers.JSONL_SUFFIXES)

    @property
    def is_seq2seq(self) -> bool:
        return True

    def target_length(self, seq_len: int) -> int:
        return self.target_seq_len or seq_len

    def pairs(self, split):
        """The split's (inputs, targets) strings."""
        spec, field, held_out_split = self.split_files(split)
        return file_readers.jsonl_pairs(
            spec, field, self.jsonl_inputs_key, self.jsonl_targets_key, held_out_split, self.eval_fraction
        )

    def training_text(self, data):
        for pair in self.pairs("train"):
            for text in pair:
                yield from text.split("\n")

    def build_input(self, data, split, tokenizer, shard):
        targets = self.target_length(data.seq_len)
        examples = seq2seq_examples.pair_examples(self.pairs(split), tokenizer, data.seq_len, targets)
        cfg = getattr(data, split)
        return seq2seq_examples.seq2seq_input(examples, cfg, split, shard, tokenizer, data.seq_len, targets)
