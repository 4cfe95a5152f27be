"""The tokenizer_json kind: a Hugging Face tokenizer.json through the `tokenizers` library.

Two tokenizers are trained here with that library (nothing is downloaded): a byte-level BPE as
GPT-2's (specials <|endoftext|>) and a SentencePiece-style BPE with byte fallback as Llama 2's
(Metaspace "▁", <s> put first by its post-processor).
"""

import numpy as np
import pytest

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import DataConfig, InputConfig, JsonlSource, build_input, build_tokenizer
from pax_eqx.data.tokenizers import TokenizerJsonConfig, TokenizerJsonTokenizer

TEXT = "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"


def _byte_level(path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    tok.save(str(path))
    return str(path)


def _metaspace(path) -> str:
    """Llama 2's layout: <unk> <s> </s>, then the 256 byte pieces <0x00>..<0xFF> (vocabulary
    entries, not added tokens), then the learned merges."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.train_from_iterator([TEXT] * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    spec = json.loads(tok.to_str())
    learned = sorted((i, t) for t, i in spec["model"]["vocab"].items() if i >= 3)
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(t for _, t in learned)]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(pieces)}
    with open(path, "w") as f:
        json.dump(spec, f)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    return {"byte_level": _byte_level(d / "bl.json"), "metaspace": _metaspace(d / "ms.json")}


def test_byte_level_round_trips_and_counts_bytes(files):
    tok = TokenizerJsonTokenizer.load(TokenizerJsonConfig(path=files["byte_level"], eos_token="<|endoftext|>"))
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT) and tok.decode(ids) == TEXT
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (0, 0, 0)  # bos "" = eos; pad "" = 0
    assert tok.decode(ids + [tok.eos_id]) == TEXT  # specials are dropped
    text = "naïve café ☃"  # bytes outside the training text: byte-level encodes them anyway
    assert tok.decode(tok.encode(text)) == text and tok.unknown_characters(text) == ""
    sizes = tok.token_bytes()
    assert sizes[tok.eos_id] == 0
    assert int(sizes[tok.encode(TEXT + text)].sum()) == len((TEXT + text).encode("utf-8"))


def test_metaspace_with_byte_fallback_puts_bos_first_and_counts_bytes(files):
    cfg = TokenizerJsonConfig(path=files["metaspace"], bos_token="<s>", eos_token="</s>", pad_token="<unk>")
    tok = TokenizerJsonTokenizer.load(cfg)
    ids = tok.encode("But, soft! what light")
    assert ids[0] == tok.bos_id == 1 and (tok.eos_id, tok.pad_id) == (2, 0)
    assert tok.decode(ids) == "But, soft! what light"
    ids = tok.encode("☃ light")  # ☃ is three <0x..> fallback pieces
    assert tok.decode(ids) == "☃ light"
    sizes = tok.token_bytes()
    assert sizes[tok.bos_id] == 0 and sizes[tok.vocab_size - 1] > 0
    assert int(sizes[ids].sum()) == len(" ☃ light".encode())  # the Metaspace prefix counts one space


def test_build_tokenizer_and_an_input_use_it(files, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"text": "{line}"}}\n' for line in TEXT.splitlines() * 4))
    data = DataConfig(
        source=JsonlSource(path=str(corpus)),
        seq_len=16,
        train=InputConfig(batch_size=2),
        tokenizer=TokenizerJsonConfig(path=files["byte_level"], eos_token="<|endoftext|>"),
    )
    tok = build_tokenizer(data)
    assert isinstance(tok, TokenizerJsonTokenizer) and tok.vocab_size == 300
    batch = build_input(data, "train", tok).get_next()
    assert batch["ids"].shape == (2, 16) and int(np.max(batch["ids"])) < 300


def test_errors_name_the_field(files, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.path"):
        TokenizerJsonConfig(eos_token="</s>").validate()
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.eos_token is empty"):
        TokenizerJsonConfig(path=files["byte_level"]).validate()
    with pytest.raises(MissingFileError, match="does not exist"):
        TokenizerJsonTokenizer.load(TokenizerJsonConfig(path=str(tmp_path / "nope.json"), eos_token="</s>"))
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.eos_token='</s>' is not a token"):
        TokenizerJsonTokenizer.load(TokenizerJsonConfig(path=files["byte_level"], eos_token="</s>"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not a tokenizer.json"):
        TokenizerJsonTokenizer.load(TokenizerJsonConfig(path=str(bad), eos_token="</s>"))
