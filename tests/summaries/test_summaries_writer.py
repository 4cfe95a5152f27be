"""SummaryWriter: TensorBoard events read back with tensorboardX's protobufs; metrics.jsonl lines."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2

from pax_eqx.summaries import SummaryWriter, read_metrics


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32-C (the framing TensorBoard event files use)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(directory: Path) -> list[event_pb2.Event]:
    """Every event in every event file of `directory`, checking the TFRecord framing as we go."""
    events = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
            assert length_crc == _masked_crc(data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            (payload_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
            assert payload_crc == _masked_crc(payload)
            event = event_pb2.Event()
            event.ParseFromString(payload)
            events.append(event)
            offset += 16 + length
    return events


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(directory):
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_tensorboard_scalars_per_split(tmp_path):
    writer = SummaryWriter(tmp_path)
    writer.write(10, "train", {"total_loss": 2.5, "learning_rate": np.float32(1e-3)})
    writer.write(20, "train", {"total_loss": 2.25, "learning_rate": 2e-3})
    writer.write(20, "eval", {"total_loss": 2.375, "log_pplx": 2.375})
    writer.close()
    train = scalars(tmp_path / "summaries" / "train")
    assert train["total_loss"] == [(10, 2.5), (20, 2.25)]
    assert train["loss"] == [(10, 2.5), (20, 2.25)]  # the alias plots and dashboards look for
    assert [step for step, _ in train["learning_rate"]] == [10, 20]
    np.testing.assert_allclose([v for _, v in train["learning_rate"]], [1e-3, 2e-3], rtol=1e-6)
    evals = scalars(tmp_path / "summaries" / "eval")
    assert evals["log_pplx"] == [(20, 2.375)]
    assert "learning_rate" not in evals


def test_metrics_jsonl_one_object_per_write_flushed_at_once(tmp_path):
    before = time.time()
    writer = SummaryWriter(tmp_path)
    writer.write(5, "train", {"total_loss": 3.0, "accuracy": 0.25})
    # Readable before close: a SIGKILL right now would lose nothing already written.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    results = lambda row: {k: v for k, v in row.items() if k not in ("time", "elapsed_s")}  # noqa: E731
    assert [results(r) for r in rows] == [
        {"step": 5, "split": "train", "loss": 3.0, "total_loss": 3.0, "accuracy": 0.25}
    ]
    assert before - 1e-3 <= rows[0]["time"] <= time.time() + 1e-3 and 0 <= rows[0]["elapsed_s"] < 60
    writer.write(5, "eval", {"loss": 3.5, "total_loss": 3.75})  # an explicit loss is kept
    writer.close()
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert results(last) == {"step": 5, "split": "eval", "loss": 3.5, "total_loss": 3.75}


def test_resume_appends_and_readers_keep_the_latest_record(tmp_path):
    first = SummaryWriter(tmp_path)
    for step in (10, 20, 30):
        first.write(step, "train", {"total_loss": 1.0 / step})
    first.close()  # say the checkpoint was at step 20: steps after it are logged again below
    resumed = SummaryWriter(tmp_path, start_step=20)
    resumed.write(30, "train", {"total_loss": 0.5})
    resumed.write(40, "train", {"total_loss": 0.25})
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [10, 20, 30, 30, 40]  # never truncated
    records = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(10, 0.1), (20, 0.05), (30, 0.5), (40, 0.25)]
    # TensorBoard is told to drop the old run's events after step 20 (tensorboardX purge_step).
    events = read_events(tmp_path / "summaries" / "train")
    purge = [e for e in events if e.HasField("session_log")]
    assert [(e.step, e.session_log.status) for e in purge] == [(21, event_pb2.SessionLog.START)]
    assert len(list((tmp_path / "summaries" / "train").glob("events.out.tfevents.*"))) == 2


def test_non_finite_values_are_valid_json_and_read_back(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.write(1, "train", {"total_loss": float("nan"), "grad_norm": float("inf")})
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} is not JSON"))["loss"] == "nan"
    record = read_metrics(tmp_path)[0]
    assert math.isnan(record["loss"]) and record["grad_norm"] == math.inf


def test_a_torn_last_line_is_skipped(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.write(1, "train", {"total_loss": 2.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "split": "tra')  # killed mid-line
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    with SummaryWriter(tmp_path, start_step=1) as writer:  # the resumed run appends after the torn line
        writer.write(2, "train", {"total_loss": 1.5})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 2.0), (2, 1.5)]


def test_disabled_writer_writes_nothing(tmp_path):
    writer = SummaryWriter(tmp_path / "job", enabled=False)
    writer.write(1, "train", {"total_loss": 1.0})
    writer.close()
    assert not (tmp_path / "job").exists()


def test_bad_split_and_bad_value_are_named(tmp_path):
    writer = SummaryWriter(tmp_path)
    with pytest.raises(ValueError, match="split must be one of .*'valid'"):
        writer.write(1, "valid", {"total_loss": 1.0})
    with pytest.raises(TypeError, match="metric 'hist' \\(train, step 1\\) must be a number"):
        writer.write(1, "train", {"hist": np.zeros(3)})
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(2, "train", {"total_loss": 1.0})


def test_eval_summaries_average_to_arrays_scalars_included():
    """A scalar summary averaged over eval batches is a 0-d array (np.mean alone gives np.float64,
    which the declared dict[str, np.ndarray] and the runtime type checks refuse)."""
    from pax_eqx.summaries.scalars import mean_summaries

    batches = [{"loss": np.float32(1.0), "hist": np.array([1.0, 2.0])}, {"loss": 3.0, "hist": [3.0, 4.0]}]
    merged = mean_summaries(batches)
    assert isinstance(merged["loss"], np.ndarray) and merged["loss"].shape == () and merged["loss"] == 2.0
    np.testing.assert_array_equal(merged["hist"], [2.0, 3.0])


def test_tensorboard_itself_reads_the_job_dirs_event_files(tmp_path):
    """The optional extra (`pip install -e '.[tensorboard]'`, which .ci/run installs): TensorBoard's
    own reader finds each split's scalars where the README's `tensorboard --logdir DIR/summaries`
    points it."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    with SummaryWriter(tmp_path) as writer:
        for step in (1, 2, 3):
            writer.write(step, "train", {"total_loss": 3.0 / step, "learning_rate": 0.1})
        writer.write(3, "eval", {"total_loss": 1.5})
    runs = EventMultiplexer().AddRunsFromDirectory(str(tmp_path / "summaries"))
    runs.Reload()
    assert set(runs.Runs()) == {"train", "eval"}
    train = runs.Scalars("train", "total_loss")
    assert [(e.step, round(e.value, 6)) for e in train] == [(1, 3.0), (2, 1.5), (3, 1.0)]
    assert [e.value for e in runs.Scalars("eval", "total_loss")] == [1.5]
