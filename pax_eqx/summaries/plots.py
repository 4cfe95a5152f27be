"""Training curves from DIR/metrics.jsonl, as PNGs in DIR/plots/, and runs laid over each other.

    write_plots(job_dir)  ->  [DIR/plots/loss.png, accuracy.png, learning_rate.png, grad_norm.png, ...]
    write_overlay([DIR, DIR2, ...], out)  ->  [out/loss.png, ...]: every run's curves in one chart

Each is drawn when the model logs its metric (a classifier has no log_pplx), and a curve equal to
one already drawn is not drawn again (a language model's log_pplx is its loss). Titles name the
experiment (config.json's `name`). The trainer redraws DIR/plots at every eval, each file
replaced atomically; `python -m pax_eqx.plots DIR [DIR ...]` redraws any time.

Like the curves in Pax's README (1B-loss.png): step on x, the metric on y, one line for
training and one (with markers, since it is logged less often) for evaluation. The training
points are noisy (one batch each), so they are drawn faint and a smoothed line over them:
TensorBoard's smoothing, an exponential moving average debiased for its start (`smoothed`,
weight 0.6 as TensorBoard's slider starts; 0 draws the raw line alone). The learning rate is a
schedule, not a measurement, and the eval points each average many batches: neither is smoothed.

In an overlay each run is named by what sets it apart: the config fields whose values differ
between the runs' config.json files (`learner.learning_rate=0.001, train.seed=2`), else by its
directory.

Drawn with matplotlib's Agg canvas directly -- no pyplot, so no global figure state and no
display is ever needed, whatever backend the user's matplotlib is configured with. A bad
metrics.jsonl (a directory, a line that is not UTF-8) is a ConfigError naming it; a plot that
cannot be written (a read-only job dir) is a SummaryWriteError naming the directory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.summaries.writer import METRICS_FILE, SummaryWriteError, read_metrics

SMOOTHING = 0.6  # TensorBoard's default weight

# file name -> (metric names to look for, in order of preference; y-axis label; smoothed)
PLOTS = {
    "loss": (("loss", "total_loss"), "loss", True),
    "log_pplx": (("log_pplx",), "log perplexity (nats per token)", True),
    "accuracy": (("accuracy",), "accuracy", True),
    "learning_rate": (("learning_rate",), "learning rate", False),
    "grad_norm": (("grad_norm",), "gradient norm (before clipping)", True),
}

_STYLE = {
    "train": {"color": "tab:blue", "linewidth": 1.2},
    "eval": {"color": "tab:orange", "marker": "o", "markersize": 3},
}
_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
_RAW_ALPHA = 0.25  # the raw points under a smoothed line
_LABEL_FIELDS = 3  # differing fields named in a run's label; more are counted
_LABEL_VALUE = 24  # characters of a field's value in a label


def smoothed(values: Sequence[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's smoothing of a series: s_i = m_i / (1 - weight^i), m_i = weight * m_(i-1) +
    (1 - weight) * v_i, m_0 = 0 (the division removes the pull towards 0 of the first points).
    weight 0 returns the values; the first point is always its own value."""
    if not 0 <= weight < 1:
        raise ConfigError(f"smoothing weight {weight} is not in [0, 1); 0 = none, 0.6 = TensorBoard's default.")
    out, moving = [], 0.0
    for i, value in enumerate(values, start=1):
        moving = weight * moving + (1 - weight) * value
        out.append(moving / (1 - weight**i))
    return out


def _series(records: list[dict], split: str, names: tuple[str, ...]) -> tuple[list[int], list[float]]:
    for name in names:
        points = [
            (r["step"], r[name])
            for r in records
            if r["split"] == split and isinstance(r.get(name), (int, float)) and math.isfinite(r[name])
        ]
        if points:
            return [s for s, _ in points], [v for _, v in points]
    return [], []


def write_plots(
    job_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, smoothing: float = SMOOTHING
) -> list[Path]:
    """Draws each plot that has data into `out_dir` (default DIR/plots/); returns the paths
    written (none if nothing was logged).

    Raises MissingFileError (naming the file) when DIR/metrics.jsonl does not exist, ConfigError
    when it is not a file of lines of text, SummaryWriteError when a plot cannot be written.
    """
    job_dir = Path(job_dir)
    runs = {_run_name(job_dir): _records(job_dir)}
    return _draw(runs, Path(out_dir) if out_dir is not None else job_dir / "plots", _run_name(job_dir), smoothing)


def write_overlay(
    job_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, smoothing: float = SMOOTHING
) -> list[Path]:
    """Every run's train and eval curves in one chart per metric, in `out_dir`: comparing runs.
    Each run is labelled by the config fields that differ between them (`run_labels`)."""
    dirs = [Path(d) for d in job_dirs]
    runs = {label: _records(d) for label, d in zip(run_labels(dirs), dirs)}
    names = {_run_name(d) for d in dirs}
    title = f"{len(dirs)} runs of {names.pop()}" if len(names) == 1 else f"{len(dirs)} runs"
    return _draw(runs, Path(out_dir), title, smoothing)


def run_labels(job_dirs: Sequence[Path]) -> list[str]:
    """A label per run: `field=value, ...` for the config fields (dotted, as in config.json) whose
    values differ between the runs' config.json files, the first three and a count of the rest;
    the directory's name for a run without a config.json, or when no field differs. Labels that
    would still be equal get the directory's name after them."""
    configs = [_flat_config(d) for d in job_dirs]
    known = [c for c in configs if c is not None]
    differing = sorted(k for k in set().union(*known) if len({json.dumps(c.get(k)) for c in known}) > 1)
    labels = []
    for job_dir, config in zip(job_dirs, configs):
        if config is None or not differing:
            labels.append(job_dir.name)
            continue
        shown = [f"{k}={_value_text(config.get(k))}" for k in differing[:_LABEL_FIELDS]]
        more = len(differing) - _LABEL_FIELDS
        labels.append(", ".join(shown) + (f" (+{more} more)" if more > 0 else ""))
    return [f"{label} ({d.name})" if labels.count(label) > 1 else label for label, d in zip(labels, job_dirs)]


def _flat_config(job_dir: Path) -> dict[str, Any] | None:
    """DIR/config.json as {"learner.learning_rate": 0.001, ...}, or None if it cannot be read."""
    try:
        config = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    flat: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(config, "")
    return flat


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value)
    return text if len(text) <= _LABEL_VALUE else text[: _LABEL_VALUE - 3] + "..."


def _records(job_dir: Path) -> list[dict]:
    path = job_dir / METRICS_FILE
    if path.is_dir():
        raise ConfigError(
            f"{path} is a directory, not the metrics file train writes (one JSON line per logged step); "
            "name the job dir of a run (its metrics.jsonl is a file), or move that directory aside."
        )
    if not path.exists():
        raise MissingFileError(f"{path} does not exist: nothing to plot (train first, or check the job dir).")
    return read_metrics(job_dir)


def _run_name(job_dir: Path) -> str:
    """The experiment's name from DIR/config.json, else the directory's."""
    try:
        return json.loads((job_dir / "config.json").read_text()).get("name") or job_dir.name
    except (OSError, ValueError, AttributeError):
        return job_dir.name


def _drawable(text: str) -> str:
    """`text` with each character matplotlib's default font has no glyph for shown as '?': a job
    dir named in a script the font lacks (CJK, say) drew boxes and printed a warning per glyph."""
    from matplotlib import font_manager

    font = font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))
    return "".join(c if c.isspace() or font.get_char_index(ord(c)) else "?" for c in text)


def _draw(runs: dict[str, list[dict]], out_dir: Path, title: str, smoothing: float) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawable: dict[str, list[dict]] = {}
    for i, (run, records) in enumerate(runs.items()):
        label = _drawable(run)
        drawable[label if label not in drawable else f"{label} #{i + 1}"] = records  # two names, one '?' form
    runs, title = drawable, _drawable(title)

    written, drawn = [], []
    for file_name, (names, ylabel, smooth) in PLOTS.items():
        curves = {
            (run, split): _series(records, split, names) for run, records in runs.items() for split in ("train", "eval")
        }
        curves = {key: c for key, c in curves.items() if c[0]}
        if not curves or curves in drawn:  # nothing logged, or the same curves as a plot above
            continue
        drawn.append(curves)
        figure = Figure(figsize=(7, 4.5), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        smoothing_shown = False
        for (run, split), (steps, values) in curves.items():
            style = dict(_STYLE[split])
            if len(runs) > 1:  # a colour per run; train solid, eval dashed with markers
                style["color"] = _COLOURS[list(runs).index(run) % len(_COLOURS)]
                style["linestyle"] = "-" if split == "train" else "--"
            label = split if len(runs) == 1 else f"{run} {split}"
            if split == "train" and smooth and smoothing > 0 and len(values) > 1:
                axes.plot(steps, values, color=style["color"], linewidth=0.8, alpha=_RAW_ALPHA)
                values = smoothed(values, smoothing)
                smoothing_shown = True
            axes.plot(steps, values, label=label, **style)
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{ylabel} -- {title}")
        axes.grid(True, alpha=0.3)
        legend_title = f"train smoothed (EMA {smoothing:g}), raw faint" if smoothing_shown else None
        handles = _overlay_legend(runs, curves) if len(runs) > 1 else None
        axes.legend(handles=handles, fontsize="small", title=legend_title, title_fontsize="x-small")
        figure.tight_layout()
        written.append(_save(figure, out_dir / f"{file_name}.png"))
    return written


def _overlay_legend(runs: dict[str, list[dict]], curves: dict[tuple[str, str], Any]) -> list[Any]:
    """One entry per run (its colour and label), then one per split (its line style): the
    legend of an overlay, half as long as one entry per curve."""
    from matplotlib.lines import Line2D

    shown = {run for run, _ in curves}
    handles = [
        Line2D([], [], color=_COLOURS[i % len(_COLOURS)], linewidth=2, label=run)
        for i, run in enumerate(runs)
        if run in shown
    ]
    splits = {split for _, split in curves}
    if "train" in splits:
        handles.append(Line2D([], [], color="0.35", linestyle="-", label="train"))
    if "eval" in splits:
        handles.append(Line2D([], [], color="0.35", linestyle="--", marker="o", markersize=3, label="eval"))
    return handles


def _save(figure: Any, out: Path) -> Path:
    """Writes the PNG atomically (a reader never sees half of one); SummaryWriteError on failure."""
    partial = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(partial, format="png")
        os.replace(partial, out)
    except OSError as e:
        reason = e.strerror or f"{type(e).__name__}: {e}"
        raise SummaryWriteError(f"cannot write the plots into {out.parent} ({reason})") from e
    return out
