"""Pax's multislice C4 experiments (paxml/tasks/lm/params/c4_multislice.py), with Pax's numbers.

MaxText-style models on TPU v4 / v5 slices, the slices joined over DCN (Pax's DCN_MESH_SHAPE
[slices, 1, 1]: the replica axis, our `data`, crosses the slices). Every class is c4's
(experiments/c4.py: C4 data, c4's Adam recipe for the global batch, bf16, repeated layers with
SAVE_NOTHING remat, summaries every 10 steps) with its own shape; numbers from
docs/pax_experiment_numbers.md section 5. A class is a `PaxLm` value; a subclass `.replace(...)`.

C4SpmdGpt3AdamDataParallel2x16x16 is GPT-3 175B (c4_gpt3_175b) with data parallelism across two
slices, for 100 steps. It sets `summary_verbosity = 0` (no layer summaries: pax_eqx's default)
and CHECKPOINT_SAVE_MAX_TO_KEEP = 20, which no base reads (CHECKPOINT_MAX_TO_KEEP stays 10).
"""

from __future__ import annotations

from experiments.c4 import C4_GPT3_175B, C4_SPMD_ADAM, c4_recipe, gpt3_org_hp
from experiments.lm_cloud import PaxLm, pax_names
from experiments.registry import register
from pax_eqx.experiment import ExperimentConfig

# C4Spmd22BAdamMaxText(c4.C4SpmdAdam): the mesh stays C4SpmdAdam's (1, 4, 2).
C4_SPMD_22B_MAXTEXT = c4_recipe(
    C4_SPMD_ADAM.replace(
        num_layers=48, model_dims=6144, hidden_dims=24576, num_heads=24, dims_per_head=256, percore_batch_size=16,
        vocab_size=32768, fprop_dtype="bfloat16", use_repeated_layer=True, summary_interval_steps=10,
        checkpoint_policy="SAVE_NOTHING",
    )
)  # fmt: skip


def _slices(spec: PaxLm, slices: int, steps: int = 0) -> PaxLm:
    """The spec on `slices` slices (DCN (slices, 1, 1)); steps > 0: a LimitSteps class."""
    spec = spec.replace(dcn_mesh_shape=(slices, 1, 1))
    return c4_recipe(spec.replace(num_train_steps=steps) if steps else spec)


C4_SPMD_22B_V4_128 = c4_recipe(C4_SPMD_22B_MAXTEXT.replace(ici_mesh_shape=(1, 64, 1), percore_batch_size=16))
C4_SPMD_22B_V4_384 = c4_recipe(
    C4_SPMD_22B_MAXTEXT.replace(
        num_layers=24, model_dims=9216, hidden_dims=4 * 9216, num_heads=24, dims_per_head=384, percore_batch_size=10,
        ici_mesh_shape=(1, 192, 1),
    )
)  # fmt: skip
C4_SPMD_22B_V4_8 = c4_recipe(
    C4_SPMD_22B_MAXTEXT.replace(
        num_layers=16, model_dims=2048, hidden_dims=4 * 2048, num_heads=8, dims_per_head=256, percore_batch_size=16,
        ici_mesh_shape=(1, 4, 1),
    )
)  # fmt: skip
# C4Spmd32BAdam1xv5_256(C4Spmd22BAdam1xv4_128): seq 2048, per-core 2 on (1, 128, 1). Its
# docstring's "1 * 128 * 1 * 16 = 2048" is not its PER_CORE_BATCH_SIZE of 2: the batch is 256.
C4_SPMD_32B_V5_256 = c4_recipe(
    C4_SPMD_22B_V4_128.replace(
        num_layers=40, model_dims=8192, hidden_dims=4 * 8192, num_heads=32, dims_per_head=256, percore_batch_size=2,
        max_seq_len=2048, ici_mesh_shape=(1, 128, 1), device_kind="tpu_v5e",  # v5_256: a v5e pod slice
    )
)  # fmt: skip
# C4SpmdGpt3AdamDataParallel2x16x16(c4.C4SpmdGpt3AdamOrgHP): per-core 0.5 on (1, 16, 16) x (2, 1, 1).
C4_GPT3_DATA_PARALLEL_2X16X16 = gpt3_org_hp(
    C4_GPT3_175B.replace(
        percore_batch_size=0.5, ici_mesh_shape=(1, 16, 16), dcn_mesh_shape=(2, 1, 1), fprop_dtype="bfloat16",
        checkpoint_every_n_steps=2000, num_train_steps=100,
    )
)  # fmt: skip


def _register(name: str, cls: str, spec: PaxLm, doc: str) -> None:
    def build() -> ExperimentConfig:
        return spec.experiment(name)

    build.__name__ = name
    build.__doc__ = doc
    register(name, aliases=pax_names("c4_multislice", cls))(build)


_22B = "22B MaxText-style: 48 layers, d 6144, 24 heads of 256, vocab 32768, bf16"
_V4_384 = "24 layers, d 9216, 24 heads of 384, vocab 32768, bf16"
_V4_8 = "0.87B: 16 layers, d 2048, 8 heads of 256, vocab 32768, bf16"
_32B = "32B: 40 layers, d 8192, 32 heads of 256, seq 2048, vocab 32768, bf16"

for _name, _cls, _spec, _doc in [
    ("c4_spmd_22b_maxtext", "C4Spmd22BAdamMaxText", C4_SPMD_22B_MAXTEXT,
     f"{_22B}, per-core 16 on C4SpmdAdam's (1, 4, 2): batch 128."),
    ("c4_spmd_22b_1xv4_128", "C4Spmd22BAdam1xv4_128", C4_SPMD_22B_V4_128,
     f"{_22B}, per-core 16 on ICI (1, 64, 1): batch 1024."),
    ("c4_spmd_22b_2xv4_128", "C4Spmd22BAdam2xv4_128", _slices(C4_SPMD_22B_V4_128, 2),
     "c4_spmd_22b on two v4-128 slices: ICI (1, 64, 1) x DCN (2, 1, 1), global batch 2048."),
    ("c4_spmd_22b_4xv4_128", "C4Spmd22BAdam4xv4_128", _slices(C4_SPMD_22B_V4_128, 4),
     "c4_spmd_22b on four v4-128 slices: ICI (1, 64, 1) x DCN (4, 1, 1), global batch 4096."),
    ("c4_spmd_22b_1xv4_128_limit_steps", "C4Spmd22BAdam1xv4_128LimitSteps", _slices(C4_SPMD_22B_V4_128, 1, 300),
     "c4_spmd_22b_1xv4_128 for 300 steps."),
    ("c4_spmd_22b_2xv4_128_limit_steps", "C4Spmd22BAdam2xv4_128LimitSteps", _slices(C4_SPMD_22B_V4_128, 2, 300),
     "c4_spmd_22b_2xv4_128 for 300 steps."),
    ("c4_spmd_22b_4xv4_128_limit_steps", "C4Spmd22BAdam4xv4_128LimitSteps", _slices(C4_SPMD_22B_V4_128, 4, 300),
     "c4_spmd_22b_4xv4_128 for 300 steps."),
    ("c4_spmd_22b_1xv4_384", "C4Spmd22BAdam1xv4_384", C4_SPMD_22B_V4_384,
     f"24.8B: {_V4_384}, per-core 10 on ICI (1, 192, 1): batch 1920."),
    ("c4_spmd_22b_2xv4_384", "C4Spmd22BAdam2xv4_384", _slices(C4_SPMD_22B_V4_384, 2),
     f"24.8B: {_V4_384}, per-core 10 on ICI (1, 192, 1) x DCN (2, 1, 1): batch 3840."),
    ("c4_spmd_22b_1xv4_8", "C4Spmd22BAdam1xv4_8", C4_SPMD_22B_V4_8,
     f"{_V4_8}, per-core 16 on ICI (1, 4, 1): batch 64."),
    ("c4_spmd_22b_2xv4_8", "C4Spmd22BAdam2xv4_8", _slices(C4_SPMD_22B_V4_8, 2),
     f"{_V4_8}, per-core 16 on ICI (1, 4, 1) x DCN (2, 1, 1): batch 128."),
    ("c4_spmd_22b_4xv4_8", "C4Spmd22BAdam4xv4_8", _slices(C4_SPMD_22B_V4_8, 4),
     f"{_V4_8}, per-core 16 on ICI (1, 4, 1) x DCN (4, 1, 1): batch 256."),
    ("c4_spmd_22b_1xv4_8_limit_steps", "C4Spmd22BAdam1xv4_8LimitSteps", _slices(C4_SPMD_22B_V4_8, 1, 300),
     "c4_spmd_22b_1xv4_8 for 300 steps."),
    ("c4_spmd_22b_2xv4_8_limit_steps", "C4Spmd22BAdam2xv4_8LimitSteps", _slices(C4_SPMD_22B_V4_8, 2, 300),
     "c4_spmd_22b_2xv4_8 for 300 steps."),
    ("c4_spmd_22b_4xv4_8_limit_steps", "C4Spmd22BAdam4xv4_8LimitSteps", _slices(C4_SPMD_22B_V4_8, 4, 300),
     "c4_spmd_22b_4xv4_8 for 300 steps."),
    ("c4_spmd_32b_1xv5_256", "C4Spmd32BAdam1xv5_256", C4_SPMD_32B_V5_256,
     f"{_32B}, per-core 2 on ICI (1, 128, 1): batch 256."),
    ("c4_spmd_32b_2xv5_256", "C4Spmd32BAdam2xv5_256", _slices(C4_SPMD_32B_V5_256, 2),
     f"{_32B}, per-core 2 on ICI (1, 128, 1) x DCN (2, 1, 1): batch 512."),
    ("c4_gpt3_175b_data_parallel_2x16x16", "C4SpmdGpt3AdamDataParallel2x16x16", C4_GPT3_DATA_PARALLEL_2X16X16,
     "GPT-3 175B (c4_gpt3_175b's OrgHP recipe), bf16, per-core 0.5 on ICI (1, 16, 16) x DCN (2, 1, 1): batch 256; "
     "100 steps, checkpoints every 2000."),
]:  # fmt: skip
    _register(_name, _cls, _spec, _doc)
