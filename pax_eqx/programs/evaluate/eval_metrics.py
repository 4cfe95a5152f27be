"""Host-side eval metrics on the model's per-example outputs (`data.eval.metrics` of kind
"scores", pax_eqx.metric_fns): the classifier's and the rows they read.

The model's weighted metrics are averages a step can compute on its own; some scores need the
whole eval epoch at once (a confusion matrix, a balanced accuracy, bits per byte). The eval
program collects the model's per-example outputs (`Model.per_example_outputs`, always with a
row `weight`) over the epoch, keeps the real rows (weight > 0), and hands them to each metric.

    scores = score(("confusion_matrix",), rows, merged, EvalContext(tokenizer, job_dir, step))

`confusion_matrix` writes DIR/plots/confusion.png and DIR/plots/confusion.json (rows: labels,
columns: predictions) and returns nothing scalar; `balanced_accuracy` returns the mean of the
per-class recalls over the classes present.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.metric_fns import EvalContext, resolve


def real_rows(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The per-example outputs of every batch, concatenated along the batch, padded rows (weight
    0) dropped."""
    if not batches or "weight" not in batches[0]:
        have = sorted(batches[0]) if batches else []
        raise ConfigError(
            f"data.eval.metrics needs the model's per-example outputs with a row 'weight', but it gives {have}; "
            "implement Model.per_example_outputs or clear data.eval.metrics."
        )
    joined = {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in batches[0]}
    keep = joined["weight"].reshape(len(joined["weight"]), -1)[:, 0] > 0
    return {k: v[keep] for k, v in joined.items()}


def confusion(rows: dict[str, np.ndarray], num_classes: int) -> np.ndarray:
    """counts[label, predicted] over the real rows."""
    counts = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(counts, (rows["label"].astype(int), rows["predicted"].astype(int)), 1)
    return counts


def balanced_accuracy(counts: np.ndarray) -> float:
    present = counts.sum(axis=1) > 0
    recalls = np.diag(counts)[present] / counts.sum(axis=1)[present]
    return float(recalls.mean()) if recalls.size else 0.0


def write_confusion(counts: np.ndarray, job_dir: str | os.PathLike, step: int) -> Path:
    """DIR/plots/confusion.png (a heat map with the counts written in) and confusion.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = Path(job_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    (plots / "confusion.json").write_text(json.dumps({"step": step, "counts": counts.tolist()}))
    n = counts.shape[0]
    fig, ax = plt.subplots(figsize=(1.0 + 0.5 * n, 1.0 + 0.5 * n))
    ax.imshow(counts, cmap="Blues")
    for (i, j), c in np.ndenumerate(counts):
        ax.text(j, i, str(c), ha="center", va="center", fontsize=7, color="black" if c < counts.max() / 2 else "white")
    ax.set(xlabel="predicted", ylabel="label", title=f"eval confusion matrix, step {step}")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    fig.tight_layout()
    path = plots / "confusion.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _counts(rows: dict[str, np.ndarray]) -> np.ndarray:
    num_classes = max(int(rows["label"].max(initial=0)), int(rows["predicted"].max(initial=0))) + 1
    return confusion(rows, num_classes)


def confusion_metric(rows: dict[str, np.ndarray], merged: dict[str, Any], context: EvalContext) -> dict[str, float]:
    """`confusion_matrix`: the plot and its JSON in the job dir (process 0 only); no scalar."""
    if context.job_dir is not None:
        write_confusion(_counts(rows), context.job_dir, context.step)
    return {}


def balanced_accuracy_metric(
    rows: dict[str, np.ndarray], merged: dict[str, Any], context: EvalContext
) -> dict[str, float]:
    return {"balanced_accuracy": balanced_accuracy(_counts(rows))}


def score(
    names: Sequence[str], rows: dict[str, np.ndarray], merged: dict[str, Any], context: EvalContext
) -> dict[str, float]:
    """Each named score metric over the epoch's real rows."""
    scores: dict[str, float] = {}
    for name in names:
        scores.update(resolve(name).function()(rows, merged, context))
    return scores
