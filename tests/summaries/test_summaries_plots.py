"""write_plots: PNG curves from metrics.jsonl."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.image import imread

from pax_eqx.summaries import SummaryWriter, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_loss_learning_rate_and_grad_norm_pngs_and_one_of_equal_curves(tmp_path):
    """A language model's log_pplx is its loss: drawn once. A different log_pplx is drawn."""
    with SummaryWriter(tmp_path) as writer:
        for step in range(10, 110, 10):
            loss = 4.0 / np.sqrt(step)
            writer.write(
                step, "train", {"total_loss": loss, "log_pplx": loss, "learning_rate": 1e-3, "grad_norm": loss}
            )
            if step % 50 == 0:
                writer.write(step, "eval", {"total_loss": loss + 0.1, "log_pplx": loss + 0.1})
    written = write_plots(tmp_path)
    plots = tmp_path / "plots"
    assert written == [plots / "loss.png", plots / "learning_rate.png", plots / "grad_norm.png"]
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


def test_runs_laid_over_each_other_through_the_command(tmp_path, capsys):
    from pax_eqx import plots

    for name, scale in (("a", 1.0), ("b", 2.0)):
        job = tmp_path / name
        job.mkdir()
        (job / "config.json").write_text(json.dumps({"name": f"exp_{name}"}))
        with SummaryWriter(job) as writer:
            for step in range(10, 60, 10):
                writer.write(step, "train", {"total_loss": scale / step, "log_pplx": 2 * scale / step})
    out = tmp_path / "compare"
    assert plots.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(out / "loss.png") in printed and str(out / "log_pplx.png") in printed
    assert str(tmp_path / "a" / "plots" / "loss.png") in printed  # each run's own plots too
    assert imread(out / "loss.png")[..., :3].std() > 0.05


def test_job_dirs_named_in_a_script_the_font_lacks_draw_without_glyph_warnings(tmp_path, recwarn):
    """Six lines of matplotlib 'Glyph ... missing from font(s)' warnings, and boxes in the title."""
    from pax_eqx.summaries.plots import _drawable, write_overlay

    dirs = []
    for name in ("実験", "試験"):  # the same length: both become '??', and both runs stay in the overlay
        job = tmp_path / name
        with SummaryWriter(job) as writer:
            writer.write(10, "train", {"total_loss": 1.0})
            writer.write(20, "train", {"total_loss": 0.5})
        dirs.append(job)
    assert write_plots(dirs[0]) == [dirs[0] / "plots" / "loss.png"]
    assert write_overlay(dirs, tmp_path / "out") == [tmp_path / "out" / "loss.png"]
    assert not [w for w in recwarn if "Glyph" in str(w.message)]
    assert _drawable("run_Ωμέγα 実験") == "run_Ωμέγα ??"  # Greek is in the font; CJK is not
