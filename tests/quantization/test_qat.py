"""Quantization-aware training (`--quantization fake_quant | aqt`): the forward multiplies by
fake-quantized weights, the gradient reaches the float weights (straight through), and the
choice's fields are checked naming them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import registry
from pax_eqx.config import ConfigError
from pax_eqx.layers.base import Mode
from pax_eqx.programs.runtime import build_task
from pax_eqx.quantization.operations import aqt_fake_quant, fake_quant
from pax_eqx.quantization.quantization_choice import AqtConfig, FakeQuantConfig, IntQuantizationConfig

SHRINK = {"model.num_layers": 1, "model.model_dims": 16, "model.hidden_dims": 32, "model.num_heads": 2,
          "model.max_seq_len": 16, "data.seq_len": 16}  # fmt: skip


def _exp(quantization=None):
    exp = registry.load_experiment("shakespeare_char")
    for path, value in SHRINK.items():
        exp = exp.override(path, value)
    return exp if quantization is None else dataclasses.replace(exp, quantization=quantization)


def _loss_and_grads(exp, params):
    task = build_task(exp)
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 60)
    batch = {"ids": ids, "labels": jnp.roll(ids, -1, 1), "weights": jnp.ones((2, 16)), "paddings": jnp.zeros((2, 16))}
    batch = {k: v for k, v in batch.items() if k in task.input_keys or k in ("labels", "weights")}

    def loss(p):
        return task.forward(p, None, batch, None, Mode.EVAL).metrics["total_loss"].value

    return jax.jit(jax.value_and_grad(loss))(params)  # one compile: eager op-by-op is several times slower


@pytest.mark.parametrize("choice", [FakeQuantConfig(weight_bits=4), AqtConfig(weight_bits=4)])
def test_fake_quant_changes_the_loss_and_the_gradient_flows_straight_through(choice):
    float_exp = _exp()
    params = build_task(float_exp).init_state(jax.random.PRNGKey(0)).params
    float_loss, float_grads = _loss_and_grads(float_exp, params)
    q_loss, q_grads = _loss_and_grads(_exp(choice), params)
    assert float(q_loss) != float(float_loss) and abs(float(q_loss) - float(float_loss)) < 0.1
    flat_f, flat_q = jax.tree.leaves(float_grads), jax.tree.leaves(q_grads)
    assert all(np.isfinite(np.asarray(g)).all() for g in flat_q)
    # Every weight gets a gradient (STE), near the float one, not equal to it.
    for gf, gq in zip(flat_f, flat_q, strict=True):
        if np.abs(np.asarray(gf)).max() > 0:
            assert np.abs(np.asarray(gq)).max() > 0
    total_f = np.concatenate([np.ravel(g) for g in flat_f])
    total_q = np.concatenate([np.ravel(g) for g in flat_q])
    assert not np.array_equal(total_f, total_q)
    assert np.corrcoef(total_f, total_q)[0, 1] > 0.9


def test_aqt_rounds_ties_up_and_adds_eps_to_the_scale():
    x = jnp.array([[512.0, 1536.0, 2560.0, 127.0 * 1024]], jnp.float32)  # scale 1024: ties at 0.5, 1.5, 2.5
    np.testing.assert_array_equal(fake_quant(x, 8, (-1,)) / 1024, [[0.0, 2.0, 2.0, 127.0]])  # half to even
    np.testing.assert_array_equal(aqt_fake_quant(x, 8, (-1,)) / 1024, [[1.0, 2.0, 3.0, 127.0]])  # ties up
    np.testing.assert_array_equal(aqt_fake_quant(jnp.zeros((1, 3)), 8, (-1,)), jnp.zeros((1, 3)))


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FakeQuantConfig(weight_bits=9), "weight_bits"),
        (lambda: FakeQuantConfig(activation_bits=-1), "activation_bits"),
        (lambda: FakeQuantConfig(clipping=0.0), "clipping"),
        (lambda: FakeQuantConfig(layers=("dense", "dense")), "layers"),
        (lambda: FakeQuantConfig(per_token=False), "per_token"),
        (lambda: FakeQuantConfig(activation_bits=8, symmetric=False), "symmetric"),
        (lambda: IntQuantizationConfig(layers=("moe",)), "layers"),
    ],
)
def test_a_bad_field_is_refused_naming_it(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


def test_a_layer_the_model_lacks_is_refused_naming_layers():
    with pytest.raises(ConfigError, match=r"layers=\('conv',\).*no conv"):
        build_task(_exp(FakeQuantConfig(layers=("conv",))))


def test_a_pipelined_stack_is_refused_by_name():
    exp = _exp(FakeQuantConfig())
    exp = exp.override("model.repeat", True).override("model.num_layers", 2)
    exp = exp.override("model.pipeline.num_stages", 2)
    with pytest.raises(ConfigError, match="pipelined"):
        exp._check_quantization()
