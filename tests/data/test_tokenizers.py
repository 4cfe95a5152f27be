"""Byte and SentencePiece tokenizers: round trips, specials, job-dir reuse, mismatch errors."""

import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    ByteTokenizer,
    CustomSource,
    DataConfig,
    InputConfig,
    RandomSource,
    SentencePieceTokenizer,
    SyntheticSource,
    TextFilesSource,
    build_input,
    build_tokenizer,
    check_same_tokenizer,
)
from pax_eqx.data.tokenizers import SentencePieceConfig, load_or_train_sentencepiece, train_sentencepiece

TEXT = """ROMEO:
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.

JULIET:
  O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name;   (three spaces)
Or, if thou wilt not, be but sworn my love,
And I'll no longer be a Capulet.
"""
LINES = TEXT.split("\n") * 4
SPM = SentencePieceConfig(vocab_size=60)


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    for text in (TEXT, "", "naïve café — ☃ 日本", "\x00\n\t"):
        ids = tok.encode(text)
        assert all(4 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
        assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id]) == text  # specials vanish
    assert tok.encode("A") == [ord("A") + 4]
    assert (tok.vocab_size, tok.pad_id, tok.unknown_characters("ü")) == (260, 0, "")


@pytest.fixture(scope="module")
def spm() -> SentencePieceTokenizer:
    return SentencePieceTokenizer(train_sentencepiece(LINES, SPM))


def test_sentencepiece_round_trips_text(spm):
    assert spm.vocab_size == 60
    assert (spm.pad_id, spm.bos_id, spm.eos_id) == (0, 2, 3)
    ids = spm.encode(TEXT)
    assert len(ids) < len(TEXT)  # it learned pieces longer than one character
    assert spm.decode(ids) == TEXT  # whitespace, newlines and leading spaces intact
    assert spm.decode([spm.bos_id] + ids + [spm.eos_id, spm.pad_id]) == TEXT


def test_sentencepiece_reports_characters_outside_its_vocabulary(spm):
    assert spm.unknown_characters("Romeo, Juliet") == ""
    assert spm.unknown_characters("Romeo ☃ Zürich") == "☃Zü"  # Z and ü never occur in TEXT


def test_sentencepiece_training_is_deterministic():
    assert train_sentencepiece(LINES, SPM) == train_sentencepiece(LINES, SPM)


def test_sentencepiece_is_trained_into_the_job_dir_and_reused(tmp_path):
    tok = load_or_train_sentencepiece(SPM, tmp_path, LINES)
    path = tmp_path / "tokenizer" / "spm.model"
    assert path.is_file() and tok.path == str(path)
    again = load_or_train_sentencepiece(SPM, tmp_path, iter(()))  # no text needed on resume
    assert again.fingerprint == tok.fingerprint
    with pytest.raises(ConfigError, match=r"has 60 tokens but data.tokenizer.vocab_size=80"):
        load_or_train_sentencepiece(SPM.replace(vocab_size=80), tmp_path, LINES)
    by_path = load_or_train_sentencepiece(SPM.replace(model_path=str(path)), None, iter(()))
    assert by_path.fingerprint == tok.fingerprint


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.tokenizer.model_path="):
        load_or_train_sentencepiece(SPM.replace(model_path=str(tmp_path / "nope.model")), None, LINES)


def test_too_large_vocabulary_names_the_field():
    with pytest.raises(ValueError, match="data.tokenizer.vocab_size=5000"):
        train_sentencepiece(LINES, SPM.replace(vocab_size=5000))


def test_build_tokenizer_trains_on_the_training_split(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT * 3)
    data = DataConfig(source=TextFilesSource(path=str(corpus)), tokenizer=SPM, seq_len=8)
    tok = build_tokenizer(data, tmp_path / "job")
    assert (tmp_path / "job" / "tokenizer" / "spm.model").is_file()
    inp = build_input(data, "train", tok, 1, 0)
    batch = inp.get_next()
    assert int(batch["ids"].max()) < tok.vocab_size
    assert inp.ids_to_strings(batch["ids"])[0] in (TEXT * 3)


def test_different_tokenizers_are_refused(spm):
    check_same_tokenizer({"train": spm, "eval": spm})
    with pytest.raises(ValueError, match="different tokenizers"):
        check_same_tokenizer({"train": spm, "eval": ByteTokenizer()})


def test_custom_input_with_another_tokenizer_is_refused():
    data = DataConfig(source=CustomSource(custom_input=f"{__name__}.input_with_own_tokenizer"))
    with pytest.raises(ValueError, match="different tokenizers"):
        build_input(data, "train", ByteTokenizer(), 1, 0)


def input_with_own_tokenizer(data, split, tokenizer, shard):
    own = SentencePieceTokenizer(train_sentencepiece(LINES, SPM))
    other = DataConfig(source=SyntheticSource(), train=InputConfig(batch_size=2), seq_len=4)
    inp = build_input(other, split, own, shard.count, shard.index)
    return inp


def test_sentencepiece_needs_text():
    data = DataConfig(source=CustomSource(custom_input=f"{__name__}.input_with_own_tokenizer"), tokenizer=SPM)
    message = (
        r"data.tokenizer sentencepiece is trained from text, but data.source='custom' has none; use "
        r"--data.tokenizer byte, or set --data.tokenizer.model-path."
    )
    with pytest.raises(ConfigError, match=message):
        build_tokenizer(data)
    with pytest.raises(ConfigError, match=message):  # up front, before a run starts
        data.validate()


@pytest.mark.parametrize("source", [SyntheticSource, RandomSource], ids=["synthetic", "random"])
def test_id_sources_print_with_bytes_when_sentencepiece_has_no_model(source):
    """`--data.source synthetic` on a C4 experiment: ids need no tokenizer, samples print as bytes."""
    data = DataConfig(source=source(), tokenizer=SPM)
    data.validate()
    assert isinstance(build_tokenizer(data), ByteTokenizer)
