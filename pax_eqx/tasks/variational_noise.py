"""Variational noise (Pax's `vn`): Gaussian noise added to the weights in the training forward.

    noisy = add_variational_noise(params, key, step, cfg)

Gradients are taken at the noisy weights and applied to the clean ones (d/dθ f(θ + ε) is f'
at θ + ε), which is how Pax regularises with weight noise. Every floating-point parameter gets
noise; before `start_step`, or with scale 0, the parameters come back unchanged (and with scale
0 nothing is traced at all).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from pax_eqx.task_config import VariationalNoiseConfig


def add_variational_noise(
    params: PyTree[Array], key: PRNGKeyArray, step: Int[Array, ""], cfg: VariationalNoiseConfig
) -> PyTree[Array]:
    if cfg.scale == 0.0:
        return params
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, max(len(leaves), 1))
    on = (step >= cfg.start_step).astype(jnp.float32) * cfg.scale

    def noisy(leaf: Array, k: PRNGKeyArray) -> Array:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf
        return leaf + (on * jax.random.normal(k, leaf.shape, jnp.float32)).astype(leaf.dtype)

    return jax.tree.unflatten(treedef, [noisy(leaf, k) for leaf, k in zip(leaves, keys)])
