"""The examples of docs/data.md, run: MyInput, Input.map, and plugging in per-example data."""

import numpy as np

from pax_eqx.data import (
    DataConfig,
    Input,
    InputConfig,
    RandomSource,
    array_examples,
    batch_host_examples,
    build_input,
    build_tokenizer,
    resolve_host_shard,
)

DATA = DataConfig(source=RandomSource(num_synthetic_examples=32), seq_len=8, train=InputConfig(batch_size=4))


class MyInput(Input):
    def get_next(self):
        batch = super().get_next()
        batch["new_field"] = batch["ids"] % 7
        return batch


def test_my_input_post_processes_batches():
    tokenizer = build_tokenizer(DATA)
    base = build_input(DATA, "train", tokenizer, 1, 0)
    inp = MyInput(base.dataset, base.cfg, split="train", shard=base.shard, tokenizer=tokenizer)
    reference = build_input(DATA, "train", tokenizer, 1, 0).get_next()
    batch = inp.get_next()
    np.testing.assert_array_equal(batch["ids"], reference["ids"])
    np.testing.assert_array_equal(batch["new_field"], reference["ids"] % 7)
    mapped = build_input(DATA, "train", tokenizer, 1, 0).map(lambda b: {**b, "new_field": b["ids"] % 7})
    np.testing.assert_array_equal(mapped.get_next()["new_field"], reference["ids"] % 7)
    assert mapped.get_state() == inp.get_state()  # the same position in the same grain pipeline


def test_plugging_in_per_example_data():
    images = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    labels = np.arange(10)
    examples = array_examples({"image": images, "label": labels})
    examples = examples.map(lambda e: {**e, "weights": np.float32(1)})
    cfg = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True, num_infeed_hosts=1)
    shard = resolve_host_shard(cfg)
    pad = {"image": np.zeros_like(images[0]), "label": np.int64(0), "weights": np.float32(0)}
    batches, per_epoch = batch_host_examples(examples, cfg, shard, pad)
    inp = Input(batches, cfg, split="eval", shard=shard, num_batches_per_epoch=per_epoch)
    out = list(inp)
    assert per_epoch == len(out) == 3
    assert out[0]["image"].shape == (4, 3)
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in out]), list(range(10)) + [0, 0])
    np.testing.assert_array_equal(np.concatenate([b["weights"] for b in out]), [1] * 10 + [0, 0])
