"""FP8 matmuls with delayed scaling against numpy's fp8 rounding (ml_dtypes), and the Task's
overwrite-with-gradient handling of their scales."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from pax_eqx.layers.fp8 import Fp8Scales, fp8_dense, overwritten_mask, quantize_dequantize
from pax_eqx.layers.linears import LinearConfig
from pax_eqx.learners import LearnerConfig
from pax_eqx.learners.optimizer_configs import AdamWConfig
from pax_eqx.models import LanguageModelConfig
from pax_eqx.tasks.task import Task

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def _qdq(t: np.ndarray, dtype, limit: float, scale: float) -> np.ndarray:
    return np.clip(t / scale, -limit, limit).astype(dtype).astype(np.float32) * np.float32(scale)


def _scales(scale, history) -> Fp8Scales:
    """An Fp8Scales holding the given state (rows: input, kernel, gradient)."""
    history = np.asarray(history, np.float32)
    s = eqx.tree_at(lambda t: t.scale, Fp8Scales(history=history.shape[1]), jnp.asarray(scale, jnp.float32))
    return eqx.tree_at(lambda t: t.amax_history, s, jnp.asarray(history))


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, 5, 16)).astype(np.float32) * 4.0
    w = rng.normal(size=(16, 8)).astype(np.float32) * 0.2
    return x, w


def test_quantize_dequantize_rounds_as_numpy_fp8_and_clips_to_the_range():
    x, _ = _data()
    for scale in (1.0, 0.01, 3.0):
        got = quantize_dequantize(jnp.asarray(x), jnp.float8_e4m3fn, jnp.float32(scale))
        np.testing.assert_array_equal(np.asarray(got), _qdq(x, ml_dtypes.float8_e4m3fn, E4M3_MAX, scale))
    big = quantize_dequantize(jnp.asarray([1e6, -1e6]), jnp.float8_e4m3fn, jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(big), [E4M3_MAX, -E4M3_MAX])


def test_forward_uses_the_stored_scales_not_the_current_tensor():
    """Delayed scaling: the scale in the state at call time, whatever the tensor's own amax."""
    x, w = _data()
    sx, sw = 0.05, 0.002
    scales = _scales([sx, sw, 1.0], np.zeros((3, 4)))
    y = fp8_dense(jnp.asarray(x), jnp.asarray(w), scales)
    xq = _qdq(x.reshape(-1, 16), ml_dtypes.float8_e4m3fn, E4M3_MAX, sx)
    wq = _qdq(w, ml_dtypes.float8_e4m3fn, E4M3_MAX, sw)
    np.testing.assert_allclose(np.asarray(y), (xq @ wq).reshape(3, 5, 8), rtol=1e-5, atol=1e-5)


def test_gradients_are_e5m2_rounded_and_the_scales_gradient_is_their_next_value():
    x, w = _data(1)
    g = np.random.default_rng(2).normal(size=(3, 5, 8)).astype(np.float32) * 1e-2
    history = np.zeros((3, 4), np.float32)
    history[:, 0] = [20.0, 0.1, 5e-3]  # an earlier step's amaxes: x's above this x's, w's and g's below
    s = np.array([0.02, 0.001, 1e-6], np.float32)
    scales = _scales(s, history)

    def f(x, w, scales):
        return jnp.sum(fp8_dense(x, w, scales) * g)

    dx, dw, dscales = jax.grad(f, argnums=(0, 1, 2))(jnp.asarray(x), jnp.asarray(w), scales)
    xq = _qdq(x.reshape(-1, 16), ml_dtypes.float8_e4m3fn, E4M3_MAX, s[0])
    wq = _qdq(w, ml_dtypes.float8_e4m3fn, E4M3_MAX, s[1])
    gq = _qdq(g.reshape(-1, 8), ml_dtypes.float8_e5m2, E5M2_MAX, s[2])
    np.testing.assert_allclose(np.asarray(dx).reshape(-1, 16), gq @ wq.T, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(dw), xq.T @ gq, rtol=1e-5, atol=1e-7)
    amax = np.array([np.abs(x).max(), np.abs(w).max(), np.abs(g).max()], np.float32)
    want_history = np.concatenate([amax[:, None], history[:, :-1]], axis=1)
    np.testing.assert_allclose(np.asarray(dscales.amax_history), want_history, rtol=1e-6)
    limits = np.array([E4M3_MAX, E4M3_MAX, E5M2_MAX], np.float32)
    np.testing.assert_allclose(np.asarray(dscales.scale), want_history.max(axis=1) / limits, rtol=1e-6)


def test_a_linear_with_fp8_has_scales_that_the_mask_finds():
    lin = LinearConfig(input_dims=4, output_dims=3, fp8=True).build(jax.random.PRNGKey(0))
    assert isinstance(lin.fp8, Fp8Scales)
    mask = overwritten_mask(lin)
    assert mask.fp8.scale is True and mask.fp8.amax_history is True and mask.w is False
    assert overwritten_mask(LinearConfig(input_dims=4, output_dims=3).build(jax.random.PRNGKey(0))) is None


def _lm(fp8: bool) -> LanguageModelConfig:
    lm = LanguageModelConfig(vocab_size=32, max_seq_len=8, num_layers=2, model_dims=16, hidden_dims=32, num_heads=2)
    return lm.replace(block=lm.block.replace(fp8=fp8))


def _batch() -> dict:
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 8), 0, 32)
    return {"ids": ids, "labels": jnp.roll(ids, -1, axis=1), "weights": jnp.ones((2, 8)), "paddings": jnp.zeros((2, 8))}


def test_the_train_step_overwrites_the_scales_and_optimises_only_the_weights():
    """Two microbatches: the accumulated "gradient" of the scales is still their next value."""
    learner = LearnerConfig(optimizer=AdamWConfig(), learning_rate=1e-2, clip_grad_norm=1.0, num_microbatches=2)
    task = Task(_lm(fp8=True), learner, fprop_dtype="bfloat16")
    state = task.init_state(jax.random.PRNGKey(0))
    attention = state.params.stack.layers.attention
    assert set(attention.fp8) == {"q", "k", "v", "o"} and attention.fp8["q"].scale.shape == (2, 3)  # [layers, 3]
    plain = Task(_lm(fp8=False), learner, fprop_dtype="bfloat16")
    # The optimizer state covers the weights only: the same leaves as the model without fp8.
    n_opt = len(jax.tree.leaves(state.opt_state))
    assert n_opt == len(jax.tree.leaves(plain.init_state(jax.random.PRNGKey(0)).opt_state))
    new, out = jax.jit(task.train_step)(state, _batch())
    for name, s in {**new.params.stack.layers.attention.fp8, "ff_out": new.params.stack.layers.ff_out.fp8}.items():
        history, scale = np.asarray(s.amax_history), np.asarray(s.scale)
        assert (history[:, :, 0] > 0).all(), name  # every layer recorded x, w and gradient amaxes
        limits = np.array([E4M3_MAX, E4M3_MAX, E5M2_MAX])
        np.testing.assert_allclose(scale, history.max(axis=2) / limits, rtol=1e-6, err_msg=name)
    assert np.isfinite(float(out.metrics["grad_norm"].value))
    w_before = np.asarray(state.params.stack.layers.ff_out.w)
    assert not np.allclose(np.asarray(new.params.stack.layers.ff_out.w), w_before)
    # Eval reads the scales the step wrote (an EMA, if kept, covers the weights only).
    ema_task = Task(_lm(fp8=True), learner.replace(ema_decay=0.9), fprop_dtype="bfloat16")
    ema_state = ema_task.init_state(jax.random.PRNGKey(0))
    ema_state, _ = jax.jit(ema_task.train_step)(ema_state, _batch())
    inference = ema_task.inference_params(ema_state)
    np.testing.assert_array_equal(
        np.asarray(inference.stack.layers.ff_out.fp8.scale), np.asarray(ema_state.params.stack.layers.ff_out.fp8.scale)
    )
    assert np.isfinite(float(jax.jit(ema_task.eval_step)(ema_state, _batch()).metrics["total_loss"].value))


def test_fp8_training_follows_the_bf16_loss():
    """Twenty steps of the same tiny LM in bf16 and in fp8 from the same init: the losses agree to
    fp8's rounding (the loss curve on real text is in docs/performance.md)."""
    learner = LearnerConfig(optimizer=AdamWConfig(), learning_rate=3e-3)
    losses = {}
    for fp8 in (False, True):
        task = Task(_lm(fp8), learner, fprop_dtype="bfloat16")
        state = task.init_state(jax.random.PRNGKey(0))
        step = jax.jit(task.train_step)
        history = []
        for _ in range(20):
            state, out = step(state, _batch())
            history.append(float(out.metrics["total_loss"].value))
        losses[fp8] = np.array(history)
    assert losses[False][-1] < losses[False][0] - 0.5  # it learns the fixed batch
    np.testing.assert_allclose(losses[True], losses[False], rtol=0.05)


def test_programs_with_fp8_compile_with_the_lower_autotune_level_unless_xla_flags_set_it(monkeypatch):
    """XLA validates the option's name at compile (a misspelt one is an error), so compiling the
    step on CPU checks the option reaches XLA; on GPU it turns off the per-algorithm result check
    that made each fp8 GEMM take ~25 s to compile."""
    from jax.sharding import Mesh

    from pax_eqx.layers import fp8
    from pax_eqx.programs.compiled import Programs

    learner = LearnerConfig(optimizer=AdamWConfig(), learning_rate=1e-2)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    programs = Programs(Task(_lm(fp8=True), learner, fprop_dtype="bfloat16"), mesh)
    assert programs.compiler_options == {"xla_gpu_autotune_level": fp8.AUTOTUNE_LEVEL}
    state = programs.init_state(0)
    programs.train_step.lower(state, _batch()).compile()
    assert Programs(Task(_lm(fp8=False), learner), mesh).compiler_options == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=4")
    assert fp8.compiler_options(state.params) == {}
