"""LowRankAdapted: a weight W with its LoRA adapter, applied to x as x @ W + s dropout_p(x) @ A @ B.

What a LoRA run's training forward puts in a weight's place when `lora.dropout` p > 0
(`LoraTask.model`; with p = 0, and in eval, decode and export, the weight is merged instead,
W + s A @ B, and no layer sees this). `linears.dense` multiplies by it, so every projection that
goes through `dense` (Linear; Attention's w_q, w_k, w_v, w_o) takes it unchanged:

    W [*stack, *in, *out]   A [*stack, *in, r]   B [*stack, r, *out]   key [*stack, *key]

`*stack` are the weight's leading stack axes (`layers`, `stage`): the key is split over them
like the weights, so a scanned or pipelined stack slices one layer's W, A, B and key together
and each layer draws its own mask. The key travels with the weight, not with the data, so what
shares a weight within a step shares its mask: the layers of `model.share_layers`, and the
microbatches of a pipelined stack (`learner.num_microbatches` gives each microbatch its own step
key, so its microbatches draw their own). By the time `dense` sees it the stack axes are gone and
`reshape` has flattened the input and output sides to one dimension each (Attention's
`w_q.reshape(embed, heads * head_dim)`), which re-splits A's and B's sides the same way.

The mask (PEFT's lora_dropout) is on the adapter's input only, inverted: kept entries of x are
scaled by 1 / (1 - p), so the expectation of the adapter's term is s x @ A @ B. The frozen
product x @ W sees x untouched.

It is no array: any other use (indexing, a transpose, jnp functions, a cast) raises a
ConfigError naming the weight and the fix, so an adapter can never be dropped silently by a
layer that reads its weight some other way.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pax_eqx.config import ConfigError


class LowRankAdapted(eqx.Module):
    """W and its adapter (see the module doc). `num_in`: how many of W's dimensions after the
    stack axes are its input side; `name`: the weight's parameter name, for errors."""

    w: Array
    a: Array
    b: Array
    key: Array
    scale: float = eqx.field(static=True)
    rate: float = eqx.field(static=True)
    num_in: int = eqx.field(static=True)
    name: str = eqx.field(static=True)

    @property
    def _stack(self) -> int:
        return self.a.ndim - 1 - self.num_in

    @property
    def shape(self) -> tuple[int, ...]:
        """W's shape, as the layer that holds it reads it."""
        return self.w.shape

    @property
    def ndim(self) -> int:
        return self.w.ndim

    def reshape(self, *shape: int) -> LowRankAdapted:
        """W as one [input, output] matrix, A as [input, r], B as [r, output]: the only reshape a
        projection does before `dense`. Any other shape is refused (it would mix the two sides)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        stack = self._stack
        rank = self.a.shape[-1]
        fan_in = math.prod(self.a.shape[stack:-1])
        fan_out = math.prod(self.b.shape[stack + 1 :])
        if stack or shape != (fan_in, fan_out):
            self._refuse(f"a reshape to {shape} (only [{fan_in}, {fan_out}], its input and output sides, is allowed)")
        return LowRankAdapted(
            self.w.reshape(fan_in, fan_out),
            self.a.reshape(fan_in, rank),
            self.b.reshape(rank, fan_out),
            self.key,
            self.scale,
            self.rate,
            1,
            self.name,
        )

    def matmul(self, x: Float[Array, "*batch input"]) -> Float[Array, "*batch output"]:
        """x @ W + s dropout_p(x) @ A @ B in x's dtype, each product one 2-D matmul over the
        flattened leading dimensions (as `linears.dense`), the adapter's term as (x A) B: r
        columns, never an [input, output] product."""
        if self.w.ndim != 2 or self._stack:
            self._refuse(f"a matmul with the weight of shape {self.w.shape} before it is one [input, output] matrix")
        rows = x.reshape(-1, x.shape[-1])
        y = jnp.dot(rows, self.w.astype(x.dtype))
        dropped = rows
        if self.rate > 0:
            keep = jax.random.bernoulli(self.key, 1.0 - self.rate, rows.shape)
            dropped = jnp.where(keep, rows / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros((), x.dtype))
        low = jnp.dot(jnp.dot(dropped, self.a.astype(x.dtype)), self.b.astype(x.dtype))
        y = y + jnp.asarray(self.scale, x.dtype) * low
        return y.reshape(*x.shape[:-1], self.w.shape[-1])

    # Every other use of a weight is refused: the layer would compute with W alone. -------------
    def _refuse(self, use: str) -> None:
        raise ConfigError(
            f"lora.dropout={self.rate}: the adapted weight {self.name} reaches {use}; dropout on an adapter's input "
            "applies where a layer multiplies by its weight through linears.dense (Linear, attention's w_q, w_k, w_v, "
            f"w_o). Drop {self.name} from lora.targets, or pass --lora.dropout 0 (the adapter merged into the weight)."
        )

    def __jax_array__(self):
        self._refuse("a function that converts it to an array")

    def __array__(self, *args, **kwargs):
        self._refuse("numpy, which converts it to an array")

    def __getitem__(self, index):
        self._refuse(f"indexing ([{index}])")

    def astype(self, dtype):
        self._refuse(f"a cast to {dtype} outside linears.dense")

    @property
    def T(self):  # noqa: N802 (numpy's name)
        self._refuse("a transpose")
