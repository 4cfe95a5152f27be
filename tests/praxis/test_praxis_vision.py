"""pax_eqx's vision layers against Praxis 1.4 itself: vision/expected.npz holds what Praxis'
Conv2D, BatchNorm, ResNetBasicBlock / ResNetBlock (bottleneck) and VisionTransformer give on tiny
inputs with fixed random weights (written by vision/generate.py in Praxis' own environment): the
outputs, the gradients of <output, cotangent> to the input and every parameter, and after a
TRAIN call the BatchNorm moving statistics. Each pax_eqx layer is built, given the same arrays
with `eqx.tree_at` (and the same moving statistics through the Context), and compared within 1e-5.

Conventions where the Praxis layer has an option pax_eqx spells differently:

- Conv2D "SAME": Praxis' default (`tf_equivalent_padding=False`) pads (k - 1) // 2 before and the
  rest after whatever the stride, pax_eqx's "SAME" is TensorFlow's (Praxis'
  `tf_equivalent_padding=True`); with stride 1 they agree, with stride 2 pax_eqx takes Praxis'
  padding as explicit `padding=((1, 1), (1, 1))`.
- BatchNorm with paddings: Praxis zeroes the padded outputs (`set_padded_output_to_zero=True`, its
  default); pax_eqx does when `BatchNormConfig.set_padded_output_to_zero=True`.
- ViT class token: Praxis' VitEntryLayers adds the position table to the patches and then
  prepends the token; pax_eqx does with `ViTConfig.cls_position_embedding=False`.
- ResNet blocks: pax_eqx's ConvBN convolutions use "SAME" (TensorFlow's), so a stride-2 block
  agrees with Praxis' on odd images only; on even ones it agrees once its convolutions take
  Praxis' padding (test_resnet_block_on_even_images_*).
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.layers import (
    ActivationConfig,
    AttentionConfig,
    BatchNormConfig,
    Context,
    Conv2DConfig,
    Mode,
    ResNetBlockConfig,
    TransformerConfig,
    split_state,
)
from pax_eqx.layers.vits import ViTConfig

EXPECTED = np.load(Path(__file__).resolve().parent / "vision" / "expected.npz")
ATOL = 1e-5


def _arrays(prefix: str) -> dict[str, np.ndarray]:
    """{Praxis path below `prefix`: array}."""
    return {k[len(prefix) :]: EXPECTED[k] for k in EXPECTED.files if k.startswith(prefix)}


def _place(module, case: str, where: dict[str, tuple]):
    """`module` (built abstractly: shapes only) holding the case's Praxis params: `where` maps each
    Praxis path to (getter, transform); every parameter of `module` must get one."""
    params = _arrays(f"{case}/params/")
    assert set(params) == set(where), sorted(set(params) ^ set(where))
    getters = [where[k][0] for k in params]
    values = [jnp.asarray(where[k][1](v)) for k, v in params.items()]
    module = eqx.tree_at(lambda m: [g(m) for g in getters], module, values)
    left = [jax.tree_util.keystr(p) for p, a in jax.tree_util.tree_leaves_with_path(module) if _abstract(a)]
    assert not left, f"pax_eqx parameters no Praxis variable gives: {left}"
    return module


def _abstract(a) -> bool:
    return isinstance(a, jax.ShapeDtypeStruct)


def _built(build):
    """`split_state(build(key))` with shapes only (the Praxis arrays replace every parameter; the
    state is zeros until the Praxis moving statistics go in): running the initialisers would
    compile each (seconds on CPU) for values thrown away."""
    module, state = eqx.filter_eval_shape(lambda k: split_state(build(k)), jax.random.PRNGKey(0))
    return module, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype) if _abstract(a) else a, state)


def _compare(case: str, module, forward, where: dict[str, tuple]):
    """Output and gradients (input, every Praxis param) of `forward(module, x) -> (y, aux)`
    against the case's; returns aux (the Context's state after the call, for the layers with one)."""
    y, aux, (grad_module, grad_x) = _output_and_gradients(
        forward, module, jnp.asarray(EXPECTED[f"{case}/x"]), jnp.asarray(EXPECTED[f"{case}/cotangent"])
    )
    _close(y, EXPECTED[f"{case}/y"], f"{case}: y")
    _close(grad_x, EXPECTED[f"{case}/grad_x"], f"{case}: grad x")
    for path, expected in _arrays(f"{case}/grad/").items():
        getter, transform = where[path]
        _close(getter(grad_module), transform(expected), f"{case}: grad {path}")
    return aux


@eqx.filter_jit
def _output_and_gradients(forward, module, x, cotangent):
    """One compiled program (eagerly, every small op of a ViT is its own dispatch: seconds)."""
    y, vjp, aux = eqx.filter_vjp(forward, module, x, has_aux=True)
    return y, aux, vjp(cotangent)


def _close(actual, expected, what: str) -> None:
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL, err_msg=what)


def _same(a):
    return a


# ----------------------------------------------------------------------------------------- Conv2D

CONVS = {
    "conv_s1_bias": dict(input_channels=3, strides=(1, 1), use_bias=True),
    # Praxis' SAME with stride 2: (k - 1) // 2 = 1 zero before, 1 after (TensorFlow's: 0 and 1).
    "conv_s2_bias": dict(input_channels=3, strides=(2, 2), use_bias=True, padding=((1, 1), (1, 1))),
    "conv_s2_tf": dict(input_channels=3, strides=(2, 2)),  # Praxis' tf_equivalent_padding=True
    "conv_grouped_dilated": dict(input_channels=4, dilation=(2, 2), feature_group_count=2),
}


def _conv(case: str, **changes):
    cfg = Conv2DConfig(output_channels=4, kernel_size=(3, 3), **{**CONVS[case], **changes})
    conv = eqx.filter_eval_shape(cfg.build, jax.random.PRNGKey(0))
    where = {"w": (lambda m: m.w, _same)}
    if cfg.use_bias:
        where["b"] = (lambda m: m.b, _same)
    return _place(conv, case, where), where


@pytest.mark.parametrize("case", list(CONVS))
def test_conv2d_gives_praxis_outputs_and_gradients(case):
    conv, where = _conv(case)
    _compare(case, conv, lambda m, x: (m(x), None), where)


def test_conv2d_same_with_stride_2_is_tensorflows_not_praxis_default():
    """The convention above: pax_eqx's "SAME" shifts a stride-2 window against Praxis' default."""
    conv, _ = _conv("conv_s2_bias", padding="SAME")
    y = conv(jnp.asarray(EXPECTED["conv_s2_bias/x"]))
    assert np.abs(np.asarray(y) - EXPECTED["conv_s2_bias/y"]).max() > 0.1


# -------------------------------------------------------------------------------------- BatchNorm

BN_WHERE = {"beta": (lambda m: m.beta, _same), "gamma": (lambda m: m.gamma, _same)}


def _with_state(y_and_ctx):
    y, ctx = y_and_ctx
    return y, ctx.state


def _with_stats(ctx: Context, norm, stats: dict[str, np.ndarray], prefix: str = "") -> Context:
    ctx = ctx.update_var(norm.moving_mean, jnp.asarray(stats[prefix + "moving_mean"]))
    return ctx.update_var(norm.moving_variance, jnp.asarray(stats[prefix + "moving_variance"]))


def _check_stats(state, norm, expected: dict[str, np.ndarray], what: str, prefix: str = "") -> None:
    ctx = Context(state=state)
    for name in ("moving_mean", "moving_variance"):
        _close(ctx.get_var(getattr(norm, name)), expected[prefix + name], f"{what}: {prefix}{name}")


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("paddings", [False, True])
def test_batch_norm_gives_praxis_outputs_gradients_and_moving_statistics(mode, paddings):
    case = f"bn_{mode}" + ("_paddings" if paddings else "")
    bn, state = _built(lambda k: BatchNormConfig(dims=5, decay=0.9, set_padded_output_to_zero=True).build())
    bn = _place(bn, case, BN_WHERE)
    ctx = _with_stats(Context(state=state, mode=Mode(mode)), bn, _arrays(f"{case}/stats/"))
    pad = jnp.asarray(EXPECTED["bn_paddings"]) if paddings else None
    new_state = _compare(case, bn, lambda m, x: _with_state(m(x, ctx, paddings=pad)), BN_WHERE)
    expected = _arrays(f"{case}/new/") if mode == "train" else _arrays(f"{case}/stats/")
    _check_stats(new_state, bn, expected, case)


def test_batch_norm_without_zeroing_differs_only_at_padded_positions():
    """pax_eqx's default leaves the padded outputs normalised (Praxis zeroes them)."""
    case = "bn_train_paddings"
    bn, state = _built(lambda k: BatchNormConfig(dims=5, decay=0.9).build())
    bn = _place(bn, case, BN_WHERE)
    ctx = _with_stats(Context(state=state, mode=Mode.TRAIN), bn, _arrays(f"{case}/stats/"))
    y, _ = bn(jnp.asarray(EXPECTED[f"{case}/x"]), ctx, paddings=jnp.asarray(EXPECTED["bn_paddings"]))
    real = EXPECTED["bn_paddings"] < 0.5
    np.testing.assert_allclose(y[real], EXPECTED[f"{case}/y"][real], rtol=0, atol=ATOL)
    assert np.abs(np.asarray(y)[~real]).min() > 0


# ------------------------------------------------------------------------------------ ResNetBlock

BLOCKS = {
    "block_basic_s2": (False, 4, 8, 2),
    "block_bottleneck_s2": (True, 4, 8, 2),
    "block_basic_identity": (False, 8, 8, 1),
}


def _block(case: str, bottleneck: bool, cin: int, cout: int, stride: int):
    cfg = ResNetBlockConfig(bottleneck=bottleneck, batch_norm_decay=0.9, activation=ActivationConfig(name="relu"))
    block, state = _built(lambda k: cfg.build(k, input_channels=cin, output_channels=cout, stride=stride))
    convs = {f"body_{i}": (lambda m, i=i: m.body[i]) for i in range(len(block.body))}
    if block.shortcut is not None:
        convs["shortcut"] = lambda m: m.shortcut
    where = {}
    for name, get in convs.items():
        where[f"{name}/w"] = (lambda m, get=get: get(m).conv.w, _same)
        where[f"{name}/bn/beta"] = (lambda m, get=get: get(m).norm.beta, _same)
        where[f"{name}/bn/gamma"] = (lambda m, get=get: get(m).norm.gamma, _same)
    return _place(block, case, where), state, where, convs


def _block_case(case: str, mode: str, block, state, where, convs) -> None:
    key = f"{case}/{mode}"
    stats = _arrays(f"{key}/stats/")
    ctx = Context(state=state, mode=Mode(mode))
    for name, get in convs.items():
        ctx = _with_stats(ctx, get(block).norm, stats, f"{name}/bn/")
    new_state = _compare(key, block, lambda m, x: _with_state(m(x, ctx)), where)
    expected = _arrays(f"{key}/new/") if mode == "train" else stats
    for name, get in convs.items():
        _check_stats(new_state, get(block).norm, expected, key, f"{name}/bn/")


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("case", list(BLOCKS))
def test_resnet_block_gives_praxis_outputs_gradients_and_moving_statistics(case, mode):
    block, state, where, convs = _block(f"{case}/{mode}", *BLOCKS[case])
    _block_case(case, mode, block, state, where, convs)


def test_resnet_block_on_even_images_matches_praxis():
    """A stride-2 block on a 6x6 image: Praxis' padding ((k - 1) // 2 before, whatever the stride),
    not TensorFlow's "SAME", in every convolution of the block."""
    case = "block_basic_s2_even"
    block, state, where, convs = _block(f"{case}/train", False, 4, 8, 2)
    _block_case(case, "train", block, state, where, convs)


# ---------------------------------------------------------------------------------------------- ViT

LAYER_WHERE = {
    "layer_norm/scale": ("attention_norm.scale", _same),
    "layer_norm/bias": ("attention_norm.bias", _same),
    "self_attention/query/w": ("attention.w_q", _same),
    "self_attention/key/w": ("attention.w_k", _same),
    "self_attention/value/w": ("attention.w_v", _same),
    "self_attention/query/b": ("attention.b_q", _same),
    "self_attention/key/b": ("attention.b_k", _same),
    "self_attention/value/b": ("attention.b_v", _same),
    "self_attention/post/w": ("attention.w_o", lambda a: np.transpose(a, (1, 2, 0))),
    "self_attention/post/b": ("attention.b_o", _same),
    "self_attention/per_dim_scale/per_dim_scale": ("attention.per_dim_scale", _same),
    "ff_layer/layer_norm/scale": ("ff_norm.scale", _same),
    "ff_layer/layer_norm/bias": ("ff_norm.bias", _same),
    "ff_layer/ffn_layer1/linear/w": ("ff_in.linear.w", _same),
    "ff_layer/ffn_layer1/bias/b": ("ff_in.bias.b", _same),
    "ff_layer/ffn_layer2/linear/w": ("ff_out.w", _same),
    "ff_layer/ffn_layer2/bias/b": ("ff_out_bias.b", _same),
}


def _attr(path: str):
    def get(m):
        for name in path.split("."):
            m = getattr(m, name)
        return m

    return get


def _vit_where(cls_token: bool, num_layers: int) -> dict[str, tuple]:
    where = {
        "entry_stack/patch_projection/linear/w": (lambda m: m.patch_embedding.w, _same),
        "entry_stack/patch_projection/bias/b": (lambda m: m.patch_bias.b, _same),
        "entry_stack/pos_emb/emb_var": (lambda m: m.position_embedding.emb_var, _same),
        "exit_stack/ln/scale": (lambda m: m.final_norm.scale, _same),
        "exit_stack/ln/bias": (lambda m: m.final_norm.bias, _same),
    }
    if cls_token:
        where["entry_stack/prepend_cls_embs"] = (lambda m: m.cls_token, lambda a: a.reshape(-1))
    for i in range(num_layers):
        for rel, (path, fn) in LAYER_WHERE.items():
            get = _attr(path)
            where[f"transformers_stack/x_layers_{i}/{rel}"] = (lambda m, i=i, get=get: get(m.transformer.layers[i]), fn)
    return where


@pytest.mark.parametrize("case", ["vit_mean", "vit_cls"])
def test_vit_gives_praxis_outputs_and_gradients(case):
    """Praxis' VisionTransformer (entry: patches, projection, position table; a StackedTransformer
    of pre-LN layers with attention biases, PerDimScale and GELU; exit: LayerNorm, average over
    the tokens) is ViTConfig with those block options; "cls": the class token's output."""
    cls_token = case == "vit_cls"
    block = TransformerConfig(
        attention=AttentionConfig(causal=False, use_bias=True, per_dim_scale=True, implementation="xla"),
        activation=ActivationConfig(name="gelu"),
    )
    cfg = ViTConfig(
        patch_size=2, model_dims=16, num_layers=2, num_heads=2, hidden_dims=32, block=block, repeat=False,
        pooling="cls" if cls_token else "mean", cls_position_embedding=not cls_token,
    )  # fmt: skip
    where = _vit_where(cls_token, cfg.num_layers)
    vit = eqx.filter_eval_shape(lambda k: cfg.build(k, image_shape=(6, 6, 3)), jax.random.PRNGKey(0))
    _compare(case, _place(vit, case, where), lambda m, x: (m(x, Context(mode=Mode.EVAL))[0], None), where)
