"""`--data.source digits`: scikit-learn's 8x8 digit images as flat feature vectors [64] with
class labels (data/digits.py), for classifiers; the eval split is the last `eval_fraction` of a
fixed shuffle."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import digits
from pax_eqx.data.data_source import ExampleSpec, HeldOutSplit
from pax_eqx.data.host_sharding import batch_host_examples, zeros_like_example
from pax_eqx.data.input import Input


@config
class DigitsSource(HeldOutSplit):
    """The digits as feature vectors (the digits_mlp experiment)."""

    kind: ClassVar[str] = "digits"
    reads_tokens: ClassVar[bool] = False
    has_text: ClassVar[bool] = False

    def check(self, data, files: bool) -> None:
        check_digits(self, data, files)

    def example_spec(self) -> ExampleSpec:
        return ExampleSpec((digits.NUM_FEATURES,), digits.NUM_CLASSES)

    def describe(self, data) -> str:
        return self.flag

    def build_input(self, data, split, tokenizer, shard):
        cfg = getattr(data, split)
        examples = digits.digits_examples(split, self.eval_fraction)
        batches, per_epoch = batch_host_examples(examples, cfg, shard, zeros_like_example(examples[0]))
        return Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch)


def check_digits(source: HeldOutSplit, data, files: bool) -> None:
    """A training batch no larger than the digits' training split; with `files`, scikit-learn."""
    available = digits.split_size("train", source.eval_fraction)
    if data.train.batch_size > available:
        raise ConfigError(
            f"data.train.batch_size={data.train.batch_size} but {source.flag} has {available} training "
            f"examples (with data.eval_fraction={source.eval_fraction}): every batch would repeat each one "
            f"~{data.train.batch_size // available} times; use a batch size of at most {available}."
        )
    if files:
        digits.check_available()
