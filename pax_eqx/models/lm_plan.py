"""A language model's share of the dry run (`LanguageModelConfig.step_plan`): the activations
one train step holds per device, and the layout lines of a pipelined or MoE model.

The estimate counts, per layer, what the remat policy saves for the backward (`_POLICY_SAVED`,
in units of one [batch, seq, model_dims] activation), one layer's working set, the attention
scores where cuDNN's fused kernel does not run, and the float32 logits (a chunk of them with
`loss_chunk_size`). It is arithmetic on the config: nothing is traced.

Under context parallelism (the `seq` logical axis on a mesh axis of N devices) every [batch, seq,
...] activation holds S / N tokens of each row a device; attention's queries are those S / N and
its keys all S, so the scores are [S / N, S] a head and one layer's working set also holds the
gathered keys and values, [S, kv heads, head dim] each (`tokens_per_device`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from pax_eqx.layers.moe_routing import capacity
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.models.model import StepPlan, StepShape


def language_model_plan(cfg: LanguageModelConfig, step: StepShape) -> StepPlan:
    """The activation estimate, what it assumes, and the all-to-all and pipeline lines."""
    s_d = tokens_per_device(step)
    split = s_d < step.seq_len
    seq = f"seq {step.seq_len}" + (f" ({s_d} a device over {'x'.join(step.rules['seq'])})" if split else "")
    if flash_attention(cfg, step.fprop_dtype, split):
        attention = "cuDNN flash on GPU"
    elif split:
        attention = "XLA, with S / N x S scores (cuDNN's kernel takes no split sequence)"
    else:
        attention = "XLA, with S x S scores"
    note = (
        f"per-device batch {step.global_batch // step.ways('batch')}, {seq}, remat {cfg.remat_policy}, "
        f"attention {attention}"
    )
    return StepPlan(_activation_bytes(cfg, step), note, [*_all_to_all_lines(cfg, step), *_pipeline_lines(cfg, step)])


_POLICY_SAVED = {
    "full": lambda d, h: 1.0,
    "save_context_and_out_proj": lambda d, h: 3.0,
    "save_qkv_context_and_out_proj": lambda d, h: 6.0,
    "dots_with_no_batch_dims_saveable": lambda d, h: 6 + h / d,
    "dots_with_no_batch_dims_and_context": lambda d, h: 7 + h / d,
    "dots_saveable": lambda d, h: 7 + h / d,
    "everything_saveable": lambda d, h: 10 + 2 * h / d,
    # No remat keeps every intermediate: fitted to XLA:CPU's compiled step (float32, d = 512, H = 1024,
    # 2048, 4096: 22.3, 31, 47.1 units a layer, i.e. 12 + 4 H/d; the feed-forward's GELU keeps its
    # pre-activation, intermediate products and output, H-sized each), plus NONE_SCORES below.
    "none": lambda d, h: 12 + 4 * h / d,
}
# With XLA's attention and no remat, each layer also keeps about 2.5 [S x S] float32 score-sized
# arrays per head (the scores, the probabilities, the mask's share): 8 heads -> 2 heads at S = 64
# moved the compiled step by 1.9 units a layer for 0.75 units of scores (tests/sharding/test_planner_vs_xla.py).
NONE_SCORES = 2.5
# One layer's backward through XLA's attention holds about 4 score-sized float32 arrays at once (the
# recomputed logits, the probabilities, their gradient and the logits'): XLA:CPU's compiled step of
# lm_long_context (2048 tokens, width 64, remat full) kept 4.2 at 1, 4 and 8 context shards (3.4 at 2),
# where one was counted before (benchmarks/context_parallel_memory.py, tests/sharding/test_context_parallel.py).
LAYER_SCORES = 4


def _bytes(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def flash_attention(cfg: LanguageModelConfig, fprop_dtype: str, split_sequence: bool = False) -> bool:
    """Whether attention will run as cuDNN's fused kernel on a GPU (no S x S scores in memory):
    the conditions of `layers.attention_kernels.cudnn_qualifies`, read off the config (of a
    language model's config). split_sequence: the queries' sequence is sharded (context
    parallelism), which cuDNN's kernel does not take (jax's partitioner of it refuses a sharded
    sequence dimension): XLA's attention then, with its S / N x S scores."""
    if split_sequence:
        return False
    a = cfg.block.attention
    head_dim = cfg.dim_per_head or cfg.model_dims // cfg.num_heads
    qualifies = (
        fprop_dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 256
        and a.logit_cap == 0.0 and a.dropout_prob == 0.0
    )  # fmt: skip
    return a.implementation == "cudnn" or (a.implementation == "auto" and qualifies)


def tokens_per_device(step: StepShape) -> int:
    """The tokens of one row a device holds: the sequence over the `seq` rule's mesh axes (context
    parallelism) where they divide it, else the whole sequence (the rules leave it replicated)."""
    ways = step.ways("seq")
    return step.seq_len // ways if step.seq_len % ways == 0 else step.seq_len


def _activation_bytes(cfg: LanguageModelConfig, step: StepShape) -> int:
    m = cfg
    s, d = tokens_per_device(step), m.model_dims  # a row's tokens on one device; attention's keys: all of them
    keys = step.seq_len
    flash = flash_attention(cfg, step.fprop_dtype, s < keys)
    ways = step.ways
    batch = step.global_batch // ways("batch")
    h_t = m.hidden_dims / ways("mlp")
    n_t = m.num_heads / ways("heads")
    v_t = m.vocab_size / ways("vocab")
    nbytes = 2 if step.fprop_dtype == "bfloat16" else 4
    c = lambda policy: _POLICY_SAVED[policy](d, m.hidden_dims)
    p = _pipeline(cfg)
    if p is None:
        saved = m.num_layers * batch * s * d * c(m.remat_policy) * nbytes
        if m.remat_policy == "none" and not flash:
            saved += m.num_layers * batch * n_t * s * keys * 4 * NONE_SCORES
    else:
        batch = (
            step.global_batch
            // step.num_microbatches
            // p.num_microbatches
            // (ways("batch") // step.mesh_shape["stage"])
        )
        chunk = m.num_layers // p.num_chunks
        token = batch * s * d * nbytes  # one microbatch's [rows, s, d] on a device
        if p.remat_stage:  # each iteration keeps its stage input (+ what the policy names in its layers) ...
            saved = p.num_iterations * token * (1 + chunk * (c(m.remat_policy) - 1))
            saved += chunk * token * c("none")  # ... and the backward recomputes one stage whole
        else:
            saved = p.num_iterations * chunk * token * c(m.remat_policy)
        saved += 2 * p.num_microbatches * token  # the microbatch buffer, in and out
    layer = batch * s * (6 * d + 2 * h_t) * nbytes
    if not flash:
        layer += batch * n_t * s * keys * 4 * LAYER_SCORES
    if s < keys:  # the keys and values gathered over the context axis
        kv_t = (m.num_kv_heads or m.num_heads) / ways("kv_heads")
        layer += 2 * batch * keys * kv_t * m.head_dim * nbytes
    outside = step.global_batch // ways("batch")  # logits: the whole per-device batch, outside any pipeline
    if m.loss_chunk_size:
        logits = 2 * outside * min(s, m.loss_chunk_size) * v_t * 4 + v_t * d * 4
    else:
        logits = outside * s * v_t * 4
    return int(saved + layer + logits)


def _pipeline(cfg: LanguageModelConfig) -> Any:
    """The model's PipelineConfig when it pipelines its layers, else None."""
    pipeline = cfg.pipeline
    return pipeline if pipeline is not None and pipeline.enabled else None


def _pipeline_lines(cfg: LanguageModelConfig, step: StepShape) -> list[str]:
    """Stages, microbatches, the bubble, and what moves between stages."""
    p = _pipeline(cfg)
    if p is None:
        return []
    m = cfg
    chunk = m.num_layers // p.num_chunks
    rows = step.global_batch // step.num_microbatches // p.num_microbatches
    rows_d = rows // (step.mesh_shape["data"] * step.mesh_shape["fsdp"])
    nbytes = jnp.dtype(step.fprop_dtype).itemsize
    hop = rows_d * tokens_per_device(step) * m.model_dims * nbytes
    schedule = (
        f"GPipe: stage s holds layers [{chunk}s, {chunk}s + {chunk})"
        if p.circular_repeat == 1
        else f"circular: {p.num_chunks} chunks of {chunk} layers, chunk c on stage c % {p.num_stages}, "
        f"{p.circular_repeat} rounds per microbatch"
    )
    lines = [
        f"Pipeline: {p.num_stages} stages x {m.num_layers // p.num_stages} layers ({schedule}); "
        f"{p.num_microbatches} microbatches of {rows} rows ({rows_d} per device), {p.num_iterations} iterations "
        f"a step; bubble (S - 1) / (M x R + S - 1) = {p.bubble_fraction:.1%}",
        f"  stage to stage: {_bytes(hop)} per device per iteration (collective permute on stage), "
        f"{_bytes(2 * hop * p.num_iterations * step.num_microbatches)} a step with the backward",
    ]
    if p.circular_repeat > 1:
        lines.append(
            "  circular: the stacked weights are regrouped from layer order to [stage, round, layer] each step "
            "(an all-to-all over stage, and their gradients back)"
        )
    return lines


def _all_to_all_lines(cfg: LanguageModelConfig, step: StepShape) -> list[str]:
    """The bytes an MoE language model's train step moves by all-to-all: every MoE layer sends its
    dispatch buffer [E, G, C, M] to the experts and the combine buffer back, forward and again in
    the backward (4 buffers a layer a step); a device keeps its own (n - 1) / n share of each."""
    m = cfg
    if not m.moe_layer_interval:
        return []
    ways = step.ways("expert")
    if ways <= 1 or m.moe.num_experts % ways:
        return []
    if m.moe.dropless:
        return ["All-to-all: none (dropless routing computes every expert on its tokens in place)"]
    batch, time = step.global_batch // step.num_microbatches, step.seq_len
    groups = m.moe.num_groups or batch
    group_size = batch * time // groups
    slots = capacity(group_size, m.moe.num_experts, m.moe.capacity_factor, m.moe.min_capacity)
    nbytes = jnp.dtype(step.fprop_dtype).itemsize
    layer = 4 * m.moe.num_experts * groups * slots * m.model_dims * nbytes
    moe_layers = m.num_layers // m.moe_layer_interval
    total = layer * moe_layers * step.num_microbatches
    per_device = total * (ways - 1) / ways / ways
    return [
        f"All-to-all per step: {_bytes(total)} over the expert axis ({moe_layers} MoE layers x 4 buffers of "
        f"[{m.moe.num_experts} experts, {groups} groups, capacity {slots}, {m.model_dims}] {step.fprop_dtype}"
        f"{f' x {step.num_microbatches} microbatches' if step.num_microbatches > 1 else ''}); "
        f"each of the {ways} devices sends {_bytes(per_device)}"
    ]
