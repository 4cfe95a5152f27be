"""One step's outputs as the named floats that TensorBoard and metrics.jsonl take.

    scalars = step_scalars(jax.device_get(outputs.metrics), jax.device_get(outputs.summaries))

A weighted metric becomes its value (its weight says how much it averaged, not what it is). A
layer summary that is a scalar keeps its name; one with a leading axis -- a scanned stack's
summaries come back one per layer -- becomes one scalar per entry, `<name>/<index>`
(`transformer/repeat/activation_rms/3` is layer 3's); anything larger is averaged over its
trailing axes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pax_eqx.metrics import Weighted


def step_scalars(metrics: Mapping[str, Weighted], summaries: Mapping[str, Any] | None = None) -> dict[str, float]:
    scalars = {name: float(np.asarray(m.value)) for name, m in metrics.items()}
    for name, value in (summaries or {}).items():
        value = np.asarray(value, np.float64)
        if value.ndim == 0:
            scalars[name] = float(value)
            continue
        per_entry = value.reshape(value.shape[0], -1).mean(axis=1)
        scalars.update({f"{name}/{i}": float(v) for i, v in enumerate(per_entry)})
    return scalars


def mean_summaries(batches: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The mean of each summary over several fetched batches (an eval run)."""
    if not batches:
        return {}
    # np.mean of scalars is an np.float64, not an array: asarray keeps the declared return type.
    return {
        name: np.asarray(np.mean([np.asarray(b[name], np.float64) for b in batches], axis=0)) for name in batches[0]
    }


def with_loss_alias(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with "loss" standing for "total_loss" where only the latter is there: the name the
    console prints, which metrics.jsonl, early stopping and `tune --metric` all accept."""
    if "loss" not in values and "total_loss" in values:
        return {"loss": values["total_loss"], **values}
    return dict(values)
