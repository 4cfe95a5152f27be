"""The Transformer layer (praxis.layers.transformers.Transformer + TransformerFeedForward).

    attention block:  x + dropout(attention(norm(x)))            (norm_policy "pre")
                      norm(x + dropout(attention(x)))            ("post")
                      x + dropout(norm_post(attention(norm(x)))) ("primer_hybrid")
    feed-forward:     the same policy around  W2 dropout(act(W1 x + b1)) + b2

The layer is a template for the stacks in `repeats.py`: `model_dims`, `hidden_dims` and
`num_heads` are set by the parent, the children's configs (attention, norm, activation) are
child templates whose dimensions this layer fills in, as Pax's `setup` does.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, config
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.attentions import Attention, AttentionConfig, KVCache
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.linears import Bias, BiasConfig, FeedForward, FeedForwardConfig, Linear, LinearConfig
from pax_eqx.layers.normalizations import NormConfig
from pax_eqx.layers.stochastics import Dropout, DropoutConfig

NormPolicy = Literal["pre", "post", "primer_hybrid"]


@config
class TransformerConfig(Config):
    """One decoder/encoder layer: self-attention then a feed-forward block.

    model_dims / hidden_dims / num_heads: sizes (hidden_dims: the feed-forward width).
    norm_policy: "pre", "post" or "primer_hybrid" (norm before and after each sub-block).
    norm: the normalisation template (its dims are set here).
    attention: the attention template (input_dims/num_heads set here).
    activation: the feed-forward activation (gated=True gives GeGLU/SwiGLU).
    ff_has_bias: biases in the feed-forward projections.
    residual_dropout_prob / relu_dropout_prob: dropout on each sub-block's output / on the
      feed-forward hidden activations (Praxis' names).
    """

    model_dims: int = 0
    hidden_dims: int = 0
    num_heads: int = 0
    norm_policy: NormPolicy = "pre"
    norm: NormConfig = NormConfig()
    attention: AttentionConfig = AttentionConfig()
    activation: ActivationConfig = ActivationConfig(name="relu")
    ff_has_bias: bool = True
    residual_dropout_prob: float = 0.0
    relu_dropout_prob: float = 0.0
    init: WeightInit = WeightInit()

    def build(self, key: PRNGKeyArray) -> Transformer:
        return Transformer(self, key=key)


class Transformer(eqx.Module):
    attention_norm: eqx.Module
    attention_post_norm: eqx.Module | None
    attention: Attention
    ff_norm: eqx.Module
    ff_post_norm: eqx.Module | None
    ff_in: FeedForward
    ff_out: Linear
    ff_out_bias: Bias | None
    residual_dropout: Dropout
    relu_dropout: Dropout
    norm_policy: str = eqx.field(static=True)

    def __init__(self, cfg: TransformerConfig, *, key: PRNGKeyArray):
        d, hdim = cfg.model_dims, cfg.hidden_dims
        if d <= 0 or hdim <= 0 or cfg.num_heads <= 0:
            raise ValueError(
                f"TransformerConfig needs model_dims, hidden_dims, num_heads > 0; got {d}, {hdim}, {cfg.num_heads}."
            )
        k_att, k_in, k_out = jax.random.split(key, 3)
        norm = cfg.norm.replace(dims=d)
        hybrid = cfg.norm_policy == "primer_hybrid"
        self.attention_norm = norm.build()
        self.attention_post_norm = norm.build() if hybrid else None
        self.ff_norm = norm.build()
        self.ff_post_norm = norm.build() if hybrid else None
        self.attention = cfg.attention.replace(input_dims=d, num_heads=cfg.num_heads, init=cfg.init).build(k_att)
        self.ff_in = FeedForwardConfig(
            input_dims=d, output_dims=hdim, has_bias=cfg.ff_has_bias, activation=cfg.activation,
            init=cfg.init, axes=("embed", "mlp"),
        ).build(k_in)  # fmt: skip
        self.ff_out = LinearConfig(input_dims=hdim, output_dims=d, init=cfg.init, axes=("mlp", "embed")).build(k_out)
        self.ff_out_bias = BiasConfig(dims=d, axis="embed").build() if cfg.ff_has_bias else None
        self.residual_dropout = DropoutConfig(rate=cfg.residual_dropout_prob).build()
        self.relu_dropout = DropoutConfig(rate=cfg.relu_dropout_prob).build()
        self.norm_policy = cfg.norm_policy

    def __call__(
        self,
        x: Float[Array, "batch time embed"],
        ctx: Context,
        *,
        segment_ids: Int[Array, "batch time"] | None = None,
        segment_pos: Int[Array, "batch time"] | None = None,
        paddings: Float[Array, "batch time"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context]:
        def attend(h: Array, ctx: Context) -> tuple[Array, Context]:
            return call(
                self.attention, h, ctx, "attention",
                segment_ids=segment_ids, segment_pos=segment_pos, paddings=paddings,
            )  # fmt: skip

        x, ctx = self._residual(x, ctx, attend, self.attention_norm, self.attention_post_norm)
        x, ctx = self._residual(x, ctx, self._feed_forward, self.ff_norm, self.ff_post_norm)
        return x, ctx

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        cache: KVCache,
        start: Int[Array, ""],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """The layer on new tokens against a KV cache (no dropout, no side outputs).

        The same `_residual` wiring as `__call__`, with the cache threaded where the Context is.
        """
        attend = lambda h, c: self.attention.decode(h, c, start, positions, key_valid)
        feed_forward = lambda h, c: (self._feed_forward(h, None)[0], c)
        x, cache = self._residual(x, cache, attend, self.attention_norm, self.attention_post_norm)
        x, cache = self._residual(x, cache, feed_forward, self.ff_norm, self.ff_post_norm)
        return x, cache

    def _feed_forward(self, h: Array, ctx: Context | None) -> tuple[Array, Context | None]:
        h = self.ff_in(h)
        if ctx is not None:
            h, ctx = self.relu_dropout(h, ctx)
        h = self.ff_out(h)
        return (h if self.ff_out_bias is None else self.ff_out_bias(h)), ctx

    def _residual(self, x, carry, sublayer, norm, post_norm):
        """Wraps `sublayer` in the norm policy. `carry` is the Context (training/eval) or the
        KV cache (decoding); residual dropout applies only to the former."""
        dropout = self.residual_dropout if isinstance(carry, Context) else lambda h, c: (h, c)
        if self.norm_policy == "post":
            h, carry = sublayer(x, carry)
            h, carry = dropout(h, carry)
            return norm(x + h), carry
        h, carry = sublayer(norm(x), carry)
        if post_norm is not None:
            h = post_norm(h)
        h, carry = dropout(h, carry)
        return x + h, carry
