"""write_plots: PNG curves from metrics.jsonl."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.image import imread

from pax_eqx.summaries import SummaryWriter, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_loss_and_log_pplx_pngs(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for step in range(10, 110, 10):
            loss = 4.0 / np.sqrt(step)
            writer.write(step, "train", {"total_loss": loss, "log_pplx": loss})
            if step % 50 == 0:
                writer.write(step, "eval", {"total_loss": loss + 0.1, "log_pplx": loss + 0.1})
    written = write_plots(tmp_path)
    assert written == [tmp_path / "plots" / "loss.png", tmp_path / "plots" / "log_pplx.png"]
    for path in written:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        image = imread(path)
        assert image.shape[:2] == (450, 700)
        assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas
    assert not list((tmp_path / "plots").glob(".*partial"))


def test_only_plots_with_data_are_written(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "train", "loss": 1.0}) + "\n")
    assert write_plots(tmp_path) == [tmp_path / "plots" / "loss.png"]


def test_missing_metrics_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl does not exist"):
        write_plots(tmp_path)
