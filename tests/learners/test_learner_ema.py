"""EMA of the parameters: ema <- decay * ema + (1 - decay) * params."""

import jax.numpy as jnp
import numpy as np

from pax_eqx.learners import ema_init, ema_update


def test_ema_follows_the_formula():
    params = [{"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 0.0])}, {"w": jnp.array([-1.0, 4.0])}]
    ema = ema_init(params[0])
    want = np.array([1.0, 2.0])
    for p in params[1:]:
        ema = ema_update(ema, p, 0.9)
        want = 0.9 * want + 0.1 * np.asarray(p["w"])
    np.testing.assert_allclose(ema["w"], want, rtol=1e-6)


def test_ema_keeps_dtypes_and_copies_non_float_leaves():
    ema = ema_init({"w": jnp.ones((2,), jnp.bfloat16), "count": jnp.array(3), "none": None})
    new = ema_update(ema, {"w": jnp.zeros((2,), jnp.bfloat16), "count": jnp.array(7), "none": None}, 0.75)
    assert new["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(new["w"], np.float32), 0.75)
    assert int(new["count"]) == 7 and new["none"] is None


def test_decay_zero_tracks_params_exactly():
    ema = ema_update(ema_init({"w": jnp.ones(3)}), {"w": jnp.arange(3.0)}, 0.0)
    np.testing.assert_array_equal(ema["w"], jnp.arange(3.0))
