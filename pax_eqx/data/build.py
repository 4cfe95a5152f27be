"""The two builders programs call: an experiment's tokenizer, and each split's Input from its
DataConfig (data_config.py says what each source and layout is).

    tokenizer = build_tokenizer(exp.data, job_dir)          # same object for every split
    train = build_input(exp.data, "train", tokenizer)       # this host's shard, from jax
    ev = build_input(exp.data, "eval", tokenizer, num_infeed_hosts=2, infeed_host_index=1)
"""

from __future__ import annotations

import os

import grain

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    array_record_source,
    digits,
    imagenet_source,
    images,
    lm_examples,
    seq2seq_examples,
    shakespeare,
    sources,
)
from pax_eqx.data.data_config import (
    ID_SOURCES,
    TRAINABLE_SOURCES,
    DataConfig,
    custom_input_factory,
    is_seq2seq,
    target_length,
)
from pax_eqx.data.host_sharding import (
    HostShard,
    batch_host_examples,
    resolve_host_shard,
    shard_examples,
    zeros_like_example,
)
from pax_eqx.data.input import Input, read_options
from pax_eqx.data.input_config import InputConfig, Split
from pax_eqx.data.tokenizers import (
    ByteTokenizer,
    Tokenizer,
    TokenizerJsonTokenizer,
    check_same_tokenizer,
    load_or_train_sentencepiece,
)


def build_tokenizer(data: DataConfig, job_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The experiment's one tokenizer: byte-level, or SentencePiece (loaded from / trained into
    JOB_DIR/tokenizer/spm.model; with no job dir it is trained in memory and not kept)."""
    data.tokenizer.validate()
    if data.source == "array_record":  # the prepared corpus's own, checked against the manifest
        return array_record_source.load_tokenizer(data)
    if data.tokenizer.kind == "byte":
        return ByteTokenizer()
    if data.tokenizer.kind == "tokenizer_json":  # a file given, as an imported open model's
        return TokenizerJsonTokenizer.load(data.tokenizer)
    if data.source in ID_SOURCES and not data.tokenizer.model_path:
        # `--data.source synthetic` on a SentencePiece experiment (a C4 benchmark run): the rows are
        # ids already, so the tokenizer only prints samples; bytes need no training text.
        return ByteTokenizer()
    return load_or_train_sentencepiece(data.tokenizer, job_dir, _training_lines(data))


def build_input(
    data: DataConfig,
    split: Split,
    tokenizer: Tokenizer,
    num_infeed_hosts: int | None = None,
    infeed_host_index: int | None = None,
) -> Input:
    """This host's Input for `split`. Hosts default to jax.process_count() / process_index()."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}.")
    cfg: InputConfig = getattr(data, split)
    cfg.validate(split)
    shard = resolve_host_shard(cfg, num_infeed_hosts, infeed_host_index)
    if data.source == "custom":
        inp = custom_input_factory(data.custom_input)(data, split, tokenizer, shard)
        if not isinstance(inp, Input):
            raise ConfigError(f"data.custom_input={data.custom_input!r} returned {type(inp).__name__}, not an Input.")
        if inp.tokenizer is not None:
            check_same_tokenizer({"experiment": tokenizer, f"data.custom_input ({split})": inp.tokenizer})
        return inp
    if data.source in imagenet_source.SOURCES:
        data._validate_images()
        return imagenet_source.imagenet_input(data, split, shard)
    if data.source in images.IMAGE_SOURCES:
        data._validate_images()
        examples = images.split_examples(data, split)
        return images.image_input(examples, cfg, data.augment, split, shard, data.source, tuple(data.image_shape))
    if data.source == "digits":
        examples = digits.digits_examples(split, data.eval_fraction)
        batches, per_epoch = batch_host_examples(examples, cfg, shard, zeros_like_example(examples[0]))
        return Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch)
    if data.source == "array_record":
        return array_record_source.prepared_input(data, split, tokenizer, shard)
    if data.source in ("synthetic", "random"):
        return _lm_input(_synthetic_examples(data, split, tokenizer), data, split, tokenizer, shard)
    if is_seq2seq(data):
        return _seq2seq_input(data, split, tokenizer, shard)
    if data.layout == "stream":
        tokens = lm_examples.tokenize_stream(_documents(data, split), tokenizer)
        shift_seed = cfg.input_random_seed if split == "train" else None
        windows = lm_examples.StreamWindows(tokens, data.seq_len, shift_seed=shift_seed)
        return _lm_input(windows, data, split, tokenizer, shard)
    return _packed_input(data, split, tokenizer, shard)


def _lm_input(
    examples: grain.MapDataset, data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard
) -> Input:
    cfg: InputConfig = getattr(data, split)
    batches, per_epoch = batch_host_examples(examples, cfg, shard, lm_examples.pad_example(data.seq_len))
    return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer, num_batches_per_epoch=per_epoch)


def _seq2seq_input(data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
    data._validate_seq2seq()
    cfg: InputConfig = getattr(data, split)
    targets = target_length(data)
    if data.source == "seq2seq_jsonl":
        examples = seq2seq_examples.pair_examples(_pairs(data, split), tokenizer, data.seq_len, targets)
    else:
        tokens = lm_examples.tokenize_stream(_documents(data, split), tokenizer)
        examples = seq2seq_examples.span_corruption_examples(
            tokens,
            data.span_corruption,
            data.seq_len,
            targets,
            tokenizer,
            seed=cfg.input_random_seed,
            train=split == "train",
        )
    pad = seq2seq_examples.pad_example(data.seq_len, targets)
    batches, per_epoch = batch_host_examples(examples, cfg, shard, pad)
    return seq2seq_examples.Seq2SeqInput(
        batches, cfg, split=split, shard=shard, tokenizer=tokenizer, num_batches_per_epoch=per_epoch
    )


def _packed_input(data: DataConfig, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
    cfg: InputConfig = getattr(data, split)
    docs = _documents(data, split)
    docs = docs if isinstance(docs, grain.MapDataset) else grain.MapDataset.source(docs)
    if cfg.repeat:
        # Lazy: this host's documents, shuffled per epoch, tokenized and packed as they stream by.
        mine = shard_examples(docs, cfg, shard).map(lambda d: lm_examples.document_example(d, tokenizer))
        rows = lm_examples.pack_documents(mine.to_iter_dataset(read_options(cfg)), data.seq_len)
        batches = rows.batch(cfg.batch_size, drop_remainder=True)
        return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer)
    # A finite epoch must end on every host after the same number of batches, so every host packs
    # the whole split the same way (eval sets are small), then takes and pads its share of rows.
    all_docs = docs.map(lambda d: lm_examples.document_example(d, tokenizer)).to_iter_dataset(read_options(cfg))
    rows = list(lm_examples.pack_documents(all_docs, data.seq_len))
    return _lm_input(grain.MapDataset.source(rows), data, split, tokenizer, shard)


def _split_files(data: DataConfig, split: Split) -> tuple[str, str, str | None]:
    """(path spec, its field name, the split to hold out of it or None) for a file source."""
    use_eval_path = split == "eval" and data.eval_path
    spec = data.eval_path if use_eval_path else data.path
    field = "data.eval_path" if use_eval_path else "data.path"
    return spec, field, None if data.eval_path else split


def _pairs(data: DataConfig, split: Split) -> grain.MapDataset:
    """The split's (inputs, targets) strings for source seq2seq_jsonl."""
    spec, field, held_out_split = _split_files(data, split)
    return sources.jsonl_pairs(
        spec, field, data.jsonl_inputs_key, data.jsonl_targets_key, held_out_split, data.eval_fraction
    )


def _documents(data: DataConfig, split: Split) -> list[str] | grain.MapDataset:
    """The split's documents (strings) for a text source."""
    if data.source == "shakespeare":
        return shakespeare.shakespeare_documents(split, data.eval_fraction)
    spec, field, held_out_split = _split_files(data, split)
    if data.source == "text_files":
        return sources.text_file_documents(spec, field, held_out_split, data.eval_fraction)
    if data.source == "jsonl":
        return sources.jsonl_documents(spec, field, data.jsonl_text_key, held_out_split, data.eval_fraction)
    raise ConfigError(f"data.source={data.source!r} has no documents.")


def _training_lines(data: DataConfig):
    """Lines of the training split, for training a SentencePiece model (both fields of a pair)."""
    if data.source not in TRAINABLE_SOURCES:
        raise ConfigError(
            f"data.tokenizer sentencepiece is trained from text, but data.source={data.source!r} has none; "
            "use --data.tokenizer byte, or set --data.tokenizer.model-path."
        )
    if data.source == "seq2seq_jsonl":
        for pair in _pairs(data, "train"):
            for text in pair:
                yield from text.split("\n")
        return
    for doc in _documents(data, "train"):
        yield from doc.split("\n")


def _synthetic_examples(data: DataConfig, split: Split, tokenizer: Tokenizer) -> grain.MapDataset:
    n = data.num_synthetic_examples
    if data.source == "synthetic":
        row = lm_examples.synthetic_example(data.seq_len)
        return grain.MapDataset.range(n).map(lambda _: row)
    seed = getattr(data, split).input_random_seed
    return lm_examples.RandomTokens(n, data.seq_len, tokenizer.vocab_size, seed)
