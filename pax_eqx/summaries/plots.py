"""Training curves from DIR/metrics.jsonl, as PNGs in DIR/plots/, and runs laid over each other.

    write_plots(job_dir)  ->  [DIR/plots/loss.png, accuracy.png, learning_rate.png, grad_norm.png, ...]
    write_overlay([DIR, DIR2, ...], out)  ->  [out/loss.png, ...]: every run's curves in one chart

Each is drawn when the model logs its metric (a classifier has no log_pplx), and a curve equal to
one already drawn is not drawn again (a language model's log_pplx is its loss). Titles name the
experiment (config.json's `name`). The trainer redraws DIR/plots at every eval, each file
replaced atomically; `python -m pax_eqx.plots DIR [DIR ...]` redraws any time.

Like the curves in Pax's README (1B-loss.png): step on x, the metric on y, one line for
training and one (with markers, since it is logged less often) for evaluation. Drawn with
matplotlib's Agg canvas directly -- no pyplot, so no global figure state and no display is
ever needed, whatever backend the user's matplotlib is configured with.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pax_eqx.config import MissingFileError
from pax_eqx.summaries.writer import read_metrics

# file name -> (metric names to look for, in order of preference; y-axis label)
PLOTS = {
    "loss": (("loss", "total_loss"), "loss"),
    "log_pplx": (("log_pplx",), "log perplexity (nats per token)"),
    "accuracy": (("accuracy",), "accuracy"),
    "learning_rate": (("learning_rate",), "learning rate"),
    "grad_norm": (("grad_norm",), "gradient norm (before clipping)"),
}

_STYLE = {
    "train": {"color": "tab:blue", "linewidth": 1.2},
    "eval": {"color": "tab:orange", "marker": "o", "markersize": 3},
}


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


def write_plots(job_dir: str | os.PathLike) -> list[Path]:
    """Draws each plot that has data into DIR/plots/; returns the paths written (none if nothing
    was logged).

    Raises MissingFileError (naming the file) when DIR/metrics.jsonl does not exist.
    """
    job_dir = Path(job_dir)
    runs = {_run_name(job_dir): _records(job_dir)}
    return _draw(runs, job_dir / "plots", title=_run_name(job_dir))


def write_overlay(job_dirs: list[str | os.PathLike], out_dir: str | os.PathLike) -> list[Path]:
    """Every run's train and eval curves in one chart per metric, in `out_dir`: comparing runs.
    Runs are labelled by experiment and job dir."""
    dirs = [Path(d) for d in job_dirs]
    runs = {f"{_run_name(d)} ({d.name})" if len(dirs) > 1 else _run_name(d): _records(d) for d in dirs}
    return _draw(runs, Path(out_dir), title=f"{len(dirs)} runs")


def _records(job_dir: Path) -> list[dict]:
    if not (job_dir / "metrics.jsonl").exists():
        raise MissingFileError(
            f"{job_dir / 'metrics.jsonl'} does not exist: nothing to plot (train first, or check the job dir)."
        )
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


def _draw(runs: dict[str, list[dict]], out_dir: Path, title: str) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawable: dict[str, list[dict]] = {}
    for i, (run, records) in enumerate(runs.items()):
        label = _drawable(run)
        drawable[label if label not in drawable else f"{label} #{i + 1}"] = records  # two names, one '?' form
    runs, title = drawable, _drawable(title)

    written, drawn = [], []
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
    for file_name, (names, ylabel) in PLOTS.items():
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
        for (run, split), (steps, values) in curves.items():
            style = dict(_STYLE[split])
            if len(runs) > 1:  # a colour per run; train solid, eval dashed with markers
                style["color"] = colours[list(runs).index(run) % len(colours)]
                style["linestyle"] = "-" if split == "train" else "--"
            label = split if len(runs) == 1 else f"{run} {split}"
            axes.plot(steps, values, label=label, **style)
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{ylabel} -- {title}")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        out = out_dir / f"{file_name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        figure.savefig(partial, format="png")
        os.replace(partial, out)  # a reader never sees half a PNG
        written.append(out)
    return written
