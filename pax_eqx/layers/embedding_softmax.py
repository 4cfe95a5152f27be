"""Embedding, FullSoftmax and SharedEmbeddingSoftmax (praxis.layers.embedding_softmax).

SharedEmbeddingSoftmax is the shared-layer case of the Layer Basics notebook: one weight
`w: [vocab, embed]` serves as the input embedding (`lookup`, a row gather) and as the output
projection (`logits`, `x @ w.T`). It is one module used in two places, so the weights are
shared by construction and receive the sum of both gradients.

The loss is computed in float32 from logits of any dtype; `soft_cap_logits` applies
`cap * tanh(logits / cap)` (Praxis' logits soft-capping), and label smoothing mixes the one-hot
target with the uniform distribution (`optax.smooth_labels`: `(1-p) * onehot + p / vocab`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, check_range, config, require_positive
from pax_eqx.layers.chunked_xent import chunked_softmax_xent
from pax_eqx.layers.initializers import WeightInit, gaussian
from pax_eqx.layers.linears import dense
from pax_eqx.quantization.products import quantized_lookup
from pax_eqx.quantization.quantized_weight import QuantizedWeight
from pax_eqx.sharding.activations import constrain


@config
class EmbeddingConfig(Config):
    """num_classes: vocabulary size; input_dims: embedding size; scale_sqrt_depth: multiply by sqrt(dims)."""

    num_classes: int
    input_dims: int
    init: WeightInit = gaussian(1.0)
    scale_sqrt_depth: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("num_classes", "input_dims"))

    def build(self, key: PRNGKeyArray) -> Embedding:
        return Embedding(self, key=key)


class Embedding(eqx.Module):
    emb_var: Float[Array, "vocab embed"]
    scale_sqrt_depth: bool = eqx.field(static=True)

    def __init__(self, cfg: EmbeddingConfig, *, key: PRNGKeyArray):
        self.emb_var = cfg.init(key, (cfg.num_classes, cfg.input_dims))
        self.scale_sqrt_depth = cfg.scale_sqrt_depth

    def __call__(self, ids: Int[Array, "*batch"]) -> Float[Array, "*batch embed"]:
        return _lookup(self.emb_var, ids, self.scale_sqrt_depth)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"emb_var": ("vocab", "embed")}


@config
class SoftmaxConfig(Config):
    """Output projection to `num_classes` logits and the cross-entropy loss.

    soft_cap_logits: 0 = off, else logits = cap * tanh(logits / cap).
    label_smoothing_prob: 0 = off.
    """

    input_dims: int
    num_classes: int
    init: WeightInit = WeightInit()
    use_bias: bool = True
    soft_cap_logits: float = 0.0
    label_smoothing_prob: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("input_dims", "num_classes"))
        _check_softmax_options(self)

    def build(self, key: PRNGKeyArray) -> FullSoftmax:
        return FullSoftmax(self, key=key)


class FullSoftmax(eqx.Module):
    w: Float[Array, "embed vocab"]
    b: Float[Array, " vocab"] | None
    soft_cap_logits: float = eqx.field(static=True)
    label_smoothing_prob: float = eqx.field(static=True)

    def __init__(self, cfg: SoftmaxConfig, *, key: PRNGKeyArray):
        self.w = cfg.init(key, (cfg.input_dims, cfg.num_classes))
        self.b = jnp.zeros((cfg.num_classes,), jnp.float32) if cfg.use_bias else None
        self.soft_cap_logits = cfg.soft_cap_logits
        self.label_smoothing_prob = cfg.label_smoothing_prob

    def logits(self, x: Float[Array, "*batch embed"]) -> Float[Array, "*batch vocab"]:
        logits = dense(x, self.w)
        if self.b is not None:
            logits = logits + self.b.astype(x.dtype)
        return soft_cap(logits, self.soft_cap_logits)

    def xent(self, logits: Float[Array, "*batch vocab"], labels: Int[Array, "*batch"]) -> Float[Array, "*batch"]:
        return cross_entropy(logits, labels, self.label_smoothing_prob)

    def chunked_xent_sums(
        self,
        x: Float[Array, "batch time embed"],
        labels: Int[Array, "batch time"],
        weights: Float[Array, "batch time"],
        chunk: int,
    ) -> tuple[Float[Array, ""], Float[Array, ""]]:
        """(sum of weighted cross-entropy, of weighted correct argmax) of `logits(x)`, `chunk`
        positions at a time without ever making the whole logits (`chunked_softmax_xent`)."""
        return _chunked_sums(self, self.w.T, x, labels, weights, chunk)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": ("embed", "vocab"), "b": ("vocab",)}


@config
class SharedEmbeddingSoftmaxConfig(Config):
    """One `[vocab, embed]` weight for the input embedding and the output softmax (tied).

    scale_sqrt_depth: the lookup is multiplied by sqrt(input_dims) (Praxis' option, set by Pax's
      LM experiments). use_bias: the logits get a zero-initialised `[vocab]` bias, as Praxis'
      SharedEmbeddingSoftmax (a FullSoftmax) has.
    """

    num_classes: int
    input_dims: int
    init: WeightInit = gaussian(1.0)
    scale_sqrt_depth: bool = False
    use_bias: bool = False
    soft_cap_logits: float = 0.0
    label_smoothing_prob: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("num_classes", "input_dims"))
        _check_softmax_options(self)

    def build(self, key: PRNGKeyArray) -> SharedEmbeddingSoftmax:
        return SharedEmbeddingSoftmax(self, key=key)


class SharedEmbeddingSoftmax(eqx.Module):
    w: Float[Array, "vocab embed"]
    b: Float[Array, " vocab"] | None
    scale_sqrt_depth: bool = eqx.field(static=True)
    soft_cap_logits: float = eqx.field(static=True)
    label_smoothing_prob: float = eqx.field(static=True)

    def __init__(self, cfg: SharedEmbeddingSoftmaxConfig, *, key: PRNGKeyArray):
        self.w = cfg.init(key, (cfg.num_classes, cfg.input_dims))
        self.b = jnp.zeros((cfg.num_classes,), jnp.float32) if cfg.use_bias else None
        self.scale_sqrt_depth = cfg.scale_sqrt_depth
        self.soft_cap_logits = cfg.soft_cap_logits
        self.label_smoothing_prob = cfg.label_smoothing_prob

    def lookup(self, ids: Int[Array, "*batch"]) -> Float[Array, "*batch embed"]:
        return _lookup(self.w, ids, self.scale_sqrt_depth)

    def logits(self, x: Float[Array, "*batch embed"]) -> Float[Array, "*batch vocab"]:
        logits = dense(x, self.w.T)
        if self.b is not None:
            logits = logits + self.b.astype(x.dtype)
        return soft_cap(logits, self.soft_cap_logits)

    def xent(self, logits: Float[Array, "*batch vocab"], labels: Int[Array, "*batch"]) -> Float[Array, "*batch"]:
        return cross_entropy(logits, labels, self.label_smoothing_prob)

    def chunked_xent_sums(
        self,
        x: Float[Array, "batch time embed"],
        labels: Int[Array, "batch time"],
        weights: Float[Array, "batch time"],
        chunk: int,
    ) -> tuple[Float[Array, ""], Float[Array, ""]]:
        """As FullSoftmax.chunked_xent_sums; the `[vocab, embed]` table is used as it is stored."""
        return _chunked_sums(self, self.w, x, labels, weights, chunk)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": ("vocab", "embed"), "b": ("vocab",)}


def _chunked_sums(
    softmax: FullSoftmax | SharedEmbeddingSoftmax, w_vocab_embed: Array | QuantizedWeight, x, labels, weights, chunk
):
    """Either softmax's logits options, applied by `chunked_softmax_xent` to its `[vocab, embed]` weight
    (a quantized one dequantized: the chunked loss reads the table in slices of its own)."""
    if isinstance(w_vocab_embed, QuantizedWeight):
        w_vocab_embed = w_vocab_embed.dequantize()
    return chunked_softmax_xent(
        x, w_vocab_embed, softmax.b, labels, weights, chunk=chunk,
        soft_cap=softmax.soft_cap_logits, label_smoothing=softmax.label_smoothing_prob,
    )  # fmt: skip


def _lookup(table: Array | QuantizedWeight, ids: Array, scale_sqrt_depth: bool) -> Array:
    """The rows of `table` [vocab, embed] at `ids` [batch, (seq)]: [batch, (seq), embed], the batch
    over the data axes (sharding.activations). The table's embed dimension is gathered first (its
    fsdp shards, as FSDP gathers every weight before use): a lookup from the sharded table comes
    out sharded on embed, which the partitioner can turn into batch rows only by replicating it.
    A quantized table (per-row scales) gives its rows' integers times their scales, float32."""
    names = ("batch", "seq", *[None] * (ids.ndim - 2))[: ids.ndim] + (None,)
    gathered = jax.tree.map(lambda a: constrain(a, ("vocab", None)), table)  # each of a quantized table's arrays
    if isinstance(gathered, QuantizedWeight):
        embs = constrain(quantized_lookup(gathered, ids), names)
    else:
        embs = constrain(jnp.take(gathered, ids, axis=0), names)
    return embs * math.sqrt(table.shape[-1]) if scale_sqrt_depth else embs


def _check_softmax_options(cfg: SoftmaxConfig | SharedEmbeddingSoftmaxConfig) -> None:
    check_range(cfg, "soft_cap_logits", ge=0, note="0 = off")
    check_range(cfg, "label_smoothing_prob", ge=0, lt=1)


def soft_cap(logits: Array, cap: float) -> Array:
    """cap * tanh(logits / cap); identity when cap == 0."""
    if cap <= 0.0:
        return logits
    return (cap * jnp.tanh(logits.astype(jnp.float32) / cap)).astype(logits.dtype)


def cross_entropy(
    logits: Float[Array, "*batch vocab"], labels: Int[Array, "*batch"], label_smoothing: float = 0.0
) -> Float[Array, "*batch"]:
    """Per-position cross-entropy in float32, `-sum(target * log_softmax(logits))`."""
    logits = logits.astype(jnp.float32)
    if label_smoothing == 0.0:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), label_smoothing)
    return optax.softmax_cross_entropy(logits, targets)
