"""DataConfig: an experiment's data (Pax's `datasets()`): where examples come from (`source`, a
choice of configs: data_source.py and one file a source in sources/), how long a row is, the
tokenizer and the two inputs. `build.py` turns it into the tokenizer and each split's Input.

    DataConfig(source=JsonlSource(path="corpus.jsonl", layout="packed"), seq_len=256)
    --data.source jsonl --data.path corpus.jsonl --data.layout packed --data.seq-len 256

A source's own fields are flags of `data.` as well as of `data.source.` (`--data.path` is
`--data.source.path`), so the command lines written before sources were choices still parse;
a field of a source that is not the chosen one is refused naming the sources that read it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pax_eqx.config import Config, check_once, check_range, config
from pax_eqx.data import sources  # noqa: F401  (every source registers itself)
from pax_eqx.data.data_source import DataSource, ExampleSpec
from pax_eqx.data.input_config import InputConfig
from pax_eqx.data.sources.shakespeare import ShakespeareSource
from pax_eqx.data.tokenizers import ByteTokenizerConfig, TokenizerConfig

# The fields a source holds that DataConfig held before sources were choices (config.json of
# older job dirs still loads: `DataConfig.migrate`).
_MOVED_INTO_SOURCE = (
    "path", "eval_path", "mixture_weights", "jsonl_text_key", "eval_fraction", "layout", "target_seq_len",
    "span_corruption", "jsonl_inputs_key", "jsonl_targets_key", "num_synthetic_examples", "image_shape",
    "custom_input", "augment",
)  # fmt: skip


@config
class DataConfig(Config):
    """source: where examples come from, a choice (`--data.source text_files`; each source's
    fields in its file of pax_eqx/data/sources/). seq_len: tokens per row (sources of token
    rows). tokenizer: byte (the default), sentencepiece or tokenizer_json, a choice
    (`--data.tokenizer sentencepiece`). train / eval: the two inputs (batch size, hosts, seed, the
    reset_for_eval x eval_loop_num_batches table); train: the training input. eval: the
    evaluation input."""

    flattened: ClassVar[tuple[str, ...]] = ("source",)  # `--data.path` is `--data.source.path`

    source: DataSource = ShakespeareSource()
    seq_len: int = 64
    tokenizer: TokenizerConfig = ByteTokenizerConfig()
    train: InputConfig = InputConfig()
    eval: InputConfig = InputConfig(shuffle=False, repeat=False, reset_for_eval=True)

    def __post_init__(self) -> None:
        check_range(self, "seq_len", gt=0, prefix="data")
        check_once(self.train, "train", lambda: self.train.validate("train"))  # the reset_for_eval table
        check_once(self.eval, "eval", lambda: self.eval.validate("eval"))

    @classmethod
    def migrate(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An older config.json's flat source (`"source": "jsonl", "path": ...`) as the chosen
        source's object; fields the chosen source does not read are dropped (they did nothing).
        A prepared corpus's `layout` ("packed", the only one it took) is its manifest's now."""
        if not isinstance(data.get("source"), str):
            return data
        moved = {name: data.pop(name) for name in _MOVED_INTO_SOURCE if name in data}
        data["source"] = {"kind": data["source"], **moved}
        return data

    def inert_fields(self) -> dict[str, str]:
        """The fields of the data that the chosen source never reads (its own conditional ones it
        lists itself, `DataSource.inert_fields`), and the train input's eval-only fields."""
        return self.source.inert_data_fields(self) | {
            "train.eval_loop_num_batches": "it sets how many batches an eval run reads; the train input has none",
            "train.reset_for_eval": "the train input is never evaluated",
            "train.metrics": "host-side metrics score the eval split only",
        }

    def validate(self, files: bool = True) -> None:
        """What the source checks against the rest of the data and, with `files`, on the disk (paths
        exist, a prepared corpus's manifest); files=False for a --dry-run, which plans without data.
        The fields themselves were checked when each config was made."""
        self.source.check_tokenizer(self.tokenizer)
        self.source.check(self, files)


def is_seq2seq(data: DataConfig) -> bool:
    """Whether `data` yields seq2seq batches (inputs / targets; seq2seq_examples.py) rather than
    LM or image batches."""
    return data.source.is_seq2seq


def has_text(data: DataConfig) -> bool:
    """Whether the data is text (what bytes can be counted in), not token ids without any."""
    return data.source.has_text


def target_length(data: DataConfig) -> int:
    """The length of a seq2seq batch's target_ids / targets / target_paddings (data.target_seq_len,
    or the length the source derives); an LM's labels: data.seq_len."""
    return data.source.target_length(data.seq_len)


def example_spec(data: DataConfig) -> ExampleSpec | None:
    """The examples' shape and classes where the config alone says them, without reading any
    file; None elsewhere (the files decide, and are checked when read)."""
    return data.source.example_spec()
