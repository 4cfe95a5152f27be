"""A hand-written plain-JAX GPT train step: the yardstick pax_eqx's MFU is compared against.

This is what a competent user writes without a framework (jax, optax and numpy only; nothing
from pax_eqx): a GPT-2/GPT-3 style decoder

    ids [B, S] -> token embedding (tied with the softmax) + learned positions
               -> L x pre-LayerNorm block: x += Attn(LN(x)); x += MLP(LN(x))
               -> final LayerNorm -> logits [B, S, V] = x @ embedding.T -> softmax cross-entropy

and, so that it times the same model as an experiment it is compared with, the model choices
an experiment may make: rotary positions instead of learned ones (`position_embedding`), the
MLP's activation (`activation`: tanh GELU, exact GELU, ReLU, SiLU), RMSNorm or LayerNorm with
or without its bias (`norm`, `norm_bias`), biases on the attention and MLP projections
(`use_bias`, `mlp_bias`), and layers scanned or as a Python loop (`scan_layers`).

with the performance choices DESIGN.md section 5 found to matter on an H100:

- fused QKV: one [d] -> [3, N, H] projection whose output is already in the BTNH layout that
  `jax.nn.dot_product_attention` wants; `implementation="cudnn"` on GPU (flash attention;
  `None` would silently mean XLA), "xla" on CPU; causal.
- layers stacked on a leading [L] axis and applied with `lax.scan(..., unroll=cfg.unroll)`;
  the body wrapped in `jax.checkpoint` with a named policy (default
  `dots_with_no_batch_dims_saveable`: keep the projection/MLP matmul outputs, recompute the
  rest; "none" disables remat).
- fp32 master params, compute in `cfg.dtype` (bf16): each layer's weights are cast inside the
  scan body, so only one layer's bf16 copy is live at a time; LayerNorm statistics and the
  cross-entropy are computed in fp32.
- AdamW (optax) with global-norm clipping; no weight decay on LayerNorm parameters or biases.
- with `num_microbatches` M > 1, the batch is split into M parts applied in a `lax.scan`, their
  float32 gradients summed in the carry, and one update made from the mean: a batch whose
  activations do not fit at once (gpt3_xl's 24 rows on an 80 GB H100) trains as the framework's
  `learner.num_microbatches` trains it.
- the train step is jitted with the state donated, so params and optimizer state update in
  place.

API: `init_params(cfg, key)`, `forward(params, ids, cfg)`, `loss_fn(params, batch, cfg)`,
`make_train_step(cfg) -> (init_state_fn, step_fn)`, `count_params(cfg)`,
`synthetic_batch(cfg, seed)`; `cfg` is a `ReferenceConfig`, which with the choices it accepts
and their checks is in `benchmarks/reference_config.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

from benchmarks.reference_config import ACTIVATIONS, REMAT_POLICIES, ReferenceConfig, resolve_attention_impl

Params = dict[str, Any]
Batch = dict[str, jax.Array]

# Parameters that AdamW decays: the weight matrices and embedding tables, not norms or biases.
_DECAYED = ("token_embedding", "position_embedding", "w")


# Parameters ------------------------------------------------------------------------------------


def count_params(cfg: ReferenceConfig) -> int:
    """Exact number of trainable scalars, by formula (tests check it against `init_params`).

    V*d (tied embedding) + S*d (positions) + 2d (final LN)
    + L * [ 4d (two LNs) + 3d*d (QKV) + d*d (out) + 2*d*F (MLP) + biases (3d + d + F + d) ]
    """
    d, f, v, s, n_layers = cfg.model_dims, cfg.hidden_dims, cfg.vocab_size, cfg.seq_len, cfg.num_layers
    norm = 2 * d if cfg.norm_bias else d
    per_layer = 2 * norm + 3 * d * d + d * d + 2 * d * f
    if cfg.use_bias:
        per_layer += 3 * d + d
    if cfg.mlp_bias:
        per_layer += f + d
    positions = s * d if cfg.position_embedding == "learned" else 0
    return v * d + positions + norm + n_layers * per_layer


def init_params(cfg: ReferenceConfig, key: jax.Array) -> Params:
    """float32 params; every projection N(0, init_std), LayerNorm scale 1 and biases 0.

    Layer params carry a leading [num_layers] axis (what `lax.scan` slices). Shapes:
    qkv.w [L, 3, d, N, H], out.w [L, N, H, d], mlp_in.w [L, d, F], mlp_out.w [L, F, d].
    """
    d, f, n, h, n_layers = cfg.model_dims, cfg.hidden_dims, cfg.num_heads, cfg.head_dims, cfg.num_layers
    keys = jax.random.split(key, 6)
    # Drawn flat and reshaped: same distribution, and XLA compiles threefry for a 1-D shape
    # several times faster than for a 5-D one (seconds on CPU for the init program).
    normal = lambda k, shape: cfg.init_std * jax.random.normal(k, (math.prod(shape),), jnp.float32).reshape(shape)
    ones = lambda *shape: jnp.ones(shape, jnp.float32)
    zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
    norm = lambda *lead: {"scale": ones(*lead, d), **({"bias": zeros(*lead, d)} if cfg.norm_bias else {})}
    layers: Params = {
        "ln1": norm(n_layers),
        "qkv": {"w": normal(keys[2], (n_layers, 3, d, n, h))},
        "out": {"w": normal(keys[3], (n_layers, n, h, d))},
        "ln2": norm(n_layers),
        "mlp_in": {"w": normal(keys[4], (n_layers, d, f))},
        "mlp_out": {"w": normal(keys[5], (n_layers, f, d))},
    }
    if cfg.use_bias:
        layers["qkv"]["b"] = zeros(n_layers, 3, n, h)
        layers["out"]["b"] = zeros(n_layers, d)
    if cfg.mlp_bias:
        layers["mlp_in"]["b"] = zeros(n_layers, f)
        layers["mlp_out"]["b"] = zeros(n_layers, d)
    if not cfg.scan_layers:  # one dict per layer: each layer's arrays and gradients are its own
        layers = [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(n_layers)]
    params = {"token_embedding": normal(keys[0], (cfg.vocab_size, d)), "layers": layers, "final_ln": norm()}
    if cfg.position_embedding == "learned":
        params["position_embedding"] = normal(keys[1], (cfg.seq_len, d))
    return params


def weight_decay_mask(params: Params) -> Params:
    """True for weight matrices and embedding tables; False for LayerNorm params and biases."""
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key in _DECAYED, params)


# Forward ---------------------------------------------------------------------------------------


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, epsilon: float) -> jax.Array:
    """LayerNorm over the last axis; statistics in float32, result in x's dtype."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + epsilon) * scale.astype(jnp.float32)
    return (y if bias is None else y + bias.astype(jnp.float32)).astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, epsilon: float) -> jax.Array:
    """x / rms(x) * scale over the last axis, in float32; result in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + epsilon)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def _norm(cfg: ReferenceConfig, x: jax.Array, p: Params) -> jax.Array:
    if cfg.norm == "rms_norm":
        return rms_norm(x, p["scale"], cfg.layer_norm_epsilon)
    return layer_norm(x, p["scale"], p.get("bias"), cfg.layer_norm_epsilon)


def rotary_tables(seq: int, head_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) [seq, 1, head_dims / 2] of RoPE's angles p / 10000^(2i / head_dims), made once."""
    timescale = 10_000.0 ** (2.0 * np.arange(head_dims // 2, dtype=np.float32) / head_dims)
    angle = np.arange(seq, dtype=np.float32)[:, None, None] / timescale
    return np.sin(angle), np.cos(angle)


def rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """RoPE on x [B, S, N, H]: the first half of each head rotated against the second half."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _block(cfg: ReferenceConfig, attention_impl: str, rotary: Any = None) -> Callable[[jax.Array, Params], jax.Array]:
    """One pre-norm transformer layer, x [B, S, d] -> [B, S, d], taking that layer's fp32 params.
    rotary: (sin, cos) tables for rotary positions, or None."""
    dtype = cfg.compute_dtype
    act = ACTIVATIONS[cfg.activation]

    def block(x: jax.Array, p: Params) -> jax.Array:
        p = jax.tree.map(lambda a: a.astype(dtype), p)
        h = _norm(cfg, x, p["ln1"])
        qkv = jnp.einsum("bsd,kdnh->kbsnh", h, p["qkv"]["w"])  # [3, B, S, N, H]: q, k, v contiguous
        if cfg.use_bias:
            qkv = qkv + p["qkv"]["b"][:, None, None]
        q, k, v = qkv[0], qkv[1], qkv[2]
        if rotary is not None:
            q, k = rotate(q, *rotary), rotate(k, *rotary)
        context = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention_impl)
        context = checkpoint_name(context, "context")
        attn = jnp.einsum("bsnh,nhd->bsd", context, p["out"]["w"])
        if cfg.use_bias:
            attn = attn + p["out"]["b"]
        x = x + attn
        h = _norm(cfg, x, p["ln2"])
        h = h @ p["mlp_in"]["w"]
        if cfg.mlp_bias:
            h = h + p["mlp_in"]["b"]
        h = act(h) @ p["mlp_out"]["w"]
        if cfg.mlp_bias:
            h = h + p["mlp_out"]["b"]
        return x + h

    return block


def forward(params: Params, ids: jax.Array, cfg: ReferenceConfig) -> jax.Array:
    """ids int [B, S] (S <= cfg.seq_len) -> logits [B, S, V] in the compute dtype."""
    dtype = cfg.compute_dtype
    seq = ids.shape[1]
    if seq > cfg.seq_len:
        raise ValueError(f"ids have {seq} positions but ReferenceConfig.seq_len={cfg.seq_len}; raise seq_len.")
    embedding = params["token_embedding"].astype(dtype)
    x = embedding[ids]
    rotary = None
    if cfg.position_embedding == "learned":
        x = x + params["position_embedding"][:seq].astype(dtype)
    else:
        rotary = rotary_tables(seq, cfg.head_dims)

    block = _block(cfg, resolve_attention_impl(cfg), rotary)
    policy = REMAT_POLICIES[cfg.remat_policy]
    if cfg.remat_policy != "none":
        # Inside a rolled scan the recomputation cannot be CSE'd into the forward, so the
        # CSE-preventing barriers only cost time; fully unrolled there is no loop to protect it.
        rolled = cfg.scan_layers and cfg.unroll < cfg.num_layers
        block = jax.checkpoint(block, policy=policy, prevent_cse=not rolled)

    def body(x: jax.Array, layer_params: Params) -> tuple[jax.Array, None]:
        return block(x, layer_params), None

    if cfg.scan_layers:
        x, _ = jax.lax.scan(body, x, params["layers"], unroll=cfg.unroll)
    else:
        for layer_params in params["layers"]:
            x = block(x, layer_params)
    x = _norm(cfg, x, params["final_ln"])
    return jnp.einsum("bsd,vd->bsv", x, embedding)


def loss_fn(params: Params, batch: Batch, cfg: ReferenceConfig) -> jax.Array:
    """Mean next-token cross-entropy (float32) of batch {"ids", "labels"}, both int [B, S]."""
    logits = forward(params, batch["ids"], cfg).astype(jnp.float32)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]))


# Training --------------------------------------------------------------------------------------


class TrainState(NamedTuple):
    step: jax.Array
    params: Params
    opt_state: optax.OptState


def make_optimizer(cfg: ReferenceConfig) -> optax.GradientTransformation:
    """Global-norm clipping (skipped when grad_clip_norm <= 0) then AdamW with a decay mask."""
    adamw = optax.adamw(
        cfg.learning_rate, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay, mask=weight_decay_mask,
    )  # fmt: skip
    if cfg.grad_clip_norm <= 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), adamw)


def make_train_step(
    cfg: ReferenceConfig,
) -> tuple[Callable[[jax.Array], TrainState], Callable[[TrainState, Batch], tuple[TrainState, jax.Array]]]:
    """(init_state_fn, step_fn), both jitted.

    init_state_fn(key) -> TrainState.
    step_fn(state, batch) -> (state, loss): one AdamW step; `state` is donated (do not reuse
    the argument after the call), `loss` is the pre-update loss, a float32 scalar.
    """
    optimizer = make_optimizer(cfg)

    @jax.jit
    def init_state_fn(key: jax.Array) -> TrainState:
        params = init_params(cfg, key)
        return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, jax.Array]:
        loss, grads = _loss_and_grads(state.params, batch, cfg)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(state.step + 1, params, opt_state), loss

    return init_state_fn, jax.jit(step, donate_argnums=0)


def _loss_and_grads(params: Params, batch: Batch, cfg: ReferenceConfig) -> tuple[jax.Array, Params]:
    """The batch's mean loss and its gradient, whole or as `cfg.num_microbatches` equal parts
    (each part's mean loss and gradient averaged: the same numbers, as every part has as many
    tokens)."""
    m = cfg.num_microbatches
    if m == 1:
        return jax.value_and_grad(loss_fn)(params, batch, cfg)
    parts = jax.tree.map(lambda x: x.reshape(m, x.shape[0] // m, *x.shape[1:]), batch)

    def accumulate(carry, part):
        loss_sum, grad_sum = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, part, cfg)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    (loss_sum, grad_sum), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros), parts)
    return loss_sum / m, jax.tree.map(lambda g, p: (g / m).astype(p.dtype), grad_sum, params)


def synthetic_batch(cfg: ReferenceConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform random tokens: ids and labels int32 [batch_size, seq_len], labels = ids shifted by one."""
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1))
    tokens = tokens.astype(np.int32)
    return {"ids": tokens[:, :-1], "labels": tokens[:, 1:]}


def uniform_loss(cfg: ReferenceConfig) -> float:
    """The cross-entropy of a uniform prediction, ln(V): what an untrained model scores."""
    return math.log(cfg.vocab_size)


def time_steps(cfg: ReferenceConfig, steps: int, warmup: int = 2, seed: int = 0) -> dict[str, float]:
    """Median wall time of `steps` train steps after `warmup` (the first compiles), synthetic data.

    Returns {"compile_s", "step_time_s", "loss"}; each step is waited on, so the times are
    per-step latencies of a loop without host-side overlap.
    """
    import statistics
    import time

    init_state, step = make_train_step(cfg)
    state = init_state(jax.random.key(seed))
    batch = jax.device_put(synthetic_batch(cfg, seed))
    start = time.perf_counter()
    state, loss = step(state, batch)
    loss.block_until_ready()
    compile_s = time.perf_counter() - start
    for _ in range(max(warmup - 1, 0)):
        state, loss = step(state, batch)
    loss.block_until_ready()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, loss = step(state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "step_time_s": statistics.median(times), "loss": float(loss)}


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.reference_gpt [--steps N] [--field value ...]`: time the reference alone.

    Every ReferenceConfig field is a flag (--batch-size 8, --remat-policy full, --unroll 24).
    Prints one JSON object with the config, step time, tokens/s and, where the peak is known
    (or measured on CPU), MFU and HFU.
    """
    import argparse
    import json

    from benchmarks import flops

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    defaults = ReferenceConfig()
    for field in dataclasses.fields(ReferenceConfig):
        value = getattr(defaults, field.name)
        boolean = isinstance(value, bool) or field.name == "mlp_bias"
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if boolean else type(value)
        if field.name in ("hidden_dims", "mlp_bias"):
            value = None  # 4 * the --model-dims given / --use-bias, not the defaults' values
            kind = int if field.name == "hidden_dims" else kind
        parser.add_argument("--" + field.name.replace("_", "-"), type=kind, default=value)
    args = vars(parser.parse_args(argv))
    steps, warmup = args.pop("steps"), args.pop("warmup")
    cfg = ReferenceConfig(**args)
    result = time_steps(cfg, steps, warmup)
    device = jax.devices()[0]
    peak = flops.peak_tflops(device.device_kind)
    if peak is None and device.platform == "cpu":
        peak = flops.measure_cpu_peak_tflops()
    tokens_per_s = cfg.tokens_per_step / result["step_time_s"]
    model = flops.model_flops_per_token(count_params(cfg), cfg.num_layers, cfg.model_dims, cfg.seq_len)
    hardware = flops.hardware_flops_per_token(
        count_params(cfg), cfg.num_layers, cfg.model_dims, cfg.seq_len, cfg.remat_policy,
        layer_params=count_params(cfg) - (cfg.vocab_size + cfg.seq_len + 2) * cfg.model_dims,
        attention_impl=resolve_attention_impl(cfg),
    )  # fmt: skip
    report = {
        **dataclasses.asdict(cfg), "device_kind": device.device_kind, "params": count_params(cfg),
        **result, "tokens_per_s": tokens_per_s, "model_tflops_per_s": tokens_per_s * model / 1e12,
        "peak_tflops": peak,
        "mfu": None if peak is None else flops.mfu(tokens_per_s, model, peak),
        "hfu": None if peak is None else flops.mfu(tokens_per_s, hardware, peak),
    }  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
