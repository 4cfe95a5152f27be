"""The plain-JAX reference GPT: param count, numerics against a NumPy forward, training, remat/scan."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_same_math, assert_same_math_tree

from benchmarks.reference_config import ReferenceConfig, resolve_attention_impl
from benchmarks.reference_gpt import (
    count_params,
    forward,
    init_params,
    loss_fn,
    main,
    make_train_step,
    synthetic_batch,
    weight_decay_mask,
)

TINY = ReferenceConfig(
    num_layers=3, model_dims=32, num_heads=4, hidden_dims=48, seq_len=16, vocab_size=64, batch_size=4,
    dtype="float32", remat_policy="none", learning_rate=1e-2, weight_decay=0.0,
)  # fmt: skip

# The model choices benchmarks.mfu mirrors from an experiment (shakespeare_char's among them).
CHOICES = [
    {},
    {"position_embedding": "rotary", "activation": "gelu_exact", "norm_bias": False, "use_bias": False},
    {"norm": "rms_norm", "norm_bias": False, "activation": "silu", "mlp_bias": False, "scan_layers": False},
    {"activation": "relu", "use_bias": False, "mlp_bias": True, "scan_layers": False, "position_embedding": "rotary"},
]


def _leaf_count(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


@pytest.mark.parametrize(
    "changes",
    [{}, {"use_bias": False}, {"hidden_dims": 100}, {"num_layers": 1, "vocab_size": 7, "seq_len": 3}, *CHOICES[1:]],
)
def test_count_params_equals_the_initialized_leaves(changes):
    cfg = ReferenceConfig(**{**TINY.__dict__, **changes})
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    assert count_params(cfg) == _leaf_count(params)


def test_gpt3_xl_param_count():
    # 24 * (12 d^2 + 13 d) + V d + S d + 2 d, with d = 2048, V = 50304, S = 2048.
    assert count_params(ReferenceConfig()) == 1_315_819_520
    assert ReferenceConfig().hidden_dims == 4 * 2048


def _numpy_forward(params, ids, cfg):
    """An independent float64 NumPy forward: explicit per-head softmax attention with a causal mask."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps = cfg.layer_norm_epsilon

    def ln(x, norm):
        if cfg.norm == "rms_norm":
            return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * norm["scale"]
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * norm["scale"] + norm.get("bias", 0)

    erf = np.vectorize(math.erf)
    act = {
        "gelu": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "gelu_exact": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
        "relu": lambda x: np.maximum(x, 0),
        "silu": lambda x: x / (1 + np.exp(-x)),
    }[cfg.activation]

    def rope(x):  # x [b, s, n, h]: angle p / 10000^(2i/h) rotates (x_i, x_{i + h/2})
        pos = np.arange(x.shape[1])[None, :, None, None]
        angle = pos / 10_000.0 ** (2 * np.arange(h // 2) / h)
        x1, x2 = x[..., : h // 2], x[..., h // 2 :]
        return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)

    b, s = ids.shape
    n, h, d = cfg.num_heads, cfg.head_dims, cfg.model_dims
    x = p["token_embedding"][ids]
    if cfg.position_embedding == "learned":
        x = x + p["position_embedding"][:s]
    causal = np.tril(np.ones((s, s), bool))
    for i in range(cfg.num_layers):
        layer = jax.tree.map(lambda a, i=i: a[i], p["layers"]) if cfg.scan_layers else p["layers"][i]
        y = ln(x, layer["ln1"])
        w = layer["qkv"]["w"].reshape(3, d, n * h)
        bias = layer["qkv"]["b"].reshape(3, n * h) if cfg.use_bias else np.zeros((3, n * h))
        q, k, v = ((y @ w[j] + bias[j]).reshape(b, s, n, h) for j in range(3))
        if cfg.position_embedding == "rotary":
            q, k = rope(q), rope(k)
        out = np.zeros((b, s, n, h))
        for head in range(n):
            scores = q[:, :, head] @ k[:, :, head].transpose(0, 2, 1) / math.sqrt(h)
            scores = np.where(causal, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[:, :, head] = probs @ v[:, :, head]
        x = x + out.reshape(b, s, d) @ layer["out"]["w"].reshape(d, d) + (layer["out"]["b"] if cfg.use_bias else 0)
        y = ln(x, layer["ln2"])
        y = act(y @ layer["mlp_in"]["w"] + (layer["mlp_in"]["b"] if cfg.mlp_bias else 0))
        x = x + y @ layer["mlp_out"]["w"] + (layer["mlp_out"]["b"] if cfg.mlp_bias else 0)
    x = ln(x, p["final_ln"])
    return x @ p["token_embedding"].T


@pytest.mark.parametrize("choices", CHOICES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "gpt")
def test_forward_matches_an_independent_numpy_forward(choices):
    cfg = ReferenceConfig(**{**TINY.__dict__, "init_std": 0.2, **choices})  # large weights: attention not uniform
    params = init_params(cfg, jax.random.key(1))
    # Non-zero biases and norm params, so that a misplaced one shows.
    rng = np.random.default_rng(2)
    params = jax.tree.map(lambda x: x + 0.1 * rng.standard_normal(x.shape, np.float32), params)
    ids = synthetic_batch(cfg, seed=3)["ids"]
    got = np.asarray(forward(params, jnp.asarray(ids), cfg))
    want = _numpy_forward(params, ids, cfg)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    # Causality: changing the last token leaves every earlier position's logits unchanged.
    ids2 = ids.copy()
    ids2[:, -1] = (ids2[:, -1] + 1) % cfg.vocab_size
    got2 = np.asarray(forward(params, jnp.asarray(ids2), cfg))
    np.testing.assert_array_equal(got2[:, :-1], got[:, :-1])
    assert not np.allclose(got2[:, -1], got[:, -1])


def test_train_step_starts_at_uniform_loss_decreases_and_donates_the_state():
    init_state, step = make_train_step(TINY)
    state = init_state(jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(TINY))
    initial_embedding = state.params["token_embedding"]
    losses = []
    for _ in range(8):
        state, loss = step(state, batch)
        losses.append(float(loss))
    assert initial_embedding.is_deleted()  # the state was donated: updated in place
    assert abs(losses[0] - math.log(TINY.vocab_size)) < 0.05  # init std 0.02: near-uniform logits
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert int(state.step) == 8


# One jitted function for the module, so a config's program compiles once per test process.
_value_and_grad = jax.jit(jax.value_and_grad(loss_fn), static_argnums=2)


def _loss_and_grads(cfg, params, batch):
    return _value_and_grad(params, batch, cfg)


def _assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert_same_math(loss_a, loss_b)  # the same computation in another program (tests/tolerances.py)
    assert_same_math_tree(grads_a, grads_b)


def test_scan_and_unrolled_layers_give_the_same_loss_and_grads():
    params = init_params(TINY, jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(TINY))
    rolled = _loss_and_grads(TINY, params, batch)
    unrolled_cfg = ReferenceConfig(**{**TINY.__dict__, "unroll": TINY.num_layers})
    _assert_same(rolled, _loss_and_grads(unrolled_cfg, params, batch))


def test_microbatches_make_the_update_of_the_whole_batch():
    """Two parts of 2 rows, gradients summed then averaged: the loss and the update of the 4 rows
    at once (`learner.num_microbatches` in the framework); and a batch they do not divide is refused."""
    from benchmarks.reference_gpt import _loss_and_grads as reference_loss_and_grads

    params = init_params(TINY, jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(TINY))
    halves = ReferenceConfig(**{**TINY.__dict__, "num_microbatches": 2})
    _assert_same(_loss_and_grads(TINY, params, batch), reference_loss_and_grads(params, batch, halves))
    init, step = make_train_step(halves)
    _, whole_step = make_train_step(TINY)
    after_parts, loss_parts = step(init(jax.random.key(1)), batch)
    after_whole, loss_whole = whole_step(init(jax.random.key(1)), batch)
    assert_same_math(loss_parts, loss_whole)
    # Adam's first update is lr * g / (|g| + eps): gradients equal to float32 rounding (above)
    # move a parameter whose gradient is ~1e-6 by a visibly different fraction of lr.
    for a, b in zip(jax.tree.leaves(after_parts.params), jax.tree.leaves(after_whole.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=TINY.learning_rate * 1e-2)
    with pytest.raises(ValueError, match="num_microbatches=3 must be > 0 and divide batch_size=4"):
        ReferenceConfig(**{**TINY.__dict__, "num_microbatches": 3})


@pytest.mark.parametrize("policy", ["dots_with_no_batch_dims_saveable", "full"])
def test_remat_gives_the_same_loss_and_grads(policy):
    params = init_params(TINY, jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(TINY))
    remat_cfg = ReferenceConfig(**{**TINY.__dict__, "remat_policy": policy})
    _assert_same(_loss_and_grads(TINY, params, batch), _loss_and_grads(remat_cfg, params, batch))
    # And remat is really applied: the gradient program contains a checkpoint (remat) primitive.
    jaxpr = str(jax.make_jaxpr(jax.grad(loss_fn), static_argnums=2)(params, batch, remat_cfg))
    assert "remat" in jaxpr or "checkpoint" in jaxpr
    plain = str(jax.make_jaxpr(jax.grad(loss_fn), static_argnums=2)(params, batch, TINY))
    assert "remat" not in plain and "checkpoint" not in plain


@pytest.mark.parametrize(
    "policy, forward_kernels", [("dots_with_no_batch_dims_saveable", 2), ("dots_with_no_batch_dims_and_context", 1)]
)
def test_the_context_policy_keeps_the_cudnn_kernel_from_running_twice(cudnn_tracing, policy, forward_kernels):
    """The reference applies the same policies as pax_eqx (tests/layers/test_layer_repeats.py)."""
    cfg = ReferenceConfig(**{**TINY.__dict__, "dtype": "bfloat16", "attention_impl": "cudnn", "remat_policy": policy})
    params = init_params(cfg, jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(cfg))
    assert cudnn_tracing(jax.make_jaxpr(jax.grad(loss_fn), static_argnums=2)(params, batch, cfg)) == forward_kernels


def test_bfloat16_compute_keeps_float32_params_and_grads():
    cfg = ReferenceConfig(**{**TINY.__dict__, "dtype": "bfloat16"})
    params = init_params(cfg, jax.random.key(0))
    batch = jax.tree.map(jnp.asarray, synthetic_batch(cfg))
    assert forward(params, batch["ids"], cfg).dtype == jnp.bfloat16
    loss, grads = _loss_and_grads(cfg, params, batch)
    assert loss.dtype == jnp.float32
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    loss32, _ = _loss_and_grads(TINY, params, batch)
    np.testing.assert_allclose(loss, loss32, rtol=2e-2)  # bf16 has 8 mantissa bits


def test_weight_decay_mask_decays_matrices_not_norms_or_biases():
    mask = weight_decay_mask(init_params(TINY, jax.random.key(0)))
    assert mask["token_embedding"] and mask["position_embedding"]
    assert mask["layers"]["qkv"]["w"] and mask["layers"]["mlp_out"]["w"]
    assert not mask["layers"]["qkv"]["b"] and not mask["layers"]["ln1"]["scale"]
    assert not mask["final_ln"]["bias"]


def test_attention_impl_resolution_and_errors():
    assert resolve_attention_impl(TINY) == "xla"  # CPU
    with pytest.raises(ValueError, match="head dims"):
        resolve_attention_impl(ReferenceConfig(**{**TINY.__dict__, "attention_impl": "cudnn", "dtype": "bfloat16",
                                                  "num_heads": 8}))  # fmt: skip
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_attention_impl(ReferenceConfig(**{**TINY.__dict__, "attention_impl": "cudnn"}))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_heads": 5}, "model_dims=32 is not divisible by num_heads=5"),
        ({"remat_policy": "dots"}, "remat_policy='dots' is unknown"),
        ({"unroll": 4}, r"unroll=4 must be in \[1, num_layers=3\]"),
        ({"attention_impl": "flash"}, "attention_impl='flash' is unknown"),
        ({"dtype": "bf16"}, "dtype='bf16' is unknown"),
        ({"vocab_size": 0}, "vocab_size must be > 0"),
    ],
)
def test_config_errors_name_the_field_and_value(changes, message):
    with pytest.raises(ValueError, match=message):
        ReferenceConfig(**{**TINY.__dict__, **changes})


def test_forward_rejects_sequences_longer_than_the_position_table():
    params = init_params(TINY, jax.random.key(0))
    with pytest.raises(ValueError, match="seq_len=16"):
        forward(params, jnp.zeros((1, 17), jnp.int32), TINY)


def test_cli_prints_one_json_report(capsys):
    flags = "--steps 1 --warmup 1 --num-layers 1 --model-dims 16 --num-heads 2 --seq-len 8 --vocab-size 32"
    main([*flags.split(), "--batch-size", "2", "--dtype", "float32", "--use-bias", "false"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cfg = ReferenceConfig(num_layers=1, model_dims=16, num_heads=2, seq_len=8, vocab_size=32, batch_size=2,
                          dtype="float32", use_bias=False)  # fmt: skip
    assert report["hidden_dims"] == 64 and report["params"] == count_params(cfg)
    assert report["tokens_per_s"] == pytest.approx(16 / report["step_time_s"])
    assert report["peak_tflops"] > 0 and 0 < report["mfu"] <= report["hfu"]
