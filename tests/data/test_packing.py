"""Packing documents into rows: segment_ids / segment_pos, eos handling, and no attention across documents."""

import json

import equinox as eqx
import grain
import jax
import numpy as np
import pytest

from pax_eqx.data import ByteTokenizer, DataConfig, InputConfig, JsonlSource, build_input
from pax_eqx.data.lm_examples import document_example, pack_documents
from pax_eqx.layers import Context, Mode
from pax_eqx.models import LanguageModelConfig


def test_pack_documents_by_hand():
    """Docs of 3, 6 and 2 tokens (+ bos) into rows of 4: every number below is written out by hand."""
    tok = ByteTokenizer()
    docs = ["abc", "defghi", "jk"]
    examples = grain.MapDataset.source(docs).map(lambda d: document_example(d, tok)).to_iter_dataset()
    rows = list(pack_documents(examples, 4))
    b, e = tok.bos_id, tok.eos_id
    a, c, d, f, g, h, i, j, k = (ord(x) + 4 for x in "acdfghijk")
    bb, ee = ord("b") + 4, ord("e") + 4
    expected = [
        # ids                 labels                segment_ids     segment_pos
        ([b, a, bb, c], [a, bb, c, e], [1, 1, 1, 1], [0, 1, 2, 3]),  # "abc" exactly fills a row
        ([b, d, ee, f], [d, ee, f, g], [1, 1, 1, 1], [0, 1, 2, 3]),  # "defghi" starts ...
        ([g, h, i, b], [h, i, e, j], [1, 1, 1, 2], [0, 1, 2, 0]),  # ... continues as a new segment; "jk" starts
        ([j, k, 0, 0], [k, e, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]),  # ... and the end of data is padded
    ]
    assert len(rows) == len(expected)
    for row, (ids, labels, seg, pos) in zip(rows, expected):
        assert row["ids"].tolist() == ids
        assert row["labels"].tolist() == labels
        assert row["segment_ids"].tolist() == seg
        assert row["segment_pos"].tolist() == pos
        assert row["weights"].tolist() == [float(s > 0) for s in seg]
        assert {k: v.dtype for k, v in row.items()} == {
            "ids": np.int32, "labels": np.int32, "weights": np.float32, "segment_ids": np.int32,
            "segment_pos": np.int32,
        }  # fmt: skip


def packed_eval(tmp_path, texts, seq_len=16, batch_size=2) -> tuple[DataConfig, list[dict]]:
    path, eval_path = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": "unused training text"}) + "\n" for _ in range(3)))
    eval_path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    data = DataConfig(
        source=JsonlSource(path=str(path), eval_path=str(eval_path), layout="packed"),
        seq_len=seq_len,
        eval=InputConfig(batch_size=batch_size, shuffle=False, repeat=False, reset_for_eval=True),
    )
    return data, list(build_input(data, "eval", ByteTokenizer(), 1, 0))


def test_packed_rows_reassemble_the_documents(tmp_path):
    texts = [f"doc {i}: " + "lorem ipsum " * (i % 4) for i in range(9)]
    _, batches = packed_eval(tmp_path, texts)
    tok = ByteTokenizer()
    ids_stream, labels_stream = [], []
    for batch in batches:
        for ids, labels, w, seg, pos in zip(
            *(batch[k] for k in ("ids", "labels", "weights", "segment_ids", "segment_pos"))
        ):
            real = seg > 0
            # Padding only at the end of a row; segments numbered 1, 2, ... in order.
            assert real.tolist() == sorted(real.tolist(), reverse=True)
            assert np.array_equal(w, real.astype(np.float32))
            segments = seg[real]
            assert segments[0] == 1 and np.all(np.diff(segments) >= 0) and np.all(np.diff(segments) <= 1)
            for s in np.unique(segments):
                where = seg == s
                assert pos[where].tolist() == list(range(where.sum()))  # positions restart per segment
                np.testing.assert_array_equal(labels[where][:-1], ids[where][1:])  # next token within a segment
            assert not ids[~real].any() and not labels[~real].any() and not pos[~real].any()
            ids_stream += ids[real].tolist()
            labels_stream += labels[real].tolist()
    # Every document appears once, in order: ids = [bos] + doc, labels = doc + [eos].
    assert ids_stream == sum(([tok.bos_id] + tok.encode(t) for t in texts), [])
    assert labels_stream == sum((tok.encode(t) + [tok.eos_id] for t in texts), [])


@pytest.fixture(scope="module")
def model():
    """One small model for both model tests (building compiles; once per test process)."""
    cfg = LanguageModelConfig(
        vocab_size=260, max_seq_len=32, num_layers=1, model_dims=16, hidden_dims=32, num_heads=2,
        position_embedding="rotary",
    )  # fmt: skip
    return eqx.filter_jit(cfg.build)(jax.random.key(0))  # one compile instead of one per init op


@eqx.filter_jit
def forward(model, batch):
    """The model call of Task.loss: segment_ids mask attention, segment_pos give positions."""
    logits, _ = model(
        batch["ids"], Context(mode=Mode.EVAL), segment_ids=batch["segment_ids"], segment_pos=batch["segment_pos"],
        paddings=1.0 - (batch["segment_ids"] > 0),
    )  # fmt: skip
    return logits


def test_attention_never_crosses_packed_documents(tmp_path, model):
    """Through the model: changing one packed document changes only that document's logits."""
    texts = ["first one", "second", "third doc"]
    _, batches = packed_eval(tmp_path, texts, seq_len=32, batch_size=1)
    batch = batches[0]  # numpy throughout: eager jnp ops would each compile (slow on CPU)
    assert int(batch["segment_ids"].max()) == 3  # all three documents share the first row
    base = np.asarray(forward(model, batch))
    seg = batch["segment_ids"][0]
    changed = {**batch, "ids": np.where(batch["segment_ids"] == 2, 100, batch["ids"]).astype(np.int32)}
    delta = np.abs(np.asarray(forward(model, changed)) - base).max(axis=-1)[0]
    assert float(delta[seg == 2].max()) > 1e-3
    assert float(delta[(seg == 1) | (seg == 3)].max()) < 1e-6


def test_padded_eval_rows_give_finite_zero_weight_loss(tmp_path, model):
    """A row that is all padding (segment_ids 0 everywhere) must not turn the loss into NaN."""
    _, batches = packed_eval(tmp_path, ["tiny"], seq_len=32, batch_size=2)
    batch = batches[0]
    assert float(batch["weights"][1].sum()) == 0.0  # the second row is padding
    loss = eqx.filter_jit(
        lambda m, b: m.metrics_from_logits(forward(m, b), b["labels"], b["weights"])["avg_xent"].value
    )
    assert np.isfinite(float(loss(model, batch)))
