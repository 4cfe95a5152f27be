"""Pax's Chinchilla-like scaling series (paxml/tasks/lm/params/optimal_scaling.py), with Pax's numbers.

`OptimalScaling(LmCloudSpmd)` (not registered) grows the width with the depth: its `task()` sets
MODEL_DIMS = NUM_LAYERS x 128 and HIDDEN_DIMS = 4 x MODEL_DIMS before building, so with
LmCloudSpmd's DIMS_PER_HEAD 128 a model of L layers has L heads of 128. Everything else is
lm_cloud_spmd's (experiments/lm_cloud.py: GELU, fused QKV, caps 50 / 30, sinusoidal positions,
tied embedding, seq 1024, vocab 32000, bf16, synthetic data, set_default_adam(2.5e-4, 1e-3)), except
the remat policy: CHECKPOINT_POLICY SAVE_DOT_WITH_NO_BATCH_DIM, which saves the matmuls without a
batch dimension (jax's checkpoint_dots_with_no_batch_dims, our "dots_with_no_batch_dims_saveable").
Each class is named after its TPU slice (2x2x1 = 4 chips, ..., 4x24x32 = 3072 chips) and puts
every chip on Pax's `data` axis (our fsdp) or, from 4x8x8, data x 4-way `mdl`. Numbers:
docs/pax_experiment_numbers.md section 9.
"""

from __future__ import annotations

from experiments.lm_cloud import LM_CLOUD_SPMD, PaxLm, pax_names
from experiments.registry import register
from pax_eqx.experiment import ExperimentConfig


def optimal_scaling(num_layers: int, percore_batch_size: int, ici: tuple[int, int, int]) -> PaxLm:
    """OptimalScaling.task(): d = 128 x layers (heads of 128: as many as layers), MLP 4d."""
    dims = num_layers * 128
    return LM_CLOUD_SPMD.replace(
        num_layers=num_layers, model_dims=dims, hidden_dims=4 * dims, percore_batch_size=percore_batch_size,
        ici_mesh_shape=ici, checkpoint_policy="SAVE_DOT_WITH_NO_BATCH_DIM",
    )  # fmt: skip


# Pax class: (NUM_LAYERS, PERCORE_BATCH_SIZE, ICI_MESH_SHAPE).
SERIES = {
    "OptimalScaling2x2x1": (28, 16, (1, 4, 1)),
    "OptimalScaling2x2x2": (32, 8, (1, 8, 1)),
    "OptimalScaling2x2x4": (36, 8, (1, 16, 1)),
    "OptimalScaling2x4x4": (40, 8, (1, 32, 1)),
    "OptimalScaling4x4x4": (45, 8, (1, 64, 1)),
    "OptimalScaling4x4x8": (50, 4, (1, 128, 1)),
    "OptimalScaling4x8x8": (56, 2, (1, 64, 4)),
    "OptimalScaling4x8x16": (64, 2, (1, 128, 4)),
    "OptimalScaling4x16x16": (64, 1, (1, 256, 4)),
    "OptimalScaling4x16x32": (64, 1, (1, 512, 4)),
    "OptimalScaling4x24x32": (64, 1, (1, 768, 4)),
}
SPECS = {cls: optimal_scaling(*numbers) for cls, numbers in SERIES.items()}


def _register(cls: str, spec: PaxLm) -> None:
    name = "optimal_scaling_" + cls.removeprefix("OptimalScaling").lower()

    def build() -> ExperimentConfig:
        return spec.experiment(name)

    build.__name__ = name
    build.__doc__ = (
        f"{spec.num_layers} layers, d {spec.model_dims}, {spec.heads} heads of 128, MLP {spec.hidden_dims}, per-core "
        f"{spec.percore_batch_size:g} on ICI {spec.ici_mesh_shape}: batch {spec.global_batch_size}; remat saves the "
        "dots without a batch dimension."
    )
    register(name, aliases=pax_names("optimal_scaling", cls))(build)


for _cls, _spec in SPECS.items():
    _register(_cls, _spec)
