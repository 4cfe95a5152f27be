"""The reference GPT's configuration: `ReferenceConfig`, the choices it accepts, and their checks.

Everything that names a model, numerics or optimizer choice of `benchmarks/reference_gpt.py` --
the remat policies, attention implementations, position embeddings, norms, activations and
compute dtypes -- with the validation that rejects an unknown or inconsistent choice when the
config is made, before anything is traced. `benchmarks.mfu` builds one from an experiment;
`resolve_attention_impl` turns "auto" into the kernel the step will use. Like the reference
itself, it imports nothing from pax_eqx.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# Remat policy names (the same vocabulary as pax_eqx.layers.remat, plus jax's own name for
# "full"). "none" means: no jax.checkpoint at all.
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # ... and the attention output, tagged "context" in reference_gpt's block, and with cuDNN the
    # fused kernel's forward outputs (output + softmax statistics), so it never runs twice.
    "dots_with_no_batch_dims_and_context": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            jax.checkpoint_policies.save_only_these_names("context"),
        ),
        lambda prim, *_, **__: prim.name == "dot_product_attention_fwd_wrapper",
    ),
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
}
ATTENTION_IMPLS = ("auto", "cudnn", "xla")
POSITION_EMBEDDINGS = ("learned", "rotary")
NORMS = ("layer_norm", "rms_norm")
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}
DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """Shape, numerics and optimizer of the reference GPT. Defaults: GPT3-XL, batch 16, bf16.

    hidden_dims: MLP width; None means 4 * model_dims.
    seq_len: training length and the size of the learned position table.
    remat_policy: a key of REMAT_POLICIES ("none" disables remat).
    unroll: layers per scan iteration (1 = rolled loop, num_layers = fully unrolled).
    attention_impl: "cudnn", "xla", or "auto" (cudnn on GPU, xla elsewhere).
    dtype: compute dtype name; params and optimizer state are always float32.
    use_bias: biases on the QKV and output projections (and the MLP's unless mlp_bias says).
    mlp_bias: biases on the MLP projections; None = use_bias.
    position_embedding: "learned" (a [seq_len, d] table added to the embedding) or "rotary"
      (RoPE on q and k, each head's first half rotated against its second half).
    activation: the MLP's, "gelu" (tanh approximation), "gelu_exact" (jax.nn.gelu's erf form),
      "relu" or "silu".
    norm: "layer_norm" or "rms_norm" (x / rms(x) * scale); norm_bias: LayerNorm's bias.
    scan_layers: layers stacked and scanned (True) or a Python loop over per-layer params.
    num_microbatches: the batch in this many sequential parts, their gradients summed in float32
      before one optimizer update (what `learner.num_microbatches` does): the same update, a
      fraction of the activations' memory.
    """

    num_layers: int = 24
    model_dims: int = 2048
    num_heads: int = 16
    hidden_dims: int | None = None
    seq_len: int = 2048
    vocab_size: int = 50304
    batch_size: int = 16
    remat_policy: str = "dots_with_no_batch_dims_saveable"
    unroll: int = 1
    attention_impl: str = "auto"
    dtype: str = "bfloat16"
    use_bias: bool = True
    layer_norm_epsilon: float = 1e-5
    init_std: float = 0.02
    learning_rate: float = 1e-4
    weight_decay: float = 0.1
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip_norm: float = 1.0
    mlp_bias: bool | None = None
    position_embedding: str = "learned"
    activation: str = "gelu"
    norm: str = "layer_norm"
    norm_bias: bool = True
    scan_layers: bool = True
    num_microbatches: int = 1

    def __post_init__(self) -> None:
        if self.hidden_dims is None:
            object.__setattr__(self, "hidden_dims", 4 * self.model_dims)
        if self.mlp_bias is None:
            object.__setattr__(self, "mlp_bias", self.use_bias)
        for name, choices in (
            ("position_embedding", POSITION_EMBEDDINGS), ("activation", tuple(ACTIVATIONS)), ("norm", NORMS),
        ):  # fmt: skip
            if getattr(self, name) not in choices:
                raise ValueError(f"ReferenceConfig.{name}={getattr(self, name)!r} is unknown; use one of {choices}.")
        if self.norm == "rms_norm" and self.norm_bias:
            raise ValueError("ReferenceConfig.norm='rms_norm' has no bias: set norm_bias=False.")
        if self.position_embedding == "rotary" and self.head_dims % 2:
            raise ValueError(f"ReferenceConfig: rotary positions need an even head dim, got {self.head_dims}.")
        for name in ("num_layers", "model_dims", "num_heads", "hidden_dims", "seq_len", "vocab_size", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ReferenceConfig.{name} must be > 0, got {getattr(self, name)}.")
        if self.num_microbatches <= 0 or self.batch_size % self.num_microbatches:
            raise ValueError(
                f"ReferenceConfig.num_microbatches={self.num_microbatches} must be > 0 and divide "
                f"batch_size={self.batch_size}."
            )
        if self.model_dims % self.num_heads:
            raise ValueError(
                f"ReferenceConfig.model_dims={self.model_dims} is not divisible by num_heads={self.num_heads}; "
                "pick num_heads that divides model_dims."
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"ReferenceConfig.remat_policy={self.remat_policy!r} is unknown; use one of {sorted(REMAT_POLICIES)}."
            )
        if not 1 <= self.unroll <= self.num_layers:
            raise ValueError(f"ReferenceConfig.unroll={self.unroll} must be in [1, num_layers={self.num_layers}].")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"ReferenceConfig.attention_impl={self.attention_impl!r} is unknown; use one of {ATTENTION_IMPLS}."
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"ReferenceConfig.dtype={self.dtype!r} is unknown; use one of {sorted(DTYPES)}.")

    @property
    def head_dims(self) -> int:
        return self.model_dims // self.num_heads

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def resolve_attention_impl(cfg: ReferenceConfig) -> str:
    """The `implementation=` passed to jax.nn.dot_product_attention ("cudnn" or "xla").

    "auto" picks cuDNN's fused flash attention on GPU (about 1.8x faster end to end for
    GPT3-XL on an H100) and XLA elsewhere. cuDNN needs head dims <= 256 and a multiple of 8,
    and a 16-bit dtype; this says so here rather than deep inside the kernel selection.
    """
    impl = cfg.attention_impl
    if impl == "auto":
        impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
    if impl == "cudnn":
        if cfg.head_dims > 256 or cfg.head_dims % 8:
            raise ValueError(
                f"attention_impl='cudnn' needs head dims (model_dims / num_heads = {cfg.head_dims}) <= 256 and a "
                "multiple of 8; change num_heads or use attention_impl='xla'."
            )
        if cfg.dtype == "float32":
            raise ValueError("attention_impl='cudnn' needs dtype 'bfloat16' or 'float16', got 'float32'.")
    return impl
