"""Loss, log-perplexity and accuracy curves from DIR/metrics.jsonl, as PNGs in DIR/plots/.

    write_plots(job_dir)  ->  [DIR/plots/loss.png, DIR/plots/log_pplx.png, DIR/plots/accuracy.png]

(each drawn when the model logs it: a classifier has no log_pplx).

Like the curves in Pax's README (1B-loss.png): step on x, the metric on y, one line for
training and one (with markers, since it is logged less often) for evaluation. Drawn with
matplotlib's Agg canvas directly -- no pyplot, so no global figure state and no display is
ever needed, whatever backend the user's matplotlib is configured with.
"""

from __future__ import annotations

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
    """Draws each plot that has data; returns the paths written (none if nothing was logged).

    Raises FileNotFoundError (naming the file) when DIR/metrics.jsonl does not exist.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    job_dir = Path(job_dir)
    if not (job_dir / "metrics.jsonl").exists():
        raise MissingFileError(
            f"{job_dir / 'metrics.jsonl'} does not exist: nothing to plot (train first, or check the job dir)."
        )
    records = read_metrics(job_dir)
    written = []
    for file_name, (names, ylabel) in PLOTS.items():
        curves = {split: _series(records, split, names) for split in ("train", "eval")}
        if not any(steps for steps, _ in curves.values()):
            continue
        figure = Figure(figsize=(7, 4.5), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for split, (steps, values) in curves.items():
            if steps:
                axes.plot(steps, values, label=split, **_STYLE[split])
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{ylabel} -- {job_dir.name}")
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.tight_layout()
        out = job_dir / "plots" / f"{file_name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        figure.savefig(partial, format="png")
        os.replace(partial, out)  # a reader never sees half a PNG
        written.append(out)
    return written
