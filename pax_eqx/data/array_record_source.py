"""`--data.source array_record`: a corpus prepared by `python -m pax_eqx.prepare_data`, read with
grain's ArrayRecordDataSource.

    --data.source array_record --data.path prepared/c4 [--data.eval-path prepared/c4_validation]

The prepared directory's manifest.json (prepare/manifest.py) is checked against the experiment
before anything is read, each mismatch one line naming the field and the fix: the
sequence length of pre-packed rows, and the tokenizer (its fingerprint: the experiment
encodes prompts and decodes samples with exactly the vocabulary the corpus was tokenized
with). Every shard file is checked against the manifest's size and fingerprint of it
(prepare/integrity.py) each time the directory is opened -- a training start and every resume
-- so a shard cut short, replaced by another preparation's or swapped with another is refused
at start, naming it, rather than trained on; so is a corpus with no tokens. With
--data.tokenizer sentencepiece and no model_path, the prepared directory's own model is the
experiment's tokenizer.

Reading follows the other sources (host_sharding.py): grain's MapDataset index shuffle over
all records (a fresh order each epoch), each host taking positions index::count of it, repeat
for training, the iterator state in every checkpoint for exact resume. Records are read lazily
by index, so a corpus of any size costs only its open files. Then:

- layout "documents", training (and a rolling eval): each document becomes [bos] + tokens /
  tokens + [eos] and this host's documents are packed into rows as they stream by
  (lm_examples.pack_documents, as `--data.layout packed` packs text);
- layout "documents", a finite eval epoch: Pax's eval contract for C4 (an unpacked,
  pretokenized split): one row per document, its first seq_len predictions, padded; rows
  padded so every host ends after the same number of batches;
- layout "rows": the prepared rows as they are.

Without data.eval_path, every round(1 / eval_fraction)-th record is the eval split and the
rest the training split (as for JSON lines).

A mixture: data.path names several prepared directories (comma-separated) and
data.mixture_weights their weights (equal if empty). Training draws each document (or row) from
directory i with probability weight_i / sum(weights), each directory shuffled and repeated on
its own (SeqIO's Mixture; mixtures.py), then packs the mixed documents. The eval split is
data.eval_path, or the held-out records of every directory, in order. The directories must share
one tokenizer and one layout.
"""

from __future__ import annotations

import os

import grain
import numpy as np

from pax_eqx.config import SEED_MAX, ConfigError, MissingFileError
from pax_eqx.data import file_readers, lm_examples
from pax_eqx.data.host_sharding import HostShard, batch_host_examples, shard_examples
from pax_eqx.data.input import Input, read_options
from pax_eqx.data.input_config import InputConfig, Split
from pax_eqx.data.mixtures import SampledMix, mixture_probabilities
from pax_eqx.data.prepare import integrity, records
from pax_eqx.data.prepare.manifest import Manifest, read_manifest
from pax_eqx.data.tokenizers import (
    ByteTokenizer,
    ByteTokenizerConfig,
    SentencePieceConfig,
    SentencePieceTokenizer,
    Tokenizer,
    TokenizerConfig,
    TokenizerJsonConfig,
)


class PreparedCorpusError(integrity.ShardIntegrityError):
    """A prepared directory whose shards are not what its manifest says (cut short, overwritten,
    replaced): found at start, before anything is written."""


_REPREPARE = (
    "copy the whole prepared directory again, or prepare it again (python -m pax_eqx.prepare_data into a new "
    "--output-dir)."
)


class PreparedCorpus:
    """A prepared directory: its manifest and its shard files (checked to exist, and to be the
    files the manifest lists: integrity.py)."""

    def __init__(self, directory: str, field: str):
        self.directory = directory
        self.field = field
        self.manifest: Manifest = read_manifest(directory, field)
        self.paths = [os.path.join(directory, s["file"]) for s in self.manifest.shards]
        missing = [p for p in self.paths if not os.path.isfile(p)]
        if missing:
            raise MissingFileError(
                f"{field}={directory!r}: {len(missing)} shard file(s) its manifest lists are missing (first "
                f"{missing[0]!r}); copy the whole prepared directory, or prepare it again."
            )
        where = f"{field}={directory!r}"
        try:
            integrity.verify_shards(directory, self.manifest.shards, where, _REPREPARE)
        except integrity.ShardIntegrityError as e:
            raise PreparedCorpusError(str(e)) from None
        if self.manifest.num_records and not self.manifest.num_tokens:
            raise ConfigError(
                f"{where} holds {self.manifest.num_documents} documents but no tokens (every text is empty): a model "
                "would learn nothing (bits_per_byte NaN); prepare a corpus with text."
            )

    def records(self) -> grain.sources.RandomAccessDataSource:
        """All records of all shards, in shard order (grain's ArrayRecordDataSource)."""
        if self.manifest.num_records == 0:
            raise ConfigError(f"{self.field}={self.directory!r} holds no records; prepare a corpus with documents.")
        try:
            source = grain.sources.ArrayRecordDataSource(self.paths)
        except (RuntimeError, OSError, ValueError) as e:  # a truncated or overwritten shard file
            raise PreparedCorpusError(f"{self.field}={self.directory!r}: {self._unreadable_shard(e)}") from None
        if len(source) != self.manifest.num_records:
            raise PreparedCorpusError(
                f"{self.field}={self.directory!r}: its shards hold {len(source)} records but its manifest "
                f"{self.manifest.num_records}: a shard was replaced or cut; copy the whole prepared directory "
                "again, or prepare it again."
            )
        return source

    def _unreadable_shard(self, error: BaseException) -> str:
        """Which shard file cannot be read, and what to do (the reader's error names no file)."""
        for path, shard in zip(self.paths, self.manifest.shards):
            try:
                records = len(grain.sources.ArrayRecordDataSource([path]))
            except (RuntimeError, OSError, ValueError) as e:
                size = os.path.getsize(path)
                return (
                    f"shard {shard['file']!r} cannot be read ({e}; {size:,} bytes): it was cut short or overwritten; "
                    "copy the whole prepared directory again, or prepare it again."
                )
            if records != shard["records"]:
                return (
                    f"shard {shard['file']!r} holds {records} records, its manifest {shard['records']}; copy the "
                    "whole prepared directory again, or prepare it again."
                )
        return f"its shards cannot be read ({error}); prepare it again."

    def describe(self) -> str:
        m = self.manifest
        shape = f"rows of {m.seq_len}" if m.layout == "rows" else "documents"
        tok = f"{m.tokenizer['kind']} {m.tokenizer['fingerprint']}"
        return f"prepared corpus {self.directory!r} ({shape}, tokenizer {tok})"


def corpora(data) -> dict[str, PreparedCorpus]:
    """{field: PreparedCorpus} of each directory of data.path and, if set, data.eval_path."""
    dirs = data.source.directories()
    found = {
        ("data.path" if len(dirs) == 1 else f"data.path[{i}]"): PreparedCorpus(d, "data.path")
        for i, d in enumerate(dirs)
    }
    if data.source.eval_path:
        found["data.eval_path"] = PreparedCorpus(data.source.eval_path, "data.eval_path")
    return found


def check_mixture(data) -> None:
    """data.mixture_weights: one positive weight per directory of data.path, and only for a mixture."""
    dirs = data.source.directories()
    if not data.source.mixture_weights:
        return
    if len(dirs) == 1:
        raise ConfigError(
            f"data.mixture_weights={list(data.source.mixture_weights)} would do nothing: data.path names one prepared "
            "directory; name several, comma-separated, to mix them, or remove the weights."
        )
    weights = data.source.mixture_weights
    if len(weights) != len(dirs):
        raise ConfigError(
            f"data.mixture_weights={list(weights)} gives {len(weights)} weight(s) for the "
            f"{len(dirs)} directories of data.path; give one weight per directory."
        )
    mixture_probabilities(data.source.mixture_weights)


def check_config(data) -> None:
    """The experiment's layout and seq_len against each prepared directory's manifest, and the
    training and eval directories against each other (one tokenizer, one layout)."""
    check_mixture(data)
    found = corpora(data)
    for field, corpus in found.items():
        m = corpus.manifest
        if m.layout == "rows" and m.seq_len != data.seq_len:
            raise ConfigError(
                f"data.seq_len={data.seq_len} but {field}={corpus.directory!r} holds rows of {m.seq_len} tokens "
                f"(prepared with --layout rows --seq-len {m.seq_len}); set --data.seq-len {m.seq_len}, or prepare "
                "with --layout documents to choose the length when reading."
            )
        if m.tokenizer["kind"] != data.tokenizer.kind:
            raise ConfigError(
                f"data.tokenizer is {data.tokenizer.kind} but {field}={corpus.directory!r} was tokenized with "
                f"{m.tokenizer['kind']} ({m.tokenizer['fingerprint']}); drop the flag (the corpus's own tokenizer "
                f"is the experiment's), or use --data.tokenizer {m.tokenizer['kind']}."
            )
        cfg = data.tokenizer
        pieces = m.tokenizer.get("vocab_size")
        if cfg.kind == "sentencepiece" and not cfg.model_path and cfg.model_type != "char" and pieces:
            if cfg.vocab_size != pieces:
                raise ConfigError(
                    f"data.tokenizer.vocab_size={cfg.vocab_size} but {field}={corpus.directory!r} was tokenized with "
                    f"a SentencePiece model of {pieces} pieces; drop the flag (the corpus's own tokenizer is the "
                    f"experiment's), or set --data.tokenizer.vocab-size {pieces}."
                )
    (first_field, first), *others = found.items()
    for field, corpus in others:
        a, b = first.manifest, corpus.manifest
        if a.tokenizer["fingerprint"] != b.tokenizer["fingerprint"]:
            raise ConfigError(
                f"{field}={corpus.directory!r} was tokenized with {b.tokenizer['fingerprint']} and {first_field}="
                f"{first.directory!r} with {a.tokenizer['fingerprint']}; prepare both with the same tokenizer "
                "(--tokenizer.model-path the first one's tokenizer/spm.model)."
            )
        if field != "data.eval_path" and a.layout != b.layout:
            raise ConfigError(
                f"{field}={corpus.directory!r} holds {b.layout} and {first_field}={first.directory!r} {a.layout}; a "
                "mixture's directories must be prepared with one --layout."
            )


def tokenizer_config(manifest: Manifest, directory: str) -> TokenizerConfig:
    """The tokenizer config of a prepared corpus: the one it was prepared with, a file it names
    being the directory's own copy (a SentencePiece model_path "" means that copy, `load_tokenizer`)."""
    kind = manifest.tokenizer["kind"]
    prepared = {k: v for k, v in manifest.config.get("tokenizer", {}).items() if k != "kind"}
    if kind == "sentencepiece":
        return SentencePieceConfig(
            vocab_size=int(manifest.tokenizer.get("vocab_size") or prepared.get("vocab_size", 1024)),
            model_type=prepared.get("model_type", "unigram"),
            byte_fallback=bool(prepared.get("byte_fallback", False)),
        )
    if kind == "tokenizer_json":
        tokens = {k: prepared[k] for k in ("bos_token", "eos_token", "pad_token") if k in prepared}
        return TokenizerJsonConfig(path=os.path.join(directory, manifest.tokenizer["file"]), **tokens)
    return ByteTokenizerConfig()


def load_tokenizer(data) -> Tokenizer:
    """The experiment's tokenizer for a prepared corpus: bytes; SentencePiece from
    data.tokenizer.model_path, else the prepared directory's own model; a tokenizer.json from
    data.tokenizer.path. Refused unless its fingerprint is the manifest's."""
    directory = data.source.directories()[0]
    prepared = PreparedCorpus(directory, "data.path").manifest.tokenizer
    cfg = data.tokenizer
    if cfg.kind == "byte":
        tokenizer: Tokenizer = ByteTokenizer()
    elif cfg.kind == "sentencepiece":
        if cfg.model_path:
            tokenizer = SentencePieceTokenizer.load(cfg.model_path)
        else:
            tokenizer = SentencePieceTokenizer.load(os.path.join(directory, prepared["file"]))
        if tokenizer.vocab_size != cfg.vocab_size and cfg.model_type != "char":
            raise ConfigError(
                f"data.tokenizer.vocab_size={cfg.vocab_size} but data.path={data.source.path!r} was tokenized with a "
                f"SentencePiece model of {tokenizer.vocab_size} pieces; set --data.tokenizer.vocab-size "
                f"{tokenizer.vocab_size}."
            )
    else:  # tokenizer_json: the file the experiment names, which must be the one the corpus used
        from pax_eqx.data import tokenizers

        tokenizer = tokenizers.TokenizerJsonTokenizer.load(cfg)
    if tokenizer.fingerprint != prepared["fingerprint"]:
        raise ConfigError(
            f"the experiment's tokenizer {tokenizer!r} ({tokenizer.fingerprint}) is not the one data.path="
            f"{data.source.path!r} was tokenized with ({prepared['fingerprint']}); give that one (its "
            f"{prepared['file'] or 'byte tokenizer'}), or prepare the corpus with this tokenizer."
        )
    return tokenizer


def prepared_input(data, split: Split, tokenizer: Tokenizer, shard: HostShard) -> Input:
    """This host's Input of `split` from the prepared corpus or mixture (module doc)."""
    cfg: InputConfig = getattr(data, split)
    if split == "eval" and data.source.eval_path:
        parts = [(PreparedCorpus(data.source.eval_path, "data.eval_path"), None)]
    else:
        parts = [(corpus, split) for field, corpus in corpora(data).items() if field != "data.eval_path"]
    for corpus, _ in parts:
        if corpus.manifest.tokenizer["fingerprint"] != tokenizer.fingerprint:
            raise ConfigError(
                f"{corpus.field}={corpus.directory!r} was tokenized with {corpus.manifest.tokenizer['fingerprint']}, "
                f"not the experiment's tokenizer {tokenizer.fingerprint}; build the input with build_tokenizer(data)."
            )
    recs = [
        file_readers.held_out_records(
            corpus.records(), corpus.directory, corpus.field, held_out, data.source.eval_fraction
        )
        for corpus, held_out in parts
    ]
    layout, seq_len = parts[0][0].manifest.layout, data.seq_len
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    pad = lm_examples.pad_example(seq_len)

    def example(record: bytes):
        if layout == "rows":
            return records.row_example(record, seq_len)
        return records.document_example(records.document_tokens(record), bos, eos)

    if split == "eval":  # one epoch of every eval record, in order: Pax's unpacked eval rows, or the prepared rows
        every = recs[0] if len(recs) == 1 else grain.MapDataset.concatenate(recs)
        if layout == "rows":
            rows = every.map(example)
        else:
            rows = every.map(lambda r: unpacked_row(records.document_tokens(r), seq_len, bos, eos))
        batches, per_epoch = batch_host_examples(rows, cfg, shard, pad)
        return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer, num_batches_per_epoch=per_epoch)
    if len(recs) == 1:
        mixed = shard_examples(recs[0], cfg, shard).map(example).to_iter_dataset(read_options(cfg))
    else:  # each directory shuffled with a seed of its own, repeated on its own, then sampled
        parts_iter = [
            shard_examples(r, cfg.replace(input_random_seed=(cfg.input_random_seed + 7919 * (k + 1)) % SEED_MAX), shard)
            .map(example)
            .to_iter_dataset(read_options(cfg))
            for k, r in enumerate(recs)
        ]
        weights = data.source.mixture_weights or (1.0,) * len(recs)
        mixed = SampledMix(parts_iter, weights, seed=cfg.input_random_seed)
    if layout == "rows":
        batches = mixed.batch(cfg.batch_size, drop_remainder=True)
    else:
        batches = lm_examples.pack_documents(mixed, seq_len).batch(cfg.batch_size, drop_remainder=True)
    return Input(batches, cfg, split=split, shard=shard, tokenizer=tokenizer)


def unpacked_row(tokens: np.ndarray, seq_len: int, bos_id: int, eos_id: int) -> lm_examples.Example:
    """One document as one row (Pax's pretokenized, unpacked eval): ids = ([bos] + tokens)[:seq_len],
    labels = (tokens + [eos])[:seq_len], padded with weight 0; one segment."""
    ids = np.concatenate([[bos_id], tokens])[:seq_len].astype(np.int32)
    labels = np.concatenate([tokens, [eos_id]])[:seq_len].astype(np.int32)
    n = len(ids)
    real = np.arange(seq_len) < n
    return {
        "ids": np.pad(ids, (0, seq_len - n)),
        "labels": np.pad(labels, (0, seq_len - n)),
        "weights": real.astype(np.float32),
        "segment_ids": real.astype(np.int32),
        "segment_pos": np.where(real, np.arange(seq_len), 0).astype(np.int32),
    }
