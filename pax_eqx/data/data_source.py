"""DataSource: where an experiment's examples come from, a choice of configs (`--data.source`).

Each source is one config class in one file of `pax_eqx/data/sources/`, holding only the fields
it reads, and registered by its own definition (`config.OpenChoice`): a new source is a new file
there (or a class in a user's module), and nothing else is edited. The class answers what the
rest of pax_eqx needs to know of a source -- which `DataConfig` fields it reads, which seeds it
draws from, its training text, its tokenizer and each split's Input -- so no code outside a
source asks which source it is.

    DataConfig(source=TextFilesSource(path="corpus/*.txt", layout="packed"), seq_len=256)
    --data.source text_files --data.path corpus/*.txt --data.layout packed     (the command line;
                                                 --data.source.path is the same flag spelt in full)

The shared bases hold the fields several sources read, so a switch between two of them keeps
those values (`config.switch_variant`), as Adam and AdamW share their moments:

    HeldOutSplit   eval_fraction: the eval split is a held-out share of the training data
    FileSource     path, eval_path (+ eval_fraction): files the user names
    TextDocuments  layout, span_corruption, target_seq_len: documents of text, cut into rows
    GeneratedExamples  num_synthetic_examples: examples made up, not read
    TokenIdRows    (GeneratedExamples) token ids without text
    ImageSource    image_shape, augment: images and class labels, no tokens
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import grain

from pax_eqx.config import ConfigError, OpenChoice, check_range, config
from pax_eqx.data import file_readers, images, lm_examples, seq2seq_examples
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.host_sharding import HostShard, batch_host_examples, shard_examples
from pax_eqx.data.input import Input, read_options
from pax_eqx.data.input_config import Split
from pax_eqx.data.span_corruption import SpanCorruptionConfig, num_sentinels, raw_length
from pax_eqx.data.tokenizers import ByteTokenizer, Tokenizer, TokenizerJsonTokenizer, load_or_train_sentencepiece

if TYPE_CHECKING:
    from pax_eqx.data.data_config import DataConfig


class ExampleSpec(NamedTuple):
    """What one example of a source is, where the source fixes it: the input's shape, and how
    many classes its labels take (None: any number; the synthetic images are all label 0)."""

    input_shape: tuple[int, ...]
    num_classes: int | None


@config
class DataSource(OpenChoice):
    """The contract every source answers (defaults suit a source of token rows from text).

    Class attributes: `reads_tokens` (whether data.seq_len and data.tokenizer apply: False for
    images), `has_text` (whether examples come from text a tokenizer can be trained on and bytes
    counted in: False for token ids made up)."""

    reads_tokens: ClassVar[bool] = True
    has_text: ClassVar[bool] = True
    trains_tokenizer: ClassVar[bool] = False  # whether `training_text` gives text to train SentencePiece on

    def __post_init__(self) -> None:
        self.validate()

    @property
    def flag(self) -> str:
        """How errors name this source: `data.source='text_files'`."""
        return f"data.source={self.kind!r}"

    def validate(self) -> None:
        """The source's own fields, alone (ConfigError naming the field, the value and the fix)."""

    def check(self, data: DataConfig, files: bool) -> None:
        """The source against the rest of `data` (its seq_len, batch sizes, tokenizer), and with
        `files` what reads the disk (paths exist, a prepared corpus's manifest). Run once, when
        the experiment is checked; files=False for a --dry-run, which plans without data."""

    def check_decodable(self, data: DataConfig, split: Split) -> None:
        """ConfigError for a stored example of `split` that cannot be read, where examples are
        decoded one by one as batches are made (encoded images), so that a bad file stops a run
        before it starts, not at the first eval (programs/preflight.py; which files are read and
        how many: the source's own rule). Nothing by default: the other sources read or check
        their files when their input is built."""

    def check_tokenizer(self, tokenizer: Any) -> None:
        """ConfigError for a tokenizer this source cannot give (a SentencePiece model to train, on
        a source with no text to train it on), before anything is built."""
        if tokenizer.kind == "sentencepiece" and not tokenizer.model_path and not self.trains_tokenizer:
            raise self._no_text()

    def configured(self, data: DataConfig) -> DataConfig:
        """`data` as the source's own files say it is: a prepared corpus's manifest names its
        tokenizer (and the length of pre-packed rows). The command line adopts what differs,
        unless a flag set it (command_line/data_files.py); `data` itself by default."""
        return data

    def classes_in_files(self) -> int | None:
        """How many classes the source's files say its labels take (a prepared image corpus's
        manifest); None where the files do not say (or are not there yet). The command line lets
        a classifier's num_classes follow it (command_line/data_files.py)."""
        return None

    def inert_fields(self) -> dict[str, str]:
        """{field of this source: why it does nothing} as the source stands (an eval_fraction
        beside an eval_path); the command line refuses a flag given for one."""
        return {}

    def draws_from_seed(self, split: Split, data: DataConfig) -> bool:
        """Whether `split` draws from its input_random_seed besides the shuffle (a stream's
        random start, span corruption's noise, random tokens, an image's random crop)."""
        return False

    def inert_data_fields(self, data: DataConfig) -> dict[str, str]:
        """{field of DataConfig: why it does nothing} with this source: the tokenizer and seq_len
        of a source without tokens, and each split's seed where nothing draws from it."""
        inert = {}
        if not self.reads_tokens:
            inert["seq_len"] = f"{self.flag} yields fixed-size examples, not token rows"
            inert["tokenizer"] = f"{self.flag} has no text or tokens"
        for split in ("train", "eval"):
            if not getattr(data, split).shuffle and not self.draws_from_seed(split, data):
                inert[f"{split}.input_random_seed"] = (
                    f"data.{split}.shuffle is off and nothing else of this source draws from a seed"
                )
        return inert

    @property
    def is_seq2seq(self) -> bool:
        """Whether batches are (inputs, targets) pairs (seq2seq_examples.py) rather than LM rows."""
        return False

    def target_length(self, seq_len: int) -> int:
        """The length of a seq2seq batch's targets; an LM's labels are `seq_len` long."""
        return seq_len

    def example_spec(self) -> ExampleSpec | None:
        """The examples' shape and classes where the config alone says them (no file read); None
        where the files decide."""
        return None

    def added_token_ids(self, seq_len: int) -> int:
        """Token ids the source writes beyond the tokenizer's (span corruption's sentinels), which
        the model's vocabulary must hold too."""
        return 0

    @property
    def normalization(self) -> AugmentConfig:
        """How inputs are normalised (an image's mean and std), so that decoding a file gives the
        model what the eval split gives it; none by default."""
        return AugmentConfig()

    def training_text(self, data: DataConfig) -> Iterator[str]:
        """Lines of the training split, to train a SentencePiece model on (`trains_tokenizer`)."""
        raise self._no_text()

    def _no_text(self) -> ConfigError:
        return ConfigError(
            f"data.tokenizer sentencepiece is trained from text, but {self.flag} has none; use "
            "--data.tokenizer byte, or set --data.tokenizer.model-path."
        )

    def build_tokenizer(self, data: DataConfig, job_dir: str | os.PathLike | None) -> Tokenizer:
        """The experiment's one tokenizer: bytes; a tokenizer.json; or SentencePiece loaded from
        data.tokenizer.model_path or JOB_DIR/tokenizer/spm.model, else trained on the training text."""
        tok = data.tokenizer
        if tok.kind == "byte":
            return ByteTokenizer()
        if tok.kind == "tokenizer_json":
            return TokenizerJsonTokenizer.load(tok)
        lines = () if tok.model_path else self.training_text(data)
        return load_or_train_sentencepiece(tok, job_dir, lines)

    def build_input(self, data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
        """This host's Input of `split`."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to build its input.")

    def describe(self, data: DataConfig) -> str:
        """One line saying what is read (python -m pax_eqx.inspect_data)."""
        return f"{self.flag} seq_len={data.seq_len}"


def token_rows_input(
    examples: grain.MapDataset, data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard
) -> Input:
    """An LM Input over in-memory `examples` (rows of lm_examples' format), this host's share
    batched and padded (weight 0) like every source."""
    cfg = getattr(data, split)
    batches, per_epoch = batch_host_examples(examples, cfg, shard, lm_examples.pad_example(data.seq_len))
    return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer, num_batches_per_epoch=per_epoch)


@config
class HeldOutSplit(DataSource):
    """eval_fraction: the share of the training data held out as the eval split."""

    eval_fraction: float = 0.1

    def validate(self) -> None:
        super().validate()
        check_range(self, "eval_fraction", gt=0, lt=1, prefix="data")


@config
class FileSource(HeldOutSplit):
    """path: the training files (a file, a directory, a glob; comma-separated lists work).
    eval_path: the held-out files ("" = hold out eval_fraction of the training files)."""

    path: str = ""
    eval_path: str = ""

    def inert_fields(self) -> dict[str, str]:
        inert = super().inert_fields()
        if self.eval_path:
            inert["eval_fraction"] = "data.eval_path is the eval split, so no fraction is held out"
        return inert

    def split_files(self, split: Split) -> tuple[str, str, str | None]:
        """(path spec, its field name, the split to hold out of it or None) of `split`."""
        if split == "eval" and self.eval_path:
            return self.eval_path, "data.eval_path", None
        return self.path, "data.path", None if self.eval_path else split


@config
class TextDocuments(DataSource):
    """layout: "stream" = one token stream cut into windows (nanoGPT; the whole split is
    tokenized once at build time), "packed" = documents packed into rows with segment_ids /
    segment_pos (read and tokenized lazily), "span_corruption" = T5's objective on windows of
    the stream, for encoder-decoders (lm_examples.py, span_corruption.py).
    span_corruption: T5's noise density and mean span length (layout "span_corruption").
    target_seq_len: the targets' length with layout "span_corruption" (0 = the longest targets
    span corruption makes of data.seq_len; a set value must be at least that)."""

    trains_tokenizer: ClassVar[bool] = True

    layout: Literal["stream", "packed", "span_corruption"] = "stream"
    span_corruption: SpanCorruptionConfig = SpanCorruptionConfig()
    target_seq_len: int = 0

    def validate(self) -> None:
        super().validate()
        check_range(self, "target_seq_len", ge=0, prefix="data", note="0 = derived")

    def documents(self, split: Split) -> list[str] | grain.MapDataset:
        """The split's documents (strings)."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its documents are.")

    def inert_fields(self) -> dict[str, str]:
        inert = super().inert_fields()
        if self.layout != "span_corruption":
            why = f"data.layout={self.layout!r} is not span_corruption"
            inert |= {"span_corruption": why, "target_seq_len": why}
        return inert

    def draws_from_seed(self, split: Split, data: DataConfig) -> bool:
        return self.is_seq2seq or (split == "train" and self.layout == "stream")

    def check(self, data: DataConfig, files: bool) -> None:
        if self.is_seq2seq:
            needed = raw_length(self.span_corruption, data.seq_len)[1]
            if self.target_seq_len and self.target_seq_len < needed:
                raise ConfigError(
                    f"data.target_seq_len={self.target_seq_len} is too short: span corruption with "
                    f"data.seq_len={data.seq_len} makes targets of up to {needed} tokens; use "
                    f"data.target_seq_len >= {needed}, or 0 for exactly {needed}."
                )

    @property
    def is_seq2seq(self) -> bool:
        return self.layout == "span_corruption"

    def target_length(self, seq_len: int) -> int:
        if self.is_seq2seq:
            return self.target_seq_len or raw_length(self.span_corruption, seq_len)[1]
        return seq_len

    def added_token_ids(self, seq_len: int) -> int:
        return num_sentinels(self.span_corruption, seq_len) if self.is_seq2seq else 0

    def training_text(self, data: DataConfig) -> Iterator[str]:
        for doc in self.documents("train"):
            yield from doc.split("\n")

    def describe(self, data: DataConfig) -> str:
        return f"{self.flag} layout={self.layout!r} seq_len={data.seq_len}"

    def build_input(self, data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
        cfg = getattr(data, split)
        if self.layout == "span_corruption":
            targets = self.target_length(data.seq_len)
            tokens = lm_examples.tokenize_stream(self.documents(split), tokenizer)
            examples = seq2seq_examples.span_corruption_examples(
                tokens, self.span_corruption, data.seq_len, targets, tokenizer,
                seed=cfg.input_random_seed, train=split == "train",
            )  # fmt: skip
            return seq2seq_examples.seq2seq_input(examples, cfg, split, shard, tokenizer, data.seq_len, targets)
        if self.layout == "stream":
            tokens = lm_examples.tokenize_stream(self.documents(split), tokenizer)
            shift_seed = cfg.input_random_seed if split == "train" else None
            windows = lm_examples.StreamWindows(tokens, data.seq_len, shift_seed=shift_seed)
            return token_rows_input(windows, data, split, tokenizer, shard)
        docs = self.documents(split)
        docs = docs if isinstance(docs, grain.MapDataset) else grain.MapDataset.source(docs)
        if cfg.repeat:
            # Lazy: this host's documents, shuffled per epoch, tokenized and packed as they stream by.
            mine = shard_examples(docs, cfg, shard).map(lambda d: lm_examples.document_example(d, tokenizer))
            rows = lm_examples.pack_documents(mine.to_iter_dataset(read_options(cfg)), data.seq_len)
            batches = rows.batch(cfg.batch_size, drop_remainder=True)
            return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer)
        # A finite epoch must end on every host after the same number of batches, so every host packs
        # the whole split the same way (eval sets are small), then takes and pads its share of rows.
        every = docs.map(lambda d: lm_examples.document_example(d, tokenizer)).to_iter_dataset(read_options(cfg))
        rows = list(lm_examples.pack_documents(every, data.seq_len))
        return token_rows_input(grain.MapDataset.source(rows), data, split, tokenizer, shard)


@config
class TextFileDocuments(TextDocuments, FileSource):
    """Documents read from the files at `path` (text_files, jsonl): the files must exist."""

    suffixes: ClassVar[tuple[str, ...]] = ()

    def check(self, data: DataConfig, files: bool) -> None:
        super().check(data, files)
        if files:
            file_readers.resolve_paths(self.path, "data.path", suffixes=self.suffixes)
            if self.eval_path:
                file_readers.resolve_paths(self.eval_path, "data.eval_path", suffixes=self.suffixes)


@config
class GeneratedExamples(DataSource):
    """num_synthetic_examples: examples per epoch (made up, not read)."""

    num_synthetic_examples: int = 1024

    def validate(self) -> None:
        super().validate()
        check_range(self, "num_synthetic_examples", gt=0, prefix="data")


@config
class TokenIdRows(GeneratedExamples):
    """Rows of token ids made up without text (synthetic, random): nothing to train a
    SentencePiece model on, so one without a model_path prints samples as bytes (`--data.source
    synthetic` on a C4 experiment, a benchmark run)."""

    has_text: ClassVar[bool] = False

    def check_decodable(self, data: DataConfig, split: Split) -> None:
        """ConfigError for a stored example of `split` that cannot be read, where examples are
        decoded one by one as batches are made (encoded images), so that a bad file stops a run
        before it starts, not at the first eval (programs/preflight.py; which files are read and
        how many: the source's own rule). Nothing by default: the other sources read or check
        their files when their input is built."""

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Any: a SentencePiece model without a file prints samples as bytes (build_tokenizer)."""

    def inert_data_fields(self, data: DataConfig) -> dict[str, str]:
        inert = super().inert_data_fields(data)
        if data.tokenizer.kind == "sentencepiece" and not data.tokenizer.model_path:
            inert["tokenizer"] = (
                f"{self.flag} gives token ids and no text, so a SentencePiece tokenizer without "
                "data.tokenizer.model_path has nothing to learn from (samples print as bytes)"
            )
        return inert

    def build_tokenizer(self, data: DataConfig, job_dir: str | os.PathLike | None) -> Tokenizer:
        if data.tokenizer.kind == "sentencepiece" and not data.tokenizer.model_path:
            return ByteTokenizer()
        return super().build_tokenizer(data, job_dir)


@config
class ImageSource(DataSource):
    """image_shape: [H, W, C] of the images (empty = no check; a source that makes images
    requires it). augment: random crop / flip of training batches, per-channel normalisation of
    both splits (augment.py). Batches: inputs [B, H, W, C] float32, labels [B], weights [B]."""

    reads_tokens: ClassVar[bool] = False
    has_text: ClassVar[bool] = False

    image_shape: tuple[int, ...] = ()
    augment: AugmentConfig = AugmentConfig()

    def validate(self) -> None:
        super().validate()
        if self.image_shape:
            images.check_image_shape_field(self.image_shape)
            check_range(self, "image_shape", gt=0, prefix="data")
            self.augment.check_image_shape(tuple(self.image_shape), self.kind)

    def draws_from_seed(self, split: Split, data: DataConfig) -> bool:
        return split == "train" and self.augment.randomizes

    def check(self, data: DataConfig, files: bool) -> None:
        super().check(data, files)
        spec = self.example_spec()
        if spec is not None:
            self.augment.check_image_shape(spec.input_shape, self.kind)

    def describe(self, data: DataConfig) -> str:
        return f"{self.flag} augment={self.augment!r}"

    @property
    def normalization(self) -> AugmentConfig:
        return self.augment

    def split_examples(self, split: Split) -> grain.MapDataset:
        """The split's examples, before normalisation, sharding and batching (images.py)."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its images are.")

    def build_input(self, data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
        examples = self.split_examples(split)
        return images.image_input(examples, getattr(data, split), self.augment, split, shard, self.kind,
                                  tuple(self.image_shape))  # fmt: skip
