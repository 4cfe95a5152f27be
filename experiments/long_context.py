"""Long-context language models trained by context parallelism: the sequence split over `context`.

lm_long_context: a tiny Llama-shaped byte-level model (RMSNorm, rotary positions, SwiGLU,
grouped-query attention with 4 query and 2 key/value heads) on 2048-byte windows of Shakespeare's
plays, on a mesh of 8 devices that all split the sequence: ICI (stage, data, fsdp, context,
tensor) = (1, 1, 1, 8, 1), so each device holds 256 tokens of every row, its queries attend to all
2048 keys (gathered over `context`), and its activations are an eighth of one device's
(docs/long_context.md). On a CPU: `XLA_FLAGS=--xla_force_host_platform_device_count=8`.

lm_long_context_32k: the same model at 32768 bytes a row, the long end of the memory benchmark
(benchmarks/context_parallel_memory.py, docs/long_context.md). Attention is XLA's dense kernel: its
scores are [S / 8, S] a head on each device, 2 GiB of float32 for the four heads, and one layer's
backward holds about 4 such arrays, so the step needs about 9 GiB a device: more than 8 fake CPU
devices find in one host's memory on a small machine.

Both choose XLA's attention outright: cuDNN's fused kernel does not take a sharded query
sequence (jax's partitioner of it refuses one), so on a GPU "auto" would be no faster and
context parallelism needs XLA's. Layers are scanned with remat "full": at long context the saved
activations, not the weights, decide what fits. No sample at the end: the point is the step.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import ByteTokenizerConfig, DataConfig, InputConfig, ShakespeareSource
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.layers import ActivationConfig, AttentionConfig, RmsNormConfig, TransformerConfig
from pax_eqx.learners import AdamWConfig, CosineSchedule, LearnerConfig
from pax_eqx.models import LanguageModelConfig
from pax_eqx.sharding.mesh import MeshConfig

CONTEXT = 8  # the devices that split each row


def _long_context(name: str, seq_len: int, layers: int, heads: int, kv_heads: int) -> ExperimentConfig:
    norm = RmsNormConfig(epsilon=1e-6)
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(implementation="xla"),
        activation=ActivationConfig(name="silu", gated=True),
        ff_has_bias=False,
    )
    return ExperimentConfig(
        name=name,
        model=LanguageModelConfig(
            vocab_size=260,
            max_seq_len=seq_len,
            num_layers=layers,
            model_dims=64,
            hidden_dims=256,
            num_heads=heads,
            num_kv_heads=kv_heads,
            position_embedding="rotary",
            block=block,
            final_norm=norm,
            repeat=True,
            remat_policy="full",
        ),
        learner=LearnerConfig(
            optimizer=AdamWConfig(b1=0.9, b2=0.95),
            learning_rate=3e-3,
            weight_decay=0.1,
            clip_grad_norm=1.0,
            schedule=CosineSchedule(warmup_steps=20, decay_end=0, min_ratio=0.1),
        ),
        data=DataConfig(
            source=ShakespeareSource(layout="stream"),
            seq_len=seq_len,
            tokenizer=ByteTokenizerConfig(),
            train=InputConfig(batch_size=1),
            eval=InputConfig(batch_size=1, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=4),
        ),
        mesh=MeshConfig(ici_mesh_shape=(1, 1, 1, CONTEXT, 1)),
        train=TrainConfig(num_steps=200, eval_interval_steps=100, summary_interval_steps=10, sample_at_end=False),
        checkpoint=CheckpointConfig(every_n_steps=100, max_to_keep=2),
    )


@register("lm_long_context", aliases=("LmLongContext",))
def lm_long_context() -> ExperimentConfig:
    """Tiny Llama-shaped byte LM at 2048 context, the sequence split 8 ways (context parallelism)."""
    return _long_context("lm_long_context", seq_len=2048, layers=2, heads=4, kv_heads=2)


@register("lm_long_context_32k", aliases=("LmLongContext32k",))
def lm_long_context_32k() -> ExperimentConfig:
    """lm_long_context at 32768 context, the sequence split 8 ways (the memory benchmark's long end)."""
    exp = _long_context("lm_long_context_32k", seq_len=32768, layers=2, heads=4, kv_heads=2)
    return exp.replace(train=exp.train.replace(num_steps=3, eval_interval_steps=0, summary_interval_steps=1))
