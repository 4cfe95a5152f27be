"""The two builders programs call: an experiment's tokenizer, and each split's Input from its
DataConfig. Each asks the chosen source (data_source.py); they trust the configs they are given,
which checked themselves when they were made.

    tokenizer = build_tokenizer(exp.data, job_dir)          # same object for every split
    train = build_input(exp.data, "train", tokenizer)       # this host's shard, from jax
    ev = build_input(exp.data, "eval", tokenizer, num_infeed_hosts=2, infeed_host_index=1)
"""

from __future__ import annotations

import os

from pax_eqx.config import ConfigError
from pax_eqx.data.data_config import DataConfig
from pax_eqx.data.host_sharding import resolve_host_shard
from pax_eqx.data.input import Input
from pax_eqx.data.input_config import Split
from pax_eqx.data.tokenizers import Tokenizer, largest_id, token_name


def build_tokenizer(data: DataConfig, job_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The experiment's one tokenizer: byte-level, a tokenizer.json, or SentencePiece (loaded from /
    trained into JOB_DIR/tokenizer/spm.model; with no job dir it is trained in memory and not
    kept), as the source has it (a prepared corpus's own)."""
    return data.source.build_tokenizer(data, job_dir)


def check_token_ids(data: DataConfig, tokenizer: Tokenizer, vocab: int) -> None:
    """ConfigError when an id the batches of `data` can hold -- the tokenizer's, its specials,
    and the ids the source adds (span corruption's sentinels) -- is not below the model's `vocab`
    (model.vocab_size): such an id has no embedding row and no logit, and its loss is NaN."""
    added = data.source.added_token_ids(data.seq_len)
    if tokenizer.vocab_size + added > vocab:
        extra = f" plus {added} span-corruption sentinels" if added else ""
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens{extra} but model.vocab_size={vocab}; set "
            f"model.vocab_size >= {tokenizer.vocab_size + added}."
        )
    top = largest_id(tokenizer)
    if top >= vocab:
        path = getattr(tokenizer, "path", "")
        raise ConfigError(
            f"the tokenizer{f' {path!r}' if path else ''} gives token ids up to {top}{token_name(tokenizer, top)}, "
            f"but model.vocab_size={vocab}: ids >= {vocab} have no embedding row, and their loss is NaN; set "
            f"model.vocab_size >= {top + 1} "
            "(--model.vocab-size), or use the tokenizer the model was trained with."
        )


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
    shard = resolve_host_shard(getattr(data, split), num_infeed_hosts, infeed_host_index)
    return data.source.build_input(data, split, tokenizer, shard)
