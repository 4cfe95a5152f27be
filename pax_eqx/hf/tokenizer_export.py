"""The tokenizer files of an export_hf of a model trained here, and what they honestly are.

    made = tokenizer_files(tokenizer, data.tokenizer)
    made.files          # {"tokenizer.json": text, "tokenizer_config.json": text} or {}
    made.special_ids    # {"bos_token_id": 2, ...}: for config.json
    made.note           # the line export_hf prints: what was written, or why nothing was

By the job's tokenizer (`data.build_tokenizer`):

- byte (`--data.tokenizer byte`, shakespeare_char's): a tokenizer.json that gives the same ids,
  made with the `tokenizers` library: a byte-level BPE with no merges, so each UTF-8 byte b is
  the token b + 4, and pad, unk, bos, eos are <pad>, <unk>, <s>, </s> at ids 0..3 (pax_eqx's
  fixed specials). One difference, said in the note: a text that spells a special (the five
  characters "</s>") is read by Hugging Face as that special token, where pax_eqx reads its bytes.
- a Hugging Face tokenizer.json (`--data.tokenizer tokenizer_json`): that file, and the
  tokenizer_config.json beside it if there is one, else one naming the configured specials.
- SentencePiece: nothing. pax_eqx trains it with no dummy prefix (data.tokenizers), and
  transformers' SentencePiece tokenizers prepend one anyway (LlamaTokenizer and its fast
  conversion), so a tokenizer.model here would encode text to other ids; the note says where
  the model file is, for the `sentencepiece` library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pax_eqx.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    ByteTokenizer,
    SentencePieceTokenizer,
    TokenizerJsonTokenizer,
    _byte_level_chars,  # GPT-2's byte alphabet, the one the tokenizers library's ByteLevel uses
)
from pax_eqx.extras import require

BYTE_SPECIALS = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


@dataclass(frozen=True)
class TokenizerFiles:
    """files: name -> text to write into the export; special_ids: config.json's token ids (those
    the tokenizer has); note: one line saying what the files are, or why there are none."""

    files: dict[str, str]
    special_ids: dict[str, int]
    note: str


def tokenizer_files(tokenizer: Any, cfg: Any = None) -> TokenizerFiles:
    """The files for `tokenizer` (a pax_eqx Tokenizer); cfg: data.tokenizer, which says whether a
    tokenizer.json's pad token was named (its pad_id is 0 either way)."""
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}
    if isinstance(tokenizer, ByteTokenizer):
        return TokenizerFiles(
            _byte_level_json(),
            {**ids, "pad_token_id": tokenizer.pad_id},
            "Tokenizer: the byte tokenizer as a byte-level tokenizer.json (byte b is id b + 4; <pad> <unk> <s> </s> "
            "are 0-3), written with tokenizer_config.json; a text spelling a special such as '</s>' is read by Hugging "
            "Face as that token, by pax_eqx as its bytes.",
        )
    if isinstance(tokenizer, TokenizerJsonTokenizer):
        pad = bool(getattr(cfg, "pad_token", ""))
        if pad:
            ids["pad_token_id"] = tokenizer.pad_id
        return TokenizerFiles(
            _tokenizer_json(tokenizer, pad),
            ids,
            f"Tokenizer: copied {tokenizer.path} as tokenizer.json, with tokenizer_config.json.",
        )
    if isinstance(tokenizer, SentencePieceTokenizer):
        where = f" ({tokenizer.path})" if tokenizer.path else ""
        return TokenizerFiles(
            {},
            {**ids, "pad_token_id": tokenizer.pad_id},
            f"Tokenizer: none written. The job's SentencePiece model{where} is trained without a dummy prefix, which "
            "transformers' SentencePiece tokenizers add anyway, so they would give other ids; encode with the "
            "sentencepiece library and that file.",
        )
    return TokenizerFiles({}, ids, f"Tokenizer: none written ({type(tokenizer).__name__} has no Hugging Face form).")


def _byte_level_json() -> dict[str, str]:
    """tokenizer.json + tokenizer_config.json giving pax_eqx's byte tokenizer's ids."""
    tk = require("tokenizers", "hf", "python -m pax_eqx.export_hf")
    offset = ByteTokenizer().encode("\x00")[0]  # byte 0's id: the specials come first
    vocab = {text: i for i, text in BYTE_SPECIALS.items()}
    vocab.update({char: b + offset for b, char in enumerate(_byte_level_chars())})
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[], unk_token=BYTE_SPECIALS[UNK_ID]))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in BYTE_SPECIALS.values()])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BYTE_SPECIALS[BOS_ID], "eos_token": BYTE_SPECIALS[EOS_ID], "pad_token": BYTE_SPECIALS[PAD_ID],
        "unk_token": BYTE_SPECIALS[UNK_ID],
        "clean_up_tokenization_spaces": False,  # transformers' default would glue " ." into "." on decode
    }  # fmt: skip
    return {"tokenizer.json": tok.to_str(pretty=True), "tokenizer_config.json": _json(config)}


def _tokenizer_json(tokenizer: TokenizerJsonTokenizer, pad: bool) -> dict[str, str]:
    path = Path(tokenizer.path)
    files = {"tokenizer.json": path.read_text()}
    beside = path.parent / "tokenizer_config.json"
    if beside.is_file():
        files["tokenizer_config.json"] = beside.read_text()
        return files
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for key, i in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id)):
        config[key] = tokenizer.token_text(i)
    if pad:
        config["pad_token"] = tokenizer.token_text(tokenizer.pad_id)
    files["tokenizer_config.json"] = _json(config)
    return files


def _json(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=True) + "\n"
