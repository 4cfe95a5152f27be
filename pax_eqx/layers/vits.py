"""A Vision Transformer trunk (praxis.layers.vits: VitEntryLayers, the transformer stack, VitExitLayers), NHWC.

    cfg = ViTConfig(patch_size=2, model_dims=64, num_layers=4, num_heads=4, hidden_dims=128, pooling="mean")
    vit = cfg.build(key, image_shape=(8, 8, 1))
    features, ctx = vit(images, Context(mode=Mode.TRAIN, key=key))
    # images: [B, 8, 8, 1] -> features: [B, vit.output_dims] (= model_dims)

`ViTConfig(...).build(key, *, image_shape=(H, W, C))` returns a `ViT`; calling it on
`x: [batch, H, W, C]` with a `Context` returns `(features [batch, model_dims], ctx)`, the same
contract as the ResNet trunk (the classifier head is the model's).

Layout (Dosovitskiy et al. 2020, as Praxis):

- entry: the image is cut into non-overlapping `patch_size x patch_size` patches, each flattened
  in (row, column, channel) order to p*p*C values (`patchify`: [B, (H/p)(W/p), p*p*C]), then a
  linear projection with bias to `model_dims` (a p x p, stride-p convolution written as a
  matmul); with `pooling="cls"` a learned class token is prepended; then a learned position
  embedding is added (one row per token, class token included). With
  `cls_position_embedding=False` the table has a row per patch only and is added before the class
  token is prepended, as Praxis' VitEntryLayers does.
- the existing transformer stack (`StackedTransformerConfig`) with `block` as the layer template;
  a ViT attends to every patch, so the block's attention must be non-causal.
- exit: a final norm, then pooling: the class token's output ("cls") or the mean over the
  patches ("mean", no class token).

Every weight has logical axis names: the patch projection ("patch" input dims are not sharded:
(None, "embed")), its bias, the class token and the position table on "embed".
"""

from __future__ import annotations

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config, require_positive
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.initializers import WeightInit, gaussian
from pax_eqx.layers.linears import Bias, BiasConfig, Linear, LinearConfig
from pax_eqx.layers.normalizations import LayerNormConfig, NormConfig
from pax_eqx.layers.position_embeddings import TrainablePositionalEmbedding, TrainablePositionalEmbeddingConfig
from pax_eqx.layers.remat import RematPolicy
from pax_eqx.layers.repeats import StackedTransformer, StackedTransformerConfig
from pax_eqx.layers.scanned_stack import StackedTransformerRepeated
from pax_eqx.layers.transformers import TransformerConfig

Pooling = Literal["cls", "mean"]


def patchify(x: Float[Array, "batch height width channels"], patch_size: int) -> Float[Array, "batch patches dims"]:
    """[B, H, W, C] -> [B, (H/p)(W/p), p*p*C]: patches in row-major order, each flattened in
    (row, column, channel) order -- the order of a p x p convolution kernel's [p, p, C] weights."""
    b, h, w, c = x.shape
    p = patch_size
    if h % p or w % p:
        raise ConfigError(
            f"ViTConfig.patch_size={p} must divide the image's height and width, got {h}x{w}; "
            "choose a patch_size that divides both."
        )
    x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


@config
class ViTConfig(Config):
    """A ViT trunk: patch embedding, transformer stack, final norm, pooling -> [B, model_dims].

    patch_size: the side of the square patches (must divide the image's height and width).
    model_dims / hidden_dims / num_heads / num_layers: the stack's width, feed-forward width,
      heads and depth (ViT-B/16: 768 / 3072 / 12 / 12).
    pooling: "cls" (a learned class token's output) or "mean" (the mean over the patches).
    cls_position_embedding: with "cls", whether the class token gets a row of the position table
      (Dosovitskiy et al.); False adds the table to the patches only, then prepends the token
      (Praxis' VitEntryLayers with prepend_cls_tokens=1).
    block: the transformer layer template (norms, activation, dropout, attention options); its
      attention must be non-causal (`block.attention.causal=False`).
    init: the patch projection's and every transformer projection's init.
    position_init: the learned position table's init.
    final_norm: the norm applied to the stack's output before pooling.
    repeat / remat_policy: as StackedTransformerConfig's (scan over stacked weights; rematerialisation).
    """

    patch_size: int = 16
    model_dims: int = 768
    num_layers: int = 12
    num_heads: int = 12
    hidden_dims: int = 3072
    pooling: Pooling = "cls"
    cls_position_embedding: bool = True
    block: TransformerConfig = TransformerConfig(
        attention=AttentionConfig(causal=False), activation=ActivationConfig(name="gelu")
    )
    init: WeightInit = WeightInit()
    position_init: WeightInit = gaussian(0.02)
    final_norm: NormConfig = LayerNormConfig()
    repeat: bool = True
    remat_policy: RematPolicy = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        require_positive(self, ("patch_size", "model_dims", "num_layers", "num_heads", "hidden_dims"))
        if self.pooling not in typing.get_args(Pooling):
            raise ConfigError(f"ViTConfig.pooling={self.pooling!r} is not one of {typing.get_args(Pooling)}.")
        if not self.cls_position_embedding and self.pooling != "cls":
            raise ConfigError(
                f"ViTConfig.cls_position_embedding=False with pooling={self.pooling!r}: there is no class token "
                "to leave out of the position table; use pooling='cls' or leave cls_position_embedding=True."
            )
        if self.model_dims % self.num_heads:
            raise ConfigError(
                f"ViTConfig.model_dims={self.model_dims} must be divisible by num_heads={self.num_heads} "
                "(each head gets model_dims // num_heads dims)."
            )
        if self.block.attention.causal:
            raise ConfigError(
                "ViTConfig.block.attention.causal=True: a ViT attends to every patch; set "
                "block.attention.causal=False (the default ViT block)."
            )
        self.stack()  # the stack's own checks (remat_policy)

    def inert_fields(self) -> dict[str, str]:
        """A ViT's patches have no padding and no segments, so what acts on them does nothing."""
        why = "a ViT's patches have no padding or segments"
        return {
            "block.ff_paddings": why,
            "block.attention.mask_mode": why,
        }

    @property
    def output_dims(self) -> int:
        """F, the width of the pooled features (`model_dims`)."""
        return self.model_dims

    def stack(self) -> StackedTransformerConfig:
        """The transformer stack this ViT builds."""
        return StackedTransformerConfig(
            num_layers=self.num_layers, model_dims=self.model_dims, hidden_dims=self.hidden_dims,
            num_heads=self.num_heads, init=self.init, block=self.block, repeat=self.repeat,
            remat_policy=self.remat_policy,
        )  # fmt: skip

    def build(self, key: PRNGKeyArray, *, image_shape: tuple[int, ...]) -> ViT:
        """The trunk for images of shape (height, width, channels)."""
        self.validate()
        if len(image_shape) != 3 or any(not d > 0 for d in image_shape):
            raise ConfigError(f"ViT image_shape must be (height, width, channels) > 0, got {tuple(image_shape)}.")
        h, w, _ = image_shape
        if h % self.patch_size or w % self.patch_size:
            raise ConfigError(
                f"ViTConfig.patch_size={self.patch_size} must divide the image's height and width, got "
                f"image_shape={tuple(image_shape)}; choose a patch_size that divides both."
            )
        return ViT(self, key=key, image_shape=tuple(image_shape))


class ViT(eqx.Module):
    patch_embedding: Linear
    patch_bias: Bias
    cls_token: Float[Array, " embed"] | None
    position_embedding: TrainablePositionalEmbedding
    transformer: StackedTransformer | StackedTransformerRepeated
    final_norm: eqx.Module
    patch_size: int = eqx.field(static=True)
    pooling: str = eqx.field(static=True)
    output_dims: int = eqx.field(static=True)
    cls_position_embedding: bool = eqx.field(static=True, default=True)

    def __init__(self, cfg: ViTConfig, *, key: PRNGKeyArray, image_shape: tuple[int, int, int]):
        k_patch, k_pos, k_stack = jax.random.split(key, 3)
        h, w, c = image_shape
        p = cfg.patch_size
        num_tokens = (h // p) * (w // p) + (cfg.pooling == "cls" and cfg.cls_position_embedding)
        self.patch_embedding = LinearConfig(
            input_dims=p * p * c, output_dims=cfg.model_dims, init=cfg.init, axes=(None, "embed")
        ).build(k_patch)
        self.patch_bias = BiasConfig(dims=cfg.model_dims, axis="embed").build()
        self.cls_token = jnp.zeros((cfg.model_dims,)) if cfg.pooling == "cls" else None
        self.position_embedding = TrainablePositionalEmbeddingConfig(
            max_seq_length=num_tokens, embedding_dims=cfg.model_dims, init=cfg.position_init
        ).build(k_pos)
        self.transformer = cfg.stack().build(k_stack)
        self.final_norm = cfg.final_norm.build(cfg.model_dims)
        self.patch_size = p
        self.pooling = cfg.pooling
        self.output_dims = cfg.output_dims
        self.cls_position_embedding = cfg.cls_position_embedding

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"cls_token": ("embed",)}

    def __call__(
        self, x: Float[Array, "batch height width channels"], ctx: Context
    ) -> tuple[Float[Array, "batch features"], Context]:
        """Images (NHWC) -> pooled features [batch, output_dims], in the images' dtype."""
        tokens = self.patch_bias(self.patch_embedding(patchify(x, self.patch_size)))  # [B, N, D]
        if self.cls_token is not None and self.cls_position_embedding:
            tokens = self._prepend_cls(tokens)
        tokens = tokens + self.position_embedding.first(tokens.shape[1]).astype(tokens.dtype)
        if self.cls_token is not None and not self.cls_position_embedding:
            tokens = self._prepend_cls(tokens)  # Praxis' order: the class token has no position
        y, ctx = call(self.transformer, tokens, ctx, "transformer")
        y = self.final_norm(y)
        pooled = y[:, 0] if self.pooling == "cls" else jnp.mean(y, axis=1)
        return pooled, ctx

    def _prepend_cls(self, tokens: Float[Array, "batch n embed"]) -> Float[Array, "batch n+1 embed"]:
        cls = jnp.broadcast_to(self.cls_token.astype(tokens.dtype), (tokens.shape[0], 1, tokens.shape[-1]))
        return jnp.concatenate([cls, tokens], axis=1)
