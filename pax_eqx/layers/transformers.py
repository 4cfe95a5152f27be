"""The Transformer layer (praxis.layers.transformers.Transformer + TransformerFeedForward).

    attention block:  x + dropout(attention(norm(x)))            (norm_policy "pre")
                      norm(x + dropout(attention(x)))            ("post")
                      x + dropout(norm_post(attention(norm(x)))) ("primer_hybrid")
    cross-attention:  the same policy around  cross_attention(h, memory)   (only when built so)
    feed-forward:     the same policy around  W2 dropout(act(W1 x + b1)) + b2
                      (ff_paddings: W2 dropout(act(W1 x + b1) * (1 - p)) + b2) * (1 - p), Praxis'
                      TransformerFeedForward, p = the layer's paddings)

A layer built with `cross_attention=True` (an encoder-decoder's decoder layer, Praxis'
`use_cross_attention`) attends, between its self-attention and its feed-forward, to `memory`
(the encoder's output): its own norm(s), its own Attention (never causal, no rotary, separate
q and kv weights since they project different inputs), the same residual dropout. Whether a
layer has it is the stack's decision, so it is a `build` argument, not a field.

A layer built with `fold_padding_with_segment_mask=True` (what Praxis' TransformerLm sets on
its stack) gives its self-attention no `paddings`: padding is one more segment instead (the
given `segment_ids`, whose 0 is padding, or 1 - paddings without them), so a padded token
attends to the earlier padded tokens, and a real one to the earlier real ones of its document.
The feed-forward still gets the paddings. Whether to fold is the model's decision (a `build`
argument).

A layer built with `moe=<MoEFeedForwardConfig>` (Praxis' TransformerFeedForwardMoe in a
`moe_layers` position) has a Mixture-of-Experts feed-forward instead of the dense one: the
same norm policy, residual and residual dropout around it, the experts built at this layer's
model_dims / hidden_dims / init with relu_dropout_prob on their hidden activations, `paddings`
passed so padded tokens are never routed. Its experts have no biases (Praxis' have none), so
`ff_has_bias` and `activation` are the dense layers' only; the experts' activation is the MoE
template's. Which layers are MoE is again the stack's decision (`build` argument). Its side
outputs (aux losses, routing summaries) are named under "moe"; a decode step calls it with no
Context (EVAL routing, no side outputs).

The layer is a template for the stacks of layers.repeats: its sizes and init are arguments of
`build` given by the stack (a config holds only what its user chooses), and the children's
configs (attention, norm, activation) are child templates this layer builds at its sizes, as
Pax's `setup` does.

At summary verbosity 4 the layer records `activation_rms`, the root-mean-square of its output
over every element (padding included): per layer, with a leading [num_layers] axis in a scanned
stack. At the default verbosity it is not computed at all.
"""

from __future__ import annotations

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.attentions import Attention, KVCache
from pax_eqx.layers.base import LAYER_STATISTICS_VERBOSITY, Context, call
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.linears import Bias, BiasConfig, FeedForward, FeedForwardConfig, Linear, LinearConfig
from pax_eqx.layers.moe import MoEFeedForward, MoEFeedForwardConfig
from pax_eqx.layers.normalizations import LayerNormConfig, NormConfig
from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig
from pax_eqx.layers.stochastics import Dropout, DropoutConfig, drop_path
from pax_eqx.sharding.activations import constrain

NormPolicy = Literal["pre", "post", "primer_hybrid"]
# The residual stream [batch, time, model_dims] between blocks: rows over the data axes, the model
# dimension whole (Megatron's layout; the weights' `embed` is fsdp's, not the activations').
RESIDUAL = ("batch", "seq", None)


@config
class TransformerConfig(Config):
    """One decoder/encoder layer: self-attention, (cross-attention,) then a feed-forward block.

    Only what a user chooses about a layer is a field. Its sizes (model_dims, hidden_dims, heads)
    and weight init are decided by the stack that owns it, so they are arguments of `build`.

    norm_policy: "pre", "post" or "primer_hybrid" (norm before and after each sub-block).
    norm: the normalisation template (built at model_dims).
    attention: the attention template (built at model_dims with the heads given to `build`).
    activation: the feed-forward activation (gated=True gives GeGLU/SwiGLU).
    ff_has_bias: biases in the feed-forward projections.
    residual_dropout_prob / relu_dropout_prob: dropout on each sub-block's output / on the
      feed-forward hidden activations (Praxis' names).
    residual_droppath_prob: stochastic depth (Praxis' name): in training each example's whole
      sub-block output (attention, cross-attention, feed-forward) is dropped with this
      probability and otherwise divided by its survival probability, after the residual dropout
      (`stochastics.drop_path`). In a stack, layer i of L uses residual_droppath_prob * i / L,
      Praxis' StackedTransformer schedule (the first layer never drops, the deepest nearly this).
    ff_paddings: zero the dense feed-forward's hidden activations (before the relu dropout) and
      its output (before any post norm and the residual dropout) at padded positions, as Praxis'
      TransformerFeedForward does with the paddings it is given; the outputs at real positions
      are unchanged. An MoE feed-forward always zeroes its output there.
    fp8: the attention projections and the dense feed-forward's matmuls in fp8 with delayed
      scaling (`layers.fp8`; Praxis' USE_FP8): e4m3 operands, e5m2 gradients. For Hopper GPUs
      and later; an MoE layer's experts stay in the activation dtype.
    """

    norm_policy: NormPolicy = "pre"
    norm: NormConfig = LayerNormConfig()
    attention: AttentionConfig = AttentionConfig()
    activation: ActivationConfig = ActivationConfig(name="relu")
    ff_has_bias: bool = True
    residual_dropout_prob: float = 0.0
    relu_dropout_prob: float = 0.0
    residual_droppath_prob: float = 0.0
    ff_paddings: bool = False
    fp8: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (children check themselves)."""
        if self.norm_policy not in typing.get_args(NormPolicy):
            raise ConfigError(
                f"TransformerConfig.norm_policy={self.norm_policy!r} is not one of {typing.get_args(NormPolicy)}."
            )
        check_range(self, ("residual_dropout_prob", "relu_dropout_prob", "residual_droppath_prob"), ge=0, lt=1)

    def build(
        self,
        key: PRNGKeyArray,
        *,
        model_dims: int,
        hidden_dims: int,
        num_heads: int,
        dim_per_head: int = 0,
        num_kv_heads: int = 0,
        init: WeightInit = WeightInit(),
        use_rotary: bool = False,
        cross_attention: bool = False,
        moe: MoEFeedForwardConfig | None = None,
        fold_padding_with_segment_mask: bool = False,
        relative_bias: RelativePositionBiasConfig | None = None,
    ) -> Transformer:
        """The layer at width `model_dims`, feed-forward width `hidden_dims`; the attention's
        arguments (num_heads, dim_per_head, num_kv_heads, use_rotary) are AttentionConfig.build's,
        and `init` initialises every projection.

        cross_attention: also attend to a `memory` (an encoder-decoder's decoder layer), with an
        Attention built from `attention` at the same sizes and init, but not causal, without
        rotary positions, position terms or window and with separate q and kv projections
        (`combine_qkv=False`: a fused weight would project x and memory in two matmuls anyway).

        moe: a Mixture-of-Experts feed-forward from this template (experts of width
        `hidden_dims`, no biases) instead of the dense one; None: dense.

        fold_padding_with_segment_mask: self-attention sees padding as a segment of its own,
        not as masked keys (Praxis' TransformerLm; see the module doc).

        relative_bias: self-attention gets a relative position bias table of its own (Praxis'
        relative_bias_tpl); cross-attention never does.
        """
        if model_dims <= 0 or hidden_dims <= 0 or num_heads <= 0:
            raise ConfigError(
                f"TransformerConfig.build needs model_dims, hidden_dims, num_heads > 0; got {model_dims}, "
                f"{hidden_dims}, {num_heads}."
            )
        # A layer without cross-attention splits its key as it always has (the same init).
        k_att, k_in, k_out, *k_cross = jax.random.split(key, 4 if cross_attention else 3)
        attention = self.attention.build(
            k_att, input_dims=model_dims, num_heads=num_heads, dim_per_head=dim_per_head,
            num_kv_heads=num_kv_heads, init=init, use_rotary=use_rotary, fp8=self.fp8, relative_bias=relative_bias,
        )  # fmt: skip
        cross = None
        if cross_attention:
            plain = AttentionConfig()  # cross-attention has no rotary positions to set up
            cross_cfg = self.attention.replace(
                causal=False, combine_qkv=False, rotary_max_timescale=plain.rotary_max_timescale,
                rotary_scaling=plain.rotary_scaling, position_bias=plain.position_bias, window=plain.window,
            )  # fmt: skip
            cross = cross_cfg.build(
                k_cross[0], input_dims=model_dims, num_heads=num_heads, dim_per_head=dim_per_head,
                num_kv_heads=num_kv_heads, init=init, use_rotary=False, fp8=self.fp8,
            )  # fmt: skip
        if moe is not None:
            experts = moe.build(
                k_in, model_dims=model_dims, hidden_dims=hidden_dims, init=init,
                relu_dropout_prob=self.relu_dropout_prob,
            )  # fmt: skip
            return Transformer(
                self, model_dims=model_dims, attention=attention, cross_attention=cross, moe=experts,
                fold_padding_with_segment_mask=fold_padding_with_segment_mask,
            )  # fmt: skip
        ff_in = FeedForwardConfig(
            input_dims=model_dims, output_dims=hidden_dims, has_bias=self.ff_has_bias, activation=self.activation,
            init=init, axes=("embed", "mlp"), fp8=self.fp8,
        ).build(k_in)  # fmt: skip
        ff_out = LinearConfig(
            input_dims=hidden_dims, output_dims=model_dims, init=init, axes=("mlp", "embed"), fp8=self.fp8
        )
        return Transformer(
            self, model_dims=model_dims, attention=attention, ff_in=ff_in, ff_out=ff_out.build(k_out),
            cross_attention=cross, fold_padding_with_segment_mask=fold_padding_with_segment_mask,
        )  # fmt: skip


class Transformer(eqx.Module):
    attention_norm: eqx.Module
    attention_post_norm: eqx.Module | None
    attention: Attention
    cross_attention_norm: eqx.Module | None  # the cross_attention fields: None unless built with it
    cross_attention_post_norm: eqx.Module | None
    cross_attention: Attention | None
    ff_norm: eqx.Module
    ff_post_norm: eqx.Module | None
    ff_in: FeedForward | None  # the dense feed-forward: None in an MoE layer
    ff_out: Linear | None
    ff_out_bias: Bias | None
    moe: MoEFeedForward | None  # the MoE feed-forward: None in a dense layer
    residual_dropout: Dropout
    relu_dropout: Dropout
    norm_policy: str = eqx.field(static=True)
    ff_paddings: bool = eqx.field(static=True)
    fold_padding_with_segment_mask: bool = eqx.field(static=True)
    residual_droppath_prob: float = eqx.field(static=True)

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        model_dims: int,
        attention: Attention,
        ff_in: FeedForward | None = None,
        ff_out: Linear | None = None,
        cross_attention: Attention | None = None,
        moe: MoEFeedForward | None = None,
        fold_padding_with_segment_mask: bool = False,
    ):
        """Made by `TransformerConfig.build`, which builds the projections."""
        hybrid = cfg.norm_policy == "primer_hybrid"
        self.attention_norm = cfg.norm.build(model_dims)
        self.attention_post_norm = cfg.norm.build(model_dims) if hybrid else None
        self.cross_attention = cross_attention
        self.cross_attention_norm = cfg.norm.build(model_dims) if cross_attention is not None else None
        self.cross_attention_post_norm = cfg.norm.build(model_dims) if hybrid and cross_attention is not None else None
        self.ff_norm = cfg.norm.build(model_dims)
        self.ff_post_norm = cfg.norm.build(model_dims) if hybrid else None
        self.attention = attention
        self.ff_in = ff_in
        self.ff_out = ff_out
        self.moe = moe
        dense_bias = cfg.ff_has_bias and moe is None
        self.ff_out_bias = BiasConfig(dims=model_dims, axis="embed").build() if dense_bias else None
        self.residual_dropout = DropoutConfig(rate=cfg.residual_dropout_prob).build()
        self.relu_dropout = DropoutConfig(rate=cfg.relu_dropout_prob).build()
        self.norm_policy = cfg.norm_policy
        self.ff_paddings = cfg.ff_paddings
        self.residual_droppath_prob = cfg.residual_droppath_prob
        self.fold_padding_with_segment_mask = fold_padding_with_segment_mask

    def __call__(
        self,
        x: Float[Array, "batch time embed"],
        ctx: Context,
        *,
        segment_ids: Int[Array, "batch time"] | None = None,
        segment_pos: Int[Array, "batch time"] | None = None,
        paddings: Float[Array, "batch time"] | None = None,
        bias: Float[Array, "#batch #heads time time"] | None = None,
        memory: Float[Array, "batch memory embed"] | None = None,
        memory_paddings: Float[Array, "batch memory"] | None = None,
        droppath_prob: float | Float[Array, ""] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context]:
        """The layer over whole sequences `x`.

        segment_ids / segment_pos / paddings / bias: the self-attention's (Attention.__call__);
        paddings also go to the feed-forward (ff_paddings, MoE routing). With
        fold_padding_with_segment_mask the self-attention gets segments instead of paddings.
        memory: what cross-attention attends to (the encoder's output), required by a layer
        built with cross_attention and refused by one without; memory_paddings: 1.0 at its padded
        positions. Side outputs are named under "attention" and "cross_attention".
        droppath_prob: this call's stochastic depth (a stack's schedule, maybe traced); None:
        the layer's own residual_droppath_prob.
        """
        self._check_memory(memory is not None, "memory")
        x = constrain(x, RESIDUAL)  # the block boundary: batch over the data axes (sharding.activations)
        if droppath_prob is None:
            droppath_prob = self.residual_droppath_prob
        survival = 1.0 - droppath_prob
        attention_segments, attention_paddings = segment_ids, paddings
        if self.fold_padding_with_segment_mask and paddings is not None:
            # Praxis' TransformerLm: segment ids 1 - paddings when none are given; paddings unused.
            attention_paddings = None
            if segment_ids is None:
                attention_segments = (paddings < 0.5).astype(jnp.int32)

        def attend(h: Array, ctx: Context) -> tuple[Array, Context]:
            return call(
                self.attention, h, ctx, "attention", segment_ids=attention_segments, segment_pos=segment_pos,
                paddings=attention_paddings, bias=bias,
            )  # fmt: skip

        def cross_attend(h: Array, ctx: Context) -> tuple[Array, Context]:
            cross = lambda h, ctx: self.cross_attention.cross(h, memory, ctx, memory_paddings=memory_paddings)
            return call(cross, h, ctx, "cross_attention")

        x, ctx = self._residual(x, ctx, attend, self.attention_norm, self.attention_post_norm, survival)
        if self.cross_attention is not None:
            norms = self.cross_attention_norm, self.cross_attention_post_norm
            x, ctx = self._residual(x, ctx, cross_attend, *norms, survival)
        feed_forward = self._feed_forward
        if self.ff_paddings and paddings is not None:
            feed_forward = lambda h, ctx: self._feed_forward(h, ctx, paddings)
        if self.moe is not None:
            feed_forward = lambda h, ctx: call(self.moe, h, ctx, "moe", paddings=paddings)
        x, ctx = self._residual(x, ctx, feed_forward, self.ff_norm, self.ff_post_norm, survival)
        if ctx.records(LAYER_STATISTICS_VERBOSITY):
            rms = jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))
            ctx = ctx.add_summary("activation_rms", rms, LAYER_STATISTICS_VERBOSITY)
        return constrain(x, RESIDUAL), ctx

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        cache: KVCache,
        start: Int[Array, ""] | Int[Array, " batch"],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
        *,
        bias: Float[Array, "#batch #heads new max_len"] | None = None,
        memory_kv: KVCache | None = None,
        memory_valid: Bool[Array, "batch memory"] | None = None,
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """The layer on new tokens against a KV cache (no dropout, no side outputs).

        The same `_residual` wiring as `__call__`, with the cache threaded where the Context is.
        bias: the self-attention's, against every cache slot (Attention.decode). memory_kv: this
        layer's cross-attention keys/values of the encoder output (`cross_attention.project_memory`),
        required with cross-attention and refused without; memory_valid: False at its padding.
        """
        self._check_memory(memory_kv is not None, "memory_kv")
        attend = lambda h, c: self.attention.decode(h, c, start, positions, key_valid, bias=bias)
        cross_attend = lambda h, c: (self.cross_attention.decode_cross(h, memory_kv, memory_valid), c)
        if self.moe is None:
            feed_forward = lambda h, c: (self._feed_forward(h, None)[0], c)
        else:
            feed_forward = lambda h, c: (self.moe(h, None)[0], c)
        x, cache = self._residual(x, cache, attend, self.attention_norm, self.attention_post_norm)
        if self.cross_attention is not None:
            norms = self.cross_attention_norm, self.cross_attention_post_norm
            x, cache = self._residual(x, cache, cross_attend, *norms)
        x, cache = self._residual(x, cache, feed_forward, self.ff_norm, self.ff_post_norm)
        return x, cache

    def _check_memory(self, given: bool, name: str) -> None:
        if given and self.cross_attention is None:
            raise ValueError(
                f"Transformer: {name} was given to a layer without cross-attention; build it with "
                "cross_attention=True (StackedTransformerConfig.cross_attention) or do not pass it."
            )
        if not given and self.cross_attention is not None:
            raise ValueError(
                f"Transformer: this layer has cross-attention but no {name} was given; pass "
                + ("memory=<the encoder's output>." if name == "memory" else "memory_kv=<project_memory's>.")
            )

    def _feed_forward(
        self, h: Array, ctx: Context | None, paddings: Float[Array, "batch time"] | None = None
    ) -> tuple[Array, Context | None]:
        """The dense feed-forward; `paddings` (ff_paddings): zero its hidden activations and its
        output at padded positions, where Praxis' TransformerFeedForward does."""
        keep = None if paddings is None else (1.0 - paddings)[..., None]
        h = constrain(self.ff_in(h), ("batch", "seq", "mlp"))
        if keep is not None:
            h = h * keep.astype(h.dtype)
        if ctx is not None:
            h, ctx = self.relu_dropout(h, ctx)
        h = self.ff_out(h)
        h = h if self.ff_out_bias is None else self.ff_out_bias(h)
        return (h if keep is None else h * keep.astype(h.dtype)), ctx

    def _residual(self, x, carry, sublayer, norm, post_norm, survival: float | Array = 1.0):
        """Wraps `sublayer` in the norm policy. `carry` is the Context (training/eval) or the
        KV cache (decoding); residual dropout and drop-path (kept with probability `survival`)
        apply only to the former."""

        def dropout(h, carry):
            if not isinstance(carry, Context):
                return h, carry
            h, carry = self.residual_dropout(h, carry)
            return drop_path(h, survival, carry)

        if self.norm_policy == "post":
            h, carry = sublayer(x, carry)
            h, carry = dropout(h, carry)
            return norm(x + h), carry
        h, carry = sublayer(norm(x), carry)
        if post_norm is not None:
            h = post_norm(h)
        h, carry = dropout(h, carry)
        return x + h, carry
