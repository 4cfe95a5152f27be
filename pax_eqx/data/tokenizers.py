"""Tokenizers: byte-level (no files), SentencePiece trained locally from the training text, and a
Hugging Face `tokenizer.json` (the `tokenizers` library) such as an imported open model's.

Both share one small interface, `Tokenizer`: `encode(str) -> list[int]`, `decode(ids) -> str`,
`vocab_size`, `pad_id` (always 0, so zero-filled padding rows are padding), `bos_id`,
`eos_id`, `unknown_characters(text)` (what a prompt cannot be encoded with; "" if it all can)
and `fingerprint` (a short hash of the vocabulary, used to refuse train and eval inputs built
with different tokenizers -- the seed's "users must ensure that the tokenizers used by the
inputs are identical").

SentencePiece is trained with identity normalisation, no whitespace folding, no dummy prefix
and "\\n" as a user symbol, so `decode(encode(text)) == text` for any text whose characters
are in the vocabulary (Pax's default SentencePiece models fold whitespace, which would turn a
play into one long line). The model file is written into the job dir and reused on resume,
eval and decode, so every program of a job sees the same vocabulary.

A `tokenizer.json` is used as Hugging Face uses it: `encode` applies its own post-processor
(Llama's tokenizer puts <s> first, GPT-2's adds nothing), `decode` drops special tokens. Its
specials are not at fixed ids, so the config names them (`bos_token`, `eos_token`, `pad_token`);
pad_id is 0 when it names none (a padded id is masked by weights or key_valid wherever it occurs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
from jaxtyping import ArrayLike, Int

from pax_eqx.config import ConfigError, MissingFileError, Variant, check_range, config
from pax_eqx.extras import require

# Special ids shared by both tokenizers. pad = 0 so that an all-zero row is a padding row.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_BYTE_OFFSET = 4  # byte b is token b + 4 in the byte tokenizer
SPM_DIRNAME = "tokenizer"
SPM_FILENAME = "spm.model"
# SentencePiece training is deterministic for a fixed thread count; hosts that train the same
# text with the same count write byte-identical models, so no host has to wait for another.
_SPM_TRAIN_THREADS = 4


@config
class ByteTokenizerConfig(Variant):
    """UTF-8 bytes as tokens (256 bytes + 4 specials, 260 ids): no files, nothing to train."""

    kind: ClassVar[str] = "byte"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: the byte tokenizer has no fields."""


@config
class SentencePieceConfig(Variant):
    """SentencePiece, trained from the training text into JOB_DIR/tokenizer/spm.model, or loaded
    from `model_path`.

    vocab_size: the vocabulary size (specials included).
    model_type: the SentencePiece algorithm: unigram, bpe or char.
    model_path: an existing SentencePiece model to use instead of training one ("" = train).
    byte_fallback: encode characters outside the vocabulary as bytes instead of <unk>.
    max_training_chars: at most this many characters of training text go to the trainer.
    """

    kind: ClassVar[str] = "sentencepiece"
    vocab_size: int = 1024
    model_type: Literal["unigram", "bpe", "char"] = "unigram"
    model_path: str = ""
    byte_fallback: bool = False
    max_training_chars: int = 20_000_000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(
            self, "vocab_size", ge=8, prefix="data.tokenizer", note="SentencePiece's 4 specials plus pieces",
            fix="Use e.g. 1024.",
        )  # fmt: skip
        check_range(self, "max_training_chars", gt=0, prefix="data.tokenizer")


@config
class TokenizerJsonConfig(Variant):
    """A Hugging Face `tokenizer.json` read with the `tokenizers` library (`import_hf` copies an
    open model's into JOB_DIR/tokenizer/ and names it here).

    path: the tokenizer.json file.
    bos_token / eos_token: the beginning / end-of-sequence tokens as written in the vocabulary
      ("<s>", "<|endoftext|>"); bos_token "" = eos_token (GPT-2 has one token for both). Documents
      end with eos_token; decoding stops at it.
    pad_token: the padding token ("" = id 0, as the other tokenizers).
    """

    kind: ClassVar[str] = "tokenizer_json"
    path: str = ""
    bos_token: str = ""
    eos_token: str = ""
    pad_token: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (the file is read at load)."""
        if not self.path:
            raise ConfigError(
                "data.tokenizer tokenizer_json needs data.tokenizer.path, a Hugging Face tokenizer.json file; "
                "set --data.tokenizer.path FILE (python -m pax_eqx.import_hf writes one into the job dir)."
            )
        if not self.eos_token:
            raise ConfigError(
                "data.tokenizer.eos_token is empty: documents end with it and decoding stops at it; name the "
                "tokenizer's end-of-sequence token, e.g. --data.tokenizer.eos-token '</s>'."
            )


TokenizerConfig = ByteTokenizerConfig | SentencePieceConfig | TokenizerJsonConfig
"""The choice of a tokenizer (`--data.tokenizer sentencepiece`)."""


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    fingerprint: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int] | Int[ArrayLike, " time"]) -> str: ...

    def unknown_characters(self, text: str) -> str: ...

    def token_bytes(self) -> np.ndarray: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: id = byte + 4; ids 0..3 are pad, unk, bos, eos. vocab_size 260.

    Every string is encodable. On ASCII text (the Shakespeare corpus is pure ASCII) this is a
    character-level tokenizer, so losses compare with nanoGPT's shakespeare_char.
    """

    vocab_size = 256 + _BYTE_OFFSET
    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    fingerprint = "byte-v1"

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """The same ids as `encode`, as int32, without a Python list (fast for whole corpora)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + _BYTE_OFFSET

    def decode(self, ids: Iterable[int] | Int[ArrayLike, " time"]) -> str:
        data = bytes(int(i) - _BYTE_OFFSET for i in ids if _BYTE_OFFSET <= int(i) < self.vocab_size)
        return data.decode("utf-8", errors="replace")

    def unknown_characters(self, text: str) -> str:
        return ""

    def token_bytes(self) -> np.ndarray:
        """[vocab] the UTF-8 bytes each id stands for: 1 for a byte, 0 for pad/unk/bos/eos."""
        return (np.arange(self.vocab_size) >= _BYTE_OFFSET).astype(np.int32)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=260)"


class SentencePieceTokenizer:
    """A SentencePiece model; pad/unk/bos/eos are ids 0..3 (fixed at training time)."""

    def __init__(self, model_proto: bytes, path: str = ""):
        spm = require("sentencepiece", "sentencepiece", "data.tokenizer sentencepiece")
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.path = path
        self.vocab_size = int(self._sp.get_piece_size())
        self.pad_id, self.unk_id = int(self._sp.pad_id()), int(self._sp.unk_id())
        self.bos_id, self.eos_id = int(self._sp.bos_id()), int(self._sp.eos_id())
        self.fingerprint = "spm-" + hashlib.sha256(model_proto).hexdigest()[:16]
        self._specials = {i for i in (self.pad_id, self.unk_id, self.bos_id, self.eos_id) if i >= 0}
        if self.pad_id != PAD_ID:
            where = f" {path!r}" if path else ""
            raise ConfigError(
                f"SentencePiece model{where} has pad_id={self.pad_id}; pax_eqx needs pad_id=0 (zero rows are "
                "padding). Retrain it with pad_id=0 (leave data.tokenizer.model_path empty to train one)."
            )

    @classmethod
    def load(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"data.tokenizer.model_path={str(path)!r} does not exist; give an existing SentencePiece "
                ".model file, or leave it empty to train one from the training text."
            )
        return cls(path.read_bytes(), str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self._sp.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int] | Int[ArrayLike, " time"]) -> str:
        return self._sp.decode([int(i) for i in ids if int(i) not in self._specials or int(i) == self.unk_id])

    def unknown_characters(self, text: str) -> str:
        """Characters of `text` that encode to <unk> (in order of first appearance)."""
        bad = []
        for ch in dict.fromkeys(text):
            if self.unk_id in self._sp.encode(ch):
                bad.append(ch)
        return "".join(bad)

    def token_bytes(self) -> np.ndarray:
        """[vocab] the UTF-8 bytes each piece stands for ("▁" a space, a byte-fallback piece one
        byte, control and unknown pieces none), what bits per byte divides by. With this module's
        training (no dummy prefix, no whitespace folding) a text's pieces add up to its bytes; a
        model trained elsewhere with a dummy prefix counts one byte more per document."""
        sp = self._sp
        out = np.zeros(self.vocab_size, np.int32)
        for i in range(self.vocab_size):
            if sp.is_control(i) or sp.is_unknown(i):
                continue
            out[i] = 1 if sp.is_byte(i) else len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return out

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, path={self.path!r})"


# GPT-2's byte-level alphabet: byte b is written as the character _BYTE_LEVEL_CHARS[b] in the
# vocabulary (printable bytes as themselves, the others shifted past U+0100).
def _byte_level_chars() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shift)
            shift += 1
    return [chars[b] for b in range(256)]


_BYTE_OF_CHAR = {c: b for b, c in enumerate(_byte_level_chars())}
_BYTE_FALLBACK_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


class TokenizerJsonTokenizer:
    """A Hugging Face `tokenizer.json` (the `tokenizers` library): see the module doc."""

    def __init__(self, data: bytes, cfg: TokenizerJsonConfig, path: str = ""):
        hf_tokenizers = require("tokenizers", "hf", "data.tokenizer tokenizer_json (a Hugging Face tokenizer.json)")
        self._tok = hf_tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        self._spec = json.loads(data)
        self.path = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.fingerprint = "tokjson-" + hashlib.sha256(data).hexdigest()[:16]
        self.eos_id = self._id_of(cfg.eos_token, "eos_token")
        self.bos_id = self._id_of(cfg.bos_token, "bos_token") if cfg.bos_token else self.eos_id
        self.pad_id = self._id_of(cfg.pad_token, "pad_token") if cfg.pad_token else PAD_ID
        unk = (self._spec.get("model") or {}).get("unk_token")
        self.unk_id = self._tok.token_to_id(unk) if unk else None
        self._special = {t["id"] for t in self._spec.get("added_tokens", []) if t.get("special")}
        # A vocabulary may skip ids (a BPE vocab.json with a gap), so its largest id can pass its size.
        self.largest_id = max([*self._tok.get_vocab(with_added_tokens=True).values(), self.vocab_size - 1])

    @classmethod
    def load(cls, cfg: TokenizerJsonConfig) -> TokenizerJsonTokenizer:
        path = Path(cfg.path)
        if not path.is_file():
            raise MissingFileError(
                f"data.tokenizer.path={cfg.path!r} does not exist; give an existing tokenizer.json file."
            )
        try:
            return cls(path.read_bytes(), cfg, str(path))
        except Exception as e:  # the tokenizers library's parse errors are plain Exceptions
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(
                f"data.tokenizer.path={cfg.path!r} is not a tokenizer.json the tokenizers library reads ({e}); give a "
                "Hugging Face tokenizer.json file."
            ) from None

    def _id_of(self, token: str, field: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ConfigError(
                f"data.tokenizer.{field}={token!r} is not a token of {self.path or 'the tokenizer.json'}; name one of "
                f"its special tokens ({', '.join(repr(t['content']) for t in self._spec.get('added_tokens', [])[:8])})."
            )
        return int(i)

    def token_text(self, i: int) -> str | None:
        """The vocabulary's text of id `i` (None: no token has it)."""
        return self._tok.id_to_token(int(i))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int32)

    def decode(self, ids: Iterable[int] | Int[ArrayLike, " time"]) -> str:
        return self._tok.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size], skip_special_tokens=True)

    def unknown_characters(self, text: str) -> str:
        """Characters of `text` that encode to the unknown token (none for a byte-level or
        byte-fallback vocabulary, which encode everything)."""
        if self.unk_id is None:
            return ""
        return "".join(
            ch for ch in dict.fromkeys(text) if self.unk_id in self._tok.encode(ch, add_special_tokens=False).ids
        )

    def token_bytes(self) -> np.ndarray:
        """[vocab] the UTF-8 bytes each token stands for: a byte-level token (GPT-2, Llama 3, Qwen2)
        its bytes, a byte-fallback piece "<0xAB>" one, a SentencePiece-style piece its text with
        "▁" a space, special tokens none."""
        byte_level = (self._spec.get("decoder") or {}).get("type") == "ByteLevel"
        out = np.zeros(self.vocab_size, np.int32)
        for i in range(self.vocab_size):
            piece = self._tok.id_to_token(i)
            if piece is None or i in self._special:
                continue
            if _BYTE_FALLBACK_PIECE.match(piece):
                out[i] = 1
            elif byte_level:
                out[i] = sum(1 if c in _BYTE_OF_CHAR else len(c.encode("utf-8")) for c in piece)
            else:
                out[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
        return out

    def __repr__(self) -> str:
        return f"TokenizerJsonTokenizer(vocab_size={self.vocab_size}, path={self.path!r})"


def training_sentences(lines: Iterable[str], max_chars: int) -> list[str]:
    """The non-blank `lines` a SentencePiece model is trained on: read until `max_chars`
    characters are taken (the last line cut to fit), so a large corpus is never read whole."""
    budget = max_chars
    sentences: list[str] = []
    for line in lines:
        if budget <= 0:
            break
        if line.strip():
            sentences.append(line[:budget])
            budget -= len(line)
    return sentences


def train_sentencepiece(lines: Iterable[str], cfg: SentencePieceConfig) -> bytes:
    """Trains a SentencePiece model on `lines` (one sentence each, no newlines); returns the proto."""
    import io

    spm = require("sentencepiece", "sentencepiece", "data.tokenizer sentencepiece")
    sentences = training_sentences(lines, cfg.max_training_chars)
    if not sentences:
        raise ConfigError("cannot train a SentencePiece tokenizer: the training text is empty.")
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=out,
            vocab_size=cfg.vocab_size,
            model_type=cfg.model_type,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            user_defined_symbols=["\n"],
            character_coverage=1.0,
            byte_fallback=cfg.byte_fallback,
            hard_vocab_limit=cfg.model_type != "char",
            input_sentence_size=0,
            num_threads=_SPM_TRAIN_THREADS,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ConfigError(
            f"SentencePiece training failed with data.tokenizer.vocab_size={cfg.vocab_size}: {e}. "
            "A small corpus supports only a small vocabulary; lower data.tokenizer.vocab_size."
        ) from None
    return out.getvalue()


def load_or_train_sentencepiece(
    cfg: SentencePieceConfig, job_dir: str | os.PathLike | None, training_lines: Iterable[str]
) -> SentencePieceTokenizer:
    """`cfg.model_path` if set; else JOB_DIR/tokenizer/spm.model, trained and written on first use.

    With no job dir (data inspection, tests), the model is trained in memory and not kept.
    A model already in the job dir whose vocabulary size differs from the config is refused,
    since checkpoints of that job were trained on its ids.
    """
    if cfg.model_path:
        return SentencePieceTokenizer.load(cfg.model_path)
    if job_dir is None:
        return SentencePieceTokenizer(train_sentencepiece(training_lines, cfg))
    path = Path(job_dir) / SPM_DIRNAME / SPM_FILENAME
    if path.is_file():
        tok = SentencePieceTokenizer(path.read_bytes(), str(path))
        if tok.vocab_size != cfg.vocab_size and cfg.model_type != "char":
            raise ConfigError(
                f"the job dir's tokenizer {str(path)!r} has {tok.vocab_size} tokens but "
                f"data.tokenizer.vocab_size={cfg.vocab_size}; use the old value, or a new --job-log-dir."
            )
        return tok
    proto = train_sentencepiece(training_lines, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: a host that reads the file never sees half of it.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".spm-", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(proto)
    os.replace(tmp, path)
    return SentencePieceTokenizer(proto, str(path))


def largest_id(tokenizer: Tokenizer) -> int:
    """The largest id `tokenizer` gives, its specials (pad, bos, eos) included: vocab_size - 1,
    unless its vocabulary skips ids (a tokenizer.json's `largest_id`)."""
    specials = [i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) if i is not None]
    return int(max(getattr(tokenizer, "largest_id", tokenizer.vocab_size - 1), *specials))


def token_name(tokenizer: Tokenizer, i: int) -> str:
    """How an error names id `i`: its token's text where the tokenizer says it ('' otherwise)."""
    named = {tokenizer.pad_id: "pad", tokenizer.bos_id: "bos", tokenizer.eos_id: "eos"}
    if i in named:
        return f" (the {named[i]} token)"
    to_token = getattr(tokenizer, "token_text", None)
    token = to_token(i) if to_token else None
    return f" ({token!r})" if token is not None else ""


def check_same_tokenizer(tokenizers: dict[str, Tokenizer]) -> None:
    """Raises ValueError if the named tokenizers (e.g. {"train": ..., "eval": ...}) differ."""
    prints = {name: tok.fingerprint for name, tok in tokenizers.items() if tok is not None}
    if len(set(prints.values())) > 1:
        listed = ", ".join(f"{name}: {fp}" for name, fp in prints.items())
        raise ConfigError(
            f"the inputs of this experiment use different tokenizers ({listed}); train, eval and decode "
            "must share one vocabulary. Build every input with the tokenizer from build_tokenizer()."
        )


def decode_rows(
    tokenizer: Tokenizer, ids: Int[ArrayLike, "*batch time"], lengths: Int[ArrayLike, " batch"] | None = None
) -> list[str]:
    """Decodes each row of `ids` [batch, time] (or one row [time]), up to `lengths[i]` tokens if given."""
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[None]
    out = []
    for i, row in enumerate(ids):
        n = len(row) if lengths is None else int(lengths[i])
        out.append(tokenizer.decode(row[:n].tolist()))
    return out
