"""Pax's numbers for every lm_cloud / c4 experiment, copied from docs/pax_experiment_numbers.md.

One row per experiment, in the style of Pax's own c4_test (layers, dims, heads, vocab, sequence,
batch, mesh, dtype, steps). `pax_params` is the *derived* count the doc gives (rounded as it
prints it); `pax_param_count` recomputes it exactly from Pax's architecture, independently of
pax_eqx's model code.
"""

# ruff: noqa: E501  (one experiment per line, so the table reads as Pax's does)
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    pax_class: str
    layers: int
    dims: int
    hidden: int
    heads: int
    head_dim: int
    vocab: int
    seq: int
    global_batch: int
    ici: tuple[int, int, int]
    dcn: tuple[int, int, int]
    dtype: str
    repeat: bool
    steps: int
    pax_params: float  # the doc's derived count


E7 = 10_000_000
ONE = (1, 1, 1)

LM_CLOUD_SPMD = [
    Row("lm_cloud_spmd_test", "LmCloudSpmdTest", 2, 64, 256, 8, 8, 32000, 1024, 4, ONE, ONE, "bfloat16", True, E7, 2.2e6),
    Row("lm_cloud_spmd_2b", "LmCloudSpmd2B", 18, 3072, 12288, 24, 128, 32000, 1024, 32, (1, 4, 1), ONE, "bfloat16", True, E7, 2.137e9),
    Row("lm_cloud_spmd_2b_limit_steps", "LmCloudSpmd2BLimitSteps", 18, 3072, 12288, 24, 128, 32000, 1024, 32, (1, 4, 1), ONE, "bfloat16", True, 300, 2.137e9),
    Row("lm_cloud_spmd_32b", "LmCloudSpmd32B", 40, 8192, 32768, 64, 128, 32000, 1024, 512, (1, 16, 4), ONE, "bfloat16", True, E7, 32.48e9),
    Row("lm_cloud_spmd_64b", "LmCloudSpmd64B", 51, 10240, 40960, 80, 128, 32000, 1024, 512, (1, 16, 8), ONE, "bfloat16", True, E7, 64.50e9),
    Row("lm_cloud_spmd_128b", "LmCloudSpmd128B", 71, 12288, 49152, 96, 128, 32000, 1024, 1024, (1, 64, 4), ONE, "bfloat16", True, E7, 129.0e9),
    Row("lm_cloud_spmd_256b", "LmCloudSpmd256B", 80, 16384, 65536, 128, 128, 32000, 1024, 2048, (1, 64, 8), ONE, "bfloat16", True, E7, 258.2e9),
    Row("lm_cloud_spmd_512b", "LmCloudSpmd512B", 102, 20480, 81920, 160, 128, 32000, 1024, 4096, (1, 64, 16), ONE, "bfloat16", True, E7, 514.1e9),
    Row("lm_cloud_spmd_1024b", "LmCloudSpmd1024B", 142, 24576, 98304, 192, 128, 32000, 1024, 4096, (1, 256, 8), ONE, "bfloat16", True, E7, 1030e9),
]  # fmt: skip

LM_CLOUD_TRANSFORMER_ADAM = [
    Row("lm_cloud_transformer_adam", "LmCloudTransformerAdam", 32, 1024, 4096, 16, 64, 32000, 1024, 16, ONE, ONE, "float32", False, E7, 0.436e9),
    Row("lm_cloud_transformer_adam_test", "LmCloudTransformerAdamTest", 2, 1024, 4096, 16, 64, 32000, 1024, 16, ONE, ONE, "float32", False, E7, 58e6),
    Row("lm_cloud_transformer_adam_limit_steps", "LmCloudTransformerAdamLimitSteps", 10, 1024, 4096, 16, 64, 32000, 1024, 16, ONE, ONE, "float32", False, 2000, 159e6),
]  # fmt: skip

C4_SPMD = [
    Row("c4_spmd_adam", "C4SpmdAdam", 24, 2048, 8192, 32, 64, 32128, 1024, 8, (1, 4, 2), ONE, "float32", False, E7, 1.274e9),
    Row("c4_spmd_1b_adam_4replicas", "C4Spmd1BAdam4Replicas", 13, 2560, 10240, 20, 128, 32000, 1024, 128, (1, 4, 1), ONE, "bfloat16", True, E7, 1.105e9),
    Row("c4_spmd_1b_adam_4replicas_limit_steps", "C4Spmd1BAdam4ReplicasLimitSteps", 13, 2560, 10240, 20, 128, 32000, 1024, 128, (1, 4, 1), ONE, "bfloat16", True, 15000, 1.105e9),
    Row("c4_spmd_2b", "C4Spmd2BAdam4Replicas", 18, 3072, 12288, 24, 128, 32000, 1024, 128, (1, 4, 1), ONE, "bfloat16", True, E7, 2.137e9),
    Row("c4_spmd_16b_adam_32replicas", "C4Spmd16BAdam32Replicas", 36, 6144, 24576, 48, 128, 32000, 1024, 512, (1, 16, 2), ONE, "bfloat16", True, E7, 16.51e9),
    Row("c4_spmd_32b", "C4Spmd32BAdam64Replicas", 40, 8192, 32768, 64, 128, 32000, 1024, 512, (1, 16, 4), ONE, "bfloat16", True, E7, 32.48e9),
    Row("c4_spmd_22b_1xv4_128", "C4Spmd22BAdam1xv4_128", 48, 6144, 24576, 24, 256, 32768, 1024, 1024, (1, 64, 1), ONE, "bfloat16", True, E7, 21.95e9),
    Row("c4_spmd_22b_2xv4_128", "C4Spmd22BAdam2xv4_128", 48, 6144, 24576, 24, 256, 32768, 1024, 2048, (1, 64, 1), (2, 1, 1), "bfloat16", True, E7, 21.95e9),
    Row("c4_spmd_22b_4xv4_128", "C4Spmd22BAdam4xv4_128", 48, 6144, 24576, 24, 256, 32768, 1024, 4096, (1, 64, 1), (4, 1, 1), "bfloat16", True, E7, 21.95e9),
]  # fmt: skip

C4_GPT3 = [
    Row("c4_gpt3_175b", "C4SpmdGpt3AdamOrgHP", 96, 12288, 49152, 96, 128, 50257, 2048, 8, (1, 4, 2), ONE, "float32", True, E7, 174.78e9),
]  # fmt: skip

ALL = LM_CLOUD_SPMD + LM_CLOUD_TRANSFORMER_ADAM + C4_SPMD + C4_GPT3
# The Pax module of each class, for Pax's `--exp tasks.lm.params.<module>.<Class>` spelling.
MODULE = {r.name: "lm_cloud" for r in LM_CLOUD_SPMD + LM_CLOUD_TRANSFORMER_ADAM}
MODULE |= {r.name: "c4_multislice" if "22b" in r.name else "c4" for r in C4_SPMD + C4_GPT3}


def pax_param_count(row: Row) -> int:
    """Parameters of Pax's model, from its architecture (docs/pax_experiment_numbers.md section 1).

    Per layer: fused or separate Q/K/V and output projections (with biases only for GPT-3),
    PerDimScale (head_dim, not GPT-3), MLP with biases, two LayerNorms (scale + bias). Then the
    tied embedding (vocab x dims), the softmax bias (vocab, not GPT-3), the learned position
    table of GPT-3 (16384 rows) and the final LayerNorm.
    """
    d, h, n, hd, v = row.dims, row.hidden, row.heads, row.head_dim, row.vocab
    gpt3 = row in C4_GPT3
    attention = 4 * d * n * hd + (3 * n * hd + d if gpt3 else 0) + (0 if gpt3 else hd)
    mlp = 2 * d * h + h + d
    layer = attention + mlp + 2 * 2 * d
    extra = (16384 * d) if gpt3 else v  # GPT-3: learned positions, no softmax bias
    return row.layers * layer + v * d + extra + 2 * d
