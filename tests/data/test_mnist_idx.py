"""The `mnist_idx` source (pax_eqx/data/sources/mnist_idx.py) on tiny IDX files this test writes
byte by byte (plain and gzipped): what it reads back against the bytes written, each refusal in
one line naming data.path, and one training run of `mnist_cnn` through the command line."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import jax
import numpy as np
import pytest

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import DataConfig, InputConfig, build_input, build_tokenizer
from pax_eqx.data.sources.mnist_idx import MnistIdxSource

NUM_TRAIN, NUM_EVAL = 6, 5
# Which files are written gzipped: each split has one of each, so both readers serve both kinds.
GZIPPED = {"train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}


def write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> Path:
    """IDX as the MNIST site writes it: magic (0, 0, 0x08 = unsigned bytes, ndim), each dimension
    a big-endian int32, then the bytes; gzipped where the name ends in .gz."""
    array = np.asarray(array, np.uint8)
    magic = 0x0800 | array.ndim if magic is None else magic
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


def file_name(name: str) -> str:
    return f"{name}.gz" if name in GZIPPED else name


@pytest.fixture
def written(tmp_path):
    """(the directory, {split: (pixels uint8 [N, 28, 28], labels uint8 [N])}) of tiny MNIST files."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, prefix, n in (("train", "train", NUM_TRAIN), ("eval", "t10k", NUM_EVAL)):
        pixels = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        pixels[0, 0, 0], pixels[0, 0, 1] = 0, 255  # both ends of the scale
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(tmp_path / file_name(f"{prefix}-images-idx3-ubyte"), pixels)
        write_idx(tmp_path / file_name(f"{prefix}-labels-idx1-ubyte"), labels)
        arrays[split] = (pixels, labels)
    return tmp_path, arrays


def data_config(path: Path | str, batch: int = 4) -> DataConfig:
    return DataConfig(
        source=MnistIdxSource(path=str(path)),
        train=InputConfig(batch_size=batch, shuffle=False),
        eval=InputConfig(batch_size=batch, shuffle=False, repeat=False, reset_for_eval=True),
    )


def test_the_examples_are_the_bytes_written_over_255(written):
    directory, arrays = written
    source = MnistIdxSource(path=str(directory))
    for split, (pixels, labels) in arrays.items():
        examples = source.split_examples(split)
        assert len(examples) == len(pixels)
        for i, example in enumerate(examples):
            assert example["inputs"].shape == (28, 28, 1) and example["inputs"].dtype == np.float32
            np.testing.assert_array_equal(example["inputs"][..., 0], pixels[i].astype(np.float32) / 255.0)
            assert example["labels"] == labels[i] and example["labels"].dtype == np.int32
            assert example["weights"] == 1.0
        assert examples[0]["inputs"][0, 0, 0] == 0.0 and examples[0]["inputs"][0, 1, 0] == 1.0


def test_batches_of_both_splits_and_the_padded_eval_epoch(written):
    directory, arrays = written
    data = data_config(directory)
    data.validate()
    tokenizer = build_tokenizer(data)
    train = build_input(data, "train", tokenizer, num_infeed_hosts=1, infeed_host_index=0).get_next()
    assert {k: (v.shape, v.dtype) for k, v in train.items()} == {
        "inputs": ((4, 28, 28, 1), np.float32), "labels": ((4,), np.int32), "weights": ((4,), np.float32),
    }  # fmt: skip
    np.testing.assert_array_equal(train["labels"], arrays["train"][1][:4])  # unshuffled: the files' order
    eval_input = build_input(data, "eval", tokenizer, num_infeed_hosts=1, infeed_host_index=0)
    batches = [eval_input.get_next() for _ in range(2)]
    with pytest.raises(StopIteration):
        eval_input.get_next()
    pixels, labels = arrays["eval"]
    inputs = np.concatenate([b["inputs"] for b in batches])
    np.testing.assert_array_equal(inputs[:NUM_EVAL, ..., 0], pixels.astype(np.float32) / 255.0)
    np.testing.assert_array_equal(np.concatenate([b["labels"] for b in batches])[:NUM_EVAL], labels)
    np.testing.assert_array_equal(np.concatenate([b["weights"] for b in batches]), [1] * NUM_EVAL + [0] * 3)


def _broken(directory: Path, how: str) -> Path | str:
    """The tiny directory broken in one way; returns the data.path to give."""
    if how == "empty path":
        return ""
    if how == "missing directory":
        return directory / "nowhere"
    if how == "missing file":
        (directory / file_name("t10k-labels-idx1-ubyte")).unlink()
    elif how == "bad magic":  # the labels' magic number on the images
        pixels = np.zeros((NUM_EVAL, 28, 28), np.uint8)
        write_idx(directory / file_name("t10k-images-idx3-ubyte"), pixels, magic=0x00000801)
    elif how == "count mismatch":
        write_idx(directory / file_name("train-labels-idx1-ubyte"), np.zeros(NUM_TRAIN - 1, np.uint8))
    elif how == "cut short":
        path = directory / file_name("t10k-images-idx3-ubyte")
        path.write_bytes(path.read_bytes()[:-1])
    return directory


@pytest.mark.parametrize(
    "how, error, says",
    [
        ("empty path", ConfigError, r"data\.path is empty; .*--data\.path DIR; nothing is downloaded at run time"),
        ("missing directory", MissingFileError, r"is not an existing directory; download MNIST's four IDX files"),
        ("missing file", MissingFileError, r"has no t10k-labels-idx1-ubyte \(nor t10k-labels-idx1-ubyte\.gz\)"),
        ("bad magic", ConfigError, r"t10k-images-idx3-ubyte has magic number 0x00000801, not 0x00000803"),
        ("count mismatch", ConfigError, r"train-images-idx3-ubyte\.gz holds 6 images but train-labels-idx1-ubyte 5"),
        ("cut short", ConfigError, r"t10k-images-idx3-ubyte holds 3919 bytes after its header, but .* need 3920"),
    ],
)
def test_each_refusal_is_one_line_naming_data_path_its_value_and_the_fix(written, how, error, says):
    path = _broken(written[0], how)
    data = data_config(path)
    with pytest.raises(error, match=says) as refused:
        data.validate()  # the headers, when the experiment is checked
        data.source.split_examples("eval")  # the elements, when a split is read (a file cut short)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"data.path={str(path)!r}" if path else "data.path is empty")
    assert "MNIST site" in message


def test_a_training_run_through_the_command_line_writes_checkpoints_and_metrics(written, tmp_path, capsys, monkeypatch):
    """`python -m pax_eqx.train --exp mnist_cnn --data.path DIR ...` for 2 steps, shrunk by flags
    (batches of 8, convolutions of 4 and 8 channels, 16 hidden), the batch split over this
    process's devices (tests/conftest.py's 8 CPUs)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "named_experiments"))
    from test_experiments_cli_and_docs import run_main

    job = tmp_path / "job"
    code, out, err = run_main(
        capsys, "--exp", "mnist_cnn", "--data.path", str(written[0]), "--job-log-dir", str(job),
        "--train.num-steps", "2", "--data.train.batch-size", "8", "--data.eval.batch-size", "8",
        "--mesh.ici-mesh-shape", "1", str(jax.device_count()), "1", "--model.network.channels", "4", "8",
        "--model.network.hidden-dims", "16",
    )  # fmt: skip
    assert code == 0, err
    assert "Finished at step 2" in out
    assert [p.name for p in (job / "checkpoints").iterdir()] == ["2"]  # the last step's
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("split") == "eval"]
    assert evals and "accuracy" in evals[-1]
    saved = json.loads((job / "config.json").read_text())
    source = saved["data"]["source"]
    assert (saved["name"], source["kind"], source["path"]) == ("mnist_cnn", "mnist_idx", str(written[0]))
