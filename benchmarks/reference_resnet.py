"""A hand-written plain-JAX ResNet-50 train step: the yardstick for pax_eqx's image classifier.

`benchmarks.images` times pax_eqx's real ResNet train step and then this one in the same process,
on the same global batch shape, and reports `ratio_to_reference` = pax_eqx step / plain-JAX step:
what the framework costs (or saves) over what a competent user writes with jax, optax and numpy
alone (nothing from pax_eqx is imported). The model is ResNet-50 v1.5 (the stride on the 3x3
convolution of the bottleneck, as torchvision and Praxis), NHWC:

    images [B, S, S, C] -> 7x7/2 conv (64) -> BN -> ReLU -> 3x3/2 max pool        [B, S/4, S/4, 64]
      -> 4 stages of (3, 4, 6, 3) bottlenecks, widths (64, 128, 256, 512), x4 out,
         strides (1, 2, 2, 2); each: 1x1 -> BN -> ReLU -> 3x3/s -> BN -> ReLU -> 1x1 -> BN,
         + shortcut (1x1/s conv -> BN where the shape changes), ReLU    [B, S/32, S/32, 2048]
      -> global average pool [B, 2048] -> dense + bias -> logits [B, num_classes]
      -> mean softmax cross-entropy (float32) against integer labels [B]

Numerics as pax_eqx's: float32 master params, each weight cast to `dtype` where it is used,
activations in `dtype`; convolutions "SAME" padded, no bias; BatchNorm in train mode normalises
by the batch statistics (float32, biased variance) and updates its running mean/variance,
`new = decay * old + (1 - decay) * batch` (decay 0.9, epsilon 1e-3: pax_eqx's ResNet defaults).
The optimizer is pax_eqx's chain: coupled L2 on the conv/dense kernels (not BN or biases) ->
SGD momentum (Nesterov) or Adam -> decoupled weight decay on the kernels -> -learning_rate, at a
constant rate (a schedule is a scalar computation, nothing to time).

API: `ResNetReferenceConfig`, `init_params(cfg, key) -> (params, batch_stats)`,
`forward(params, batch_stats, images, cfg) -> (logits, batch_stats)`, `loss_fn`, `count_params`,
`make_train_step(cfg) -> (init_fn(key) -> TrainState, step(state, batch) -> (state, loss))`,
the step jitted with the state donated; batch = {"images": float [B, S, S, C], "labels": int [B]}.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

BLOCKS = (3, 4, 6, 3)  # bottleneck blocks per stage: ResNet-50
WIDTHS = (64, 128, 256, 512)  # each stage's inner width; its output is EXPANSION x
STRIDES = (1, 2, 2, 2)
EXPANSION = 4
DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}
Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ResNetReferenceConfig:
    """Shapes, numerics and optimizer; the defaults are imagenet_resnet50's (with a bf16 batch of 64).

    optimizer: "sgd" (momentum, nesterov) or "adam"/"adamw" (b1, b2, eps).
    l2_regularization: coupled, added to the kernels' gradients before the optimizer (Pax's L2);
    weight_decay: decoupled, added to the update after it. Both skip BatchNorm and biases.
    """

    num_classes: int = 1000
    image_size: int = 224
    channels: int = 3
    batch_size: int = 64
    dtype: str = "bfloat16"
    bn_decay: float = 0.9
    bn_epsilon: float = 1e-3
    zero_init_residual: bool = True
    label_smoothing: float = 0.0
    optimizer: str = "sgd"
    learning_rate: float = 0.2
    momentum: float = 0.9
    nesterov: bool = True
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    l2_regularization: float = 1e-4
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"ResNetReferenceConfig.dtype={self.dtype!r} is unknown; use one of {tuple(DTYPES)}.")
        if self.optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"ResNetReferenceConfig.optimizer={self.optimizer!r}: use 'sgd', 'adam' or 'adamw'.")
        for name in ("num_classes", "image_size", "channels", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ResNetReferenceConfig.{name} must be > 0, got {getattr(self, name)}.")


# Parameters ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Normal:
    """A placeholder leaf: std * N(0, 1) of this shape, filled in by `init_params`."""

    shape: tuple[int, ...]
    std: float


def _conv_init(k: int, c_in: int, c_out: int) -> _Normal:
    """He normal with fan-out, std sqrt(2 / (k * k * c_out)), HWIO."""
    return _Normal((k, k, c_in, c_out), math.sqrt(2.0 / (k * k * c_out)))


def _bn(c: int, scale: float = 1.0) -> tuple[Params, Params]:
    """(params {"scale", "bias"}, running stats {"mean", "var"}) of a BatchNorm over c channels."""
    params = {"scale": jnp.full((c,), scale, jnp.float32), "bias": jnp.zeros((c,), jnp.float32)}
    return params, {"mean": jnp.zeros((c,), jnp.float32), "var": jnp.ones((c,), jnp.float32)}


def init_params(cfg: ResNetReferenceConfig, key: jax.Array) -> tuple[Params, Params]:
    """(params, batch_stats), float32; batch_stats mirrors every BatchNorm of params. Every weight
    is a slice of one flat normal draw: the same distribution, and one threefry compiles in under a
    second where one per weight (54 of them) takes about 8 s on CPU."""
    bn_params, bn_stats = _bn(64)
    params: Params = {"stem": {"w": _conv_init(7, cfg.channels, 64), "bn": bn_params}, "stages": []}
    stats: Params = {"stem": {"bn": bn_stats}, "stages": []}
    c_in = 64
    for num_blocks, width, stride in zip(BLOCKS, WIDTHS, STRIDES):
        stage_p, stage_s = [], []
        for j in range(num_blocks):
            c_out, s = width * EXPANSION, stride if j == 0 else 1
            convs = [("conv1", 1, c_in, width), ("conv2", 3, width, width), ("conv3", 1, width, c_out)]
            if s != 1 or c_in != c_out:
                convs.append(("proj", 1, c_in, c_out))
            p, st = {}, {}
            for name, k, i, o in convs:
                last = name == "conv3" and cfg.zero_init_residual  # the block starts as its shortcut
                p[name] = {"w": _conv_init(k, i, o)}
                p[name]["bn"], st[name] = _bn(o, 0.0 if last else 1.0)
                st[name] = {"bn": st[name]}
            stage_p.append(p)
            stage_s.append(st)
            c_in = c_out
        params["stages"].append(stage_p)
        stats["stages"].append(stage_s)
    params["head"] = {"w": _Normal((c_in, cfg.num_classes), 0.01), "b": jnp.zeros((cfg.num_classes,), jnp.float32)}
    draws = [leaf for leaf in jax.tree.leaves(params) if isinstance(leaf, _Normal)]
    flat = jax.random.normal(key, (sum(math.prod(d.shape) for d in draws),), jnp.float32)
    arrays, offset = {}, 0
    for d in draws:
        size = math.prod(d.shape)
        arrays[id(d)] = d.std * flat[offset : offset + size].reshape(d.shape)
        offset += size
    return jax.tree.map(lambda leaf: arrays.get(id(leaf), leaf), params), stats


def count_params(cfg: ResNetReferenceConfig) -> int:
    """Trainable scalars (BatchNorm scale and bias count, running statistics do not)."""
    params, _ = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


# Forward ---------------------------------------------------------------------------------------


def batch_norm(x: jax.Array, p: Params, stats: Params, decay: float, epsilon: float) -> tuple[jax.Array, Params]:
    """Train-mode BatchNorm over N, H, W: (y in x's dtype, updated running stats); float32 math."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(x32 - mean), axis=(0, 1, 2))
    y = (x32 - mean) * jax.lax.rsqrt(var + epsilon) * p["scale"] + p["bias"]
    new = {"mean": decay * stats["mean"] + (1 - decay) * mean, "var": decay * stats["var"] + (1 - decay) * var}
    return y.astype(x.dtype), new


def conv_bn(x: jax.Array, p: Params, s: Params, stride: int, cfg: ResNetReferenceConfig) -> tuple[jax.Array, Params]:
    """conv (no bias, weight cast to x's dtype) -> BatchNorm; returns (y, {"bn": new stats})."""
    y = jax.lax.conv_general_dilated(
        x, p["w"].astype(x.dtype), (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    y, new = batch_norm(y, p["bn"], s["bn"], cfg.bn_decay, cfg.bn_epsilon)
    return y, {"bn": new}


def bottleneck(x: jax.Array, p: Params, s: Params, stride: int, cfg: ResNetReferenceConfig) -> tuple[jax.Array, Params]:
    """relu(1x1 -> BN -> relu -> 3x3/stride -> BN -> relu -> 1x1 -> BN  +  shortcut(x))."""
    new: Params = {}
    y, new["conv1"] = conv_bn(x, p["conv1"], s["conv1"], 1, cfg)
    y, new["conv2"] = conv_bn(jax.nn.relu(y), p["conv2"], s["conv2"], stride, cfg)
    y, new["conv3"] = conv_bn(jax.nn.relu(y), p["conv3"], s["conv3"], 1, cfg)
    shortcut = x
    if "proj" in p:
        shortcut, new["proj"] = conv_bn(x, p["proj"], s["proj"], stride, cfg)
    return jax.nn.relu(y + shortcut), new


def forward(params: Params, stats: Params, images: jax.Array, cfg: ResNetReferenceConfig) -> tuple[jax.Array, Params]:
    """images [B, S, S, C] -> (logits [B, num_classes] in the compute dtype, updated batch_stats)."""
    x = images.astype(DTYPES[cfg.dtype])
    new: Params = {"stages": []}
    x, new["stem"] = conv_bn(x, params["stem"], stats["stem"], 2, cfg)
    x = jax.lax.reduce_window(jax.nn.relu(x), -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    for stage_p, stage_s, stride in zip(params["stages"], stats["stages"], STRIDES):
        stage_new = []
        for j, (p, s) in enumerate(zip(stage_p, stage_s)):
            x, block_new = bottleneck(x, p, s, stride if j == 0 else 1, cfg)
            stage_new.append(block_new)
        new["stages"].append(stage_new)
    features = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(x.dtype)
    logits = features @ params["head"]["w"].astype(x.dtype) + params["head"]["b"].astype(x.dtype)
    return logits, new


def loss_fn(
    params: Params, stats: Params, batch: dict[str, jax.Array], cfg: ResNetReferenceConfig
) -> tuple[jax.Array, Params]:
    """(mean float32 softmax cross-entropy, updated batch_stats)."""
    logits, new_stats = forward(params, stats, batch["images"], cfg)
    logits = logits.astype(jnp.float32)
    if cfg.label_smoothing == 0.0:
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    else:
        targets = optax.smooth_labels(jax.nn.one_hot(batch["labels"], cfg.num_classes), cfg.label_smoothing)
        xent = optax.softmax_cross_entropy(logits, targets)
    return jnp.mean(xent), new_stats


# Training --------------------------------------------------------------------------------------


class TrainState(NamedTuple):
    step: jax.Array
    params: Params
    batch_stats: Params
    opt_state: optax.OptState


def make_optimizer(cfg: ResNetReferenceConfig) -> optax.GradientTransformation:
    """[coupled L2] -> SGD momentum or Adam -> [decoupled weight decay] -> -learning_rate."""
    kernels = lambda params: jax.tree.map(lambda a: a.ndim >= 2, params)  # noqa: E731
    chain = [optax.add_decayed_weights(cfg.l2_regularization, kernels)] if cfg.l2_regularization > 0 else []
    if cfg.optimizer in ("adam", "adamw"):
        chain.append(optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
    elif cfg.momentum > 0:
        chain.append(optax.trace(decay=cfg.momentum, nesterov=cfg.nesterov))
    if cfg.weight_decay > 0:
        chain.append(optax.add_decayed_weights(cfg.weight_decay, kernels))
    return optax.chain(*chain, optax.scale(-cfg.learning_rate))


def make_train_step(
    cfg: ResNetReferenceConfig,
) -> tuple[Callable[[jax.Array], TrainState], Callable[[TrainState, dict], tuple[TrainState, jax.Array]]]:
    """(init_fn(key) -> TrainState, step(state, batch) -> (state, loss)), both jitted; `step`
    donates `state` (do not reuse the argument); `loss` is the pre-update float32 loss."""
    optimizer = make_optimizer(cfg)

    @jax.jit
    def init_fn(key: jax.Array) -> TrainState:
        params, stats = init_params(cfg, key)
        return TrainState(jnp.zeros((), jnp.int32), params, stats, optimizer.init(params))

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, stats), grads = grad_fn(state.params, state.batch_stats, batch, cfg)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(state.step + 1, params, stats, opt_state), loss

    return init_fn, jax.jit(step, donate_argnums=0)
