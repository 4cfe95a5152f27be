"""write_plots: PNG curves from metrics.jsonl."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.image import imread

from pax_eqx.summaries import SummaryWriter, read_metrics, write_overlay, write_plots

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


# Smoothing and the overlay's labels -----------------------------------------------------------
def _noisy_run(job, config: dict | None, steps=range(10, 210, 10), seed=0):
    rng = np.random.default_rng(seed)
    job.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (job / "config.json").write_text(json.dumps(config))
    with SummaryWriter(job, trackers=[]) as writer:
        for step in steps:
            writer.write(step, "train", {"total_loss": 3.0 / np.sqrt(step) + rng.normal(0, 0.1), "learning_rate": 0.1})
            if step % 50 == 0:
                writer.write(step, "eval", {"total_loss": 3.0 / np.sqrt(step)})


def _figures(monkeypatch) -> dict:
    """{file name: the matplotlib Figure} of each plot drawn (instead of its PNG)."""
    from pax_eqx.summaries import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda figure, out: drawn.setdefault(out.stem, figure) and out)
    return drawn


def _lines(figure) -> list:
    return figure.axes[0].lines


def _legend(figure) -> list[str]:
    return [t.get_text() for t in figure.axes[0].get_legend().get_texts()]


def test_the_smoothed_series_is_tensorboards_debiased_moving_average():
    from pax_eqx.summaries.plots import smoothed

    values = [4.0, 2.0, 3.0, 1.0, 1.5]
    expected, moving = [], 0.0
    for i, v in enumerate(values, start=1):
        moving = 0.6 * moving + 0.4 * v
        expected.append(moving / (1 - 0.6**i))
    assert smoothed(values) == pytest.approx(expected, rel=1e-15)
    assert smoothed(values)[0] == 4.0  # debiased: the first point is its own value, not 0.4 of it
    assert smoothed(values, 0.0) == values
    with pytest.raises(ValueError, match=r"smoothing weight 1.0 is not in \[0, 1\)"):
        smoothed(values, 1.0)


def test_training_curves_are_drawn_smoothed_over_their_faint_raw_points(tmp_path, monkeypatch):
    from pax_eqx.summaries.plots import smoothed

    _noisy_run(tmp_path, {"name": "exp"})
    drawn = _figures(monkeypatch)
    write_plots(tmp_path)
    records = read_metrics(tmp_path)
    raw = [r["loss"] for r in records if r["split"] == "train"]
    faint, train, evaluation = _lines(drawn["loss"])
    assert list(faint.get_ydata()) == raw and faint.get_alpha() == 0.25 and faint.get_label().startswith("_")
    assert list(train.get_ydata()) == smoothed(raw, 0.6) and train.get_label() == "train"
    assert list(evaluation.get_ydata()) == [r["loss"] for r in records if r["split"] == "eval"]  # not smoothed
    assert _legend(drawn["loss"]) == ["train", "eval"]
    assert drawn["loss"].axes[0].get_legend().get_title().get_text() == "train smoothed (EMA 0.6), raw faint"
    [schedule] = _lines(drawn["learning_rate"])  # a schedule: drawn as it is
    assert set(schedule.get_ydata()) == {0.1}


def test_smoothing_zero_draws_the_raw_points_alone(tmp_path, monkeypatch):
    _noisy_run(tmp_path, None)
    drawn = _figures(monkeypatch)
    write_plots(tmp_path, smoothing=0.0)
    train, _ = _lines(drawn["loss"])
    assert train.get_alpha() is None and drawn["loss"].axes[0].get_legend().get_title().get_text() == ""


def _config(lr: float, seed: int, **more) -> dict:
    from pax_eqx.experiment import ExperimentConfig

    exp = ExperimentConfig(name="shakespeare_char").override("learner.learning_rate", lr).override("train.seed", seed)
    for path, value in more.items():
        exp = exp.override(path, value)
    return exp.to_dict()


def test_an_overlay_names_each_run_by_the_config_fields_that_differ(tmp_path, monkeypatch):
    runs = {"a": _config(1e-3, 1), "b": _config(3e-4, 1), "c": _config(1e-3, 2)}
    for name, config in runs.items():
        _noisy_run(tmp_path / name, config, seed=ord(name))
    drawn = _figures(monkeypatch)
    write_overlay([tmp_path / name for name in runs], tmp_path / "out")
    labels = [
        "learner.learning_rate=0.001, train.seed=1",
        "learner.learning_rate=0.0003, train.seed=1",
        "learner.learning_rate=0.001, train.seed=2",
    ]
    assert _legend(drawn["loss"]) == [*labels, "train", "eval"]
    assert drawn["loss"].axes[0].get_title() == "loss -- 3 runs of shakespeare_char"
    assert _legend(drawn["learning_rate"]) == [*labels, "train"]


def test_run_labels_fall_back_to_the_directory(tmp_path):
    """Four differing fields: three named and a count; equal labels get their directory; no
    config.json, or nothing that differs: the directory alone."""
    from pax_eqx.summaries.plots import run_labels

    configs = {
        "base": _config(3e-4, 1),
        "many": _config(1e-3, 2, **{"train.num_steps": 7, "data.seq_len": 32}),
        "same": _config(3e-4, 1),
        "none": None,
    }
    for name, config in configs.items():
        (tmp_path / name).mkdir()
        if config is not None:
            (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert run_labels([tmp_path / name for name in configs]) == [
        "data.seq_len=64, learner.learning_rate=0.0003, train.num_steps=1000 (+1 more) (base)",
        "data.seq_len=32, learner.learning_rate=0.001, train.num_steps=7 (+1 more)",
        "data.seq_len=64, learner.learning_rate=0.0003, train.num_steps=1000 (+1 more) (same)",
        "none",
    ]
    assert run_labels([tmp_path / "base", tmp_path / "same"]) == ["base", "same"]  # nothing differs
