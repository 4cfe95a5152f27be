"""Writes expected.npz here: Praxis 1.4's vision layers on tiny inputs, with fixed random weights,
the outputs and the gradients (`jax.vjp` with a random cotangent) to the input and every
parameter, for tests/praxis/test_praxis_vision.py to compare pax_eqx's layers with.

Cases (each key is `<case>/<what>`; Praxis variable paths are joined with "/"):

- conv_*: `convolutions.Conv2D` on [2, 6, 6, C]: stride 1 with a bias; stride 2 with Praxis' default
  SAME (`tf_equivalent_padding=False`: (k - 1) // 2 zeros before, the rest after, whatever the
  stride); stride 2 with `tf_equivalent_padding=True` (TensorFlow's SAME); grouped and dilated.
- bn_*: `normalizations.BatchNorm` (decay 0.9): TRAIN (batch statistics; the updated moving mean
  and variance under `new/`) and EVAL (the given moving statistics), without and with paddings.
- block_*: `resnets.ResNetBasicBlock` / `resnets.ResNetBlock` (bottleneck) made of `ConvBNAct`
  (BatchNorm decay 0.9), in EVAL and TRAIN (then with the moving statistics after the call).
- vit_*: `vits.VisionTransformer` (VitEntryLayers: patches, projection with bias, a trainable
  position table; a StackedTransformer of 2 pre-LN layers with GELU, attention biases and
  PerDimScale; VitExitLayers: LayerNorm and the average over the tokens, no tanh projection).
  vit_cls prepends a class token (after the position embedding, as VitEntryLayers does) and
  returns the class token's output (exit layers with `pooled=False`, then token 0).

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py),
from outside the repository so that pax_eqx's tests are not on the path:

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/praxis/vision/generate.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, pax_fiddle  # noqa: E402
from praxis.layers import (  # noqa: E402
    activations,
    convolutions,
    embedding_softmax,
    normalizations,
    poolings,
    resnets,
    transformers,
    vits,
)

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(0)
OUT: dict[str, np.ndarray] = {}


def normal(shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def flat(tree, prefix: str) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {prefix + "/".join(k.key for k in path): np.asarray(v) for path, v in leaves}


def random_like(tree, scale: float):
    """Fresh random arrays in `tree`'s shapes; moving variances positive."""

    def one(path, a):
        name = path[-1].key
        if name == "moving_variance":
            return RNG.uniform(0.5, 1.5, a.shape).astype(np.float32)
        return normal(a.shape, scale)

    return jax.tree_util.tree_map_with_path(one, tree)


def record(case: str, cfg, x: np.ndarray, *, train: bool, args=(), scale=0.3, post=None) -> None:
    """Instantiates `cfg`, gives it random weights (and moving statistics), and records under
    `case/`: x, the output y, the cotangent, grad_x, params/..., grad/..., stats/... (the moving
    statistics it was given) and new/... (those after a TRAIN call)."""
    layer = base_layer.instantiate(cfg)
    init = layer.init(jax.random.PRNGKey(0), jnp.asarray(x), *args)
    params = random_like(init["params"], scale)
    stats = random_like(init.get("non_trainable", {}), 0.3)

    def fprop(params, x):
        y, updated = layer.apply({"params": params, "non_trainable": stats}, x, *args, mutable=True)
        if post is not None:
            y = post(y)
        return y, updated.get("non_trainable", {})

    with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=not train)):
        y, vjp, new_stats = jax.vjp(fprop, params, jnp.asarray(x), has_aux=True)
        cotangent = normal(y.shape, 0.1)  # gradients of order 1: float32 rounding well below 1e-5
        grads, grad_x = vjp(jnp.asarray(cotangent))
    OUT.update({f"{case}/x": x, f"{case}/y": np.asarray(y), f"{case}/cotangent": cotangent})
    OUT[f"{case}/grad_x"] = np.asarray(grad_x)
    OUT.update(flat(params, f"{case}/params/"))
    OUT.update(flat(grads, f"{case}/grad/"))
    OUT.update(flat(stats, f"{case}/stats/"))
    if train:
        OUT.update(flat(new_stats, f"{case}/new/"))
    print(case, y.shape, "max |y|", float(jnp.max(jnp.abs(y))))


def convs() -> None:
    cases = {
        "conv_s1_bias": dict(filter_shape=(3, 3, 3, 4), filter_stride=(1, 1), bias=True),
        "conv_s2_bias": dict(filter_shape=(3, 3, 3, 4), filter_stride=(2, 2), bias=True),
        "conv_s2_tf": dict(filter_shape=(3, 3, 3, 4), filter_stride=(2, 2), tf_equivalent_padding=True),
        "conv_grouped_dilated": dict(filter_shape=(3, 3, 2, 4), filter_stride=(1, 1), dilations=(2, 2)),
    }
    for case, fields in cases.items():
        cin = 4 if case == "conv_grouped_dilated" else 3
        cfg = pax_fiddle.Config(convolutions.Conv2D, name="conv", **fields)
        record(case, cfg, normal((2, 6, 6, cin)), train=False)


BN_PADDINGS = np.asarray([[0, 0, 0, 1], [0, 1, 0, 0], [1, 1, 0, 0]], np.float32)


def batch_norms() -> None:
    cfg = pax_fiddle.Config(normalizations.BatchNorm, name="bn", dim=5, decay=0.9)
    for train in (True, False):
        mode = "train" if train else "eval"
        record(f"bn_{mode}", cfg, normal((2, 6, 6, 5)) + 0.5, train=train)
        record(f"bn_{mode}_paddings", cfg, normal((3, 4, 5)) + 0.5, train=train, args=(jnp.asarray(BN_PADDINGS),))
    OUT["bn_paddings"] = BN_PADDINGS


def blocks() -> None:
    conv = pax_fiddle.Config(
        convolutions.ConvBNAct, batch_norm_tpl=pax_fiddle.Config(normalizations.BatchNorm, decay=0.9)
    )
    # (class, input_dim, output_dim, stride, image size): odd images for stride 2 (there Praxis'
    # SAME and TensorFlow's agree); basic_s2_even is the even image where they differ.
    cases = {
        "block_basic_s2": (resnets.ResNetBasicBlock, 4, 8, 2, 7),
        "block_bottleneck_s2": (resnets.ResNetBlock, 4, 8, 2, 7),
        "block_basic_identity": (resnets.ResNetBasicBlock, 8, 8, 1, 6),
        "block_basic_s2_even": (resnets.ResNetBasicBlock, 4, 8, 2, 6),
    }
    for case, (cls, cin, cout, stride, size) in cases.items():
        cfg = pax_fiddle.Config(cls, name="block", input_dim=cin, output_dim=cout, stride=stride, conv_params=conv)
        x = normal((2, size, size, cin))
        modes = (True,) if case == "block_basic_s2_even" else (True, False)
        for train in modes:
            record(f"{case}/{'train' if train else 'eval'}", cfg, x, train=train)


def vit(cls_token: bool):
    patch, channels, model_dims = 2, 3, 16
    entry = pax_fiddle.Config(
        vits.VitEntryLayers, name="entry", pos_emb_shapes=(3, 3), patch_size=patch,
        input_dims=patch * patch * channels, output_dims=model_dims, prepend_cls_tokens=int(cls_token),
        pos_emb_tpl=pax_fiddle.Config(
            embedding_softmax.TrainablePositionalEmbedding, max_seq_length=9, embedding_dims=model_dims
        ),
    )  # fmt: skip
    stack = pax_fiddle.Config(
        transformers.StackedTransformer, model_dims=model_dims, hidden_dims=32, num_heads=2,
        mask_self_attention=False, num_layers=2,
    )  # fmt: skip
    stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation_tpl = pax_fiddle.Config(activations.GELU)
    exit_ = pax_fiddle.Config(
        vits.VitExitLayers, name="exit", hidden_dim=model_dims, output_dim=model_dims, output_fc_tanh=False,
        pooled=not cls_token,
        pooling_tpl=pax_fiddle.Config(poolings.GlobalPooling, pooling_type="AVG", pooling_dims=[1]),
    )  # fmt: skip
    cfg = pax_fiddle.Config(
        vits.VisionTransformer, name="vit", entry_layers_tpl=entry, transformer_layers_tpl=stack,
        exit_layers_tpl=exit_,
    )  # fmt: skip
    post = (lambda y: y[:, 0]) if cls_token else None
    record("vit_cls" if cls_token else "vit_mean", cfg, normal((2, 6, 6, channels)), train=False, post=post)


def main() -> None:
    convs()
    batch_norms()
    blocks()
    vit(cls_token=False)
    vit(cls_token=True)
    np.savez_compressed(os.path.join(HERE, "expected.npz"), **OUT)
    print(len(OUT), "arrays,", os.path.getsize(os.path.join(HERE, "expected.npz")), "bytes")


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
