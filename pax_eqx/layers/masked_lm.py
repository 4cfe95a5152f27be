"""BERT's masked-LM augmentation (Praxis' `layers.augmentations.MaskedLmDataAugmenter`).

Of the real (unpadded) tokens, `mask_prob + random_prob + same_prob` (Praxis: 0.12 + 0.015 +
0.015 = 15%) are chosen; a chosen token becomes the mask id (0.12 / 0.15 = 80% of them), a token
drawn uniformly from the whole vocabulary (10%), or stays itself (10%). The loss is taken at
every chosen position and nowhere else. Only padding is ineligible: Praxis excludes no special
id (bos, eos, the mask itself may be chosen, and a random replacement may draw any id, the mask's
included), and neither does this.

The arithmetic is Praxis' own: four draws (a uniform for "chosen", one for "mask" among the
chosen, one for "random" among the rest, and the random ids), and

    chosen = valid * (u1 < total)
    masked = chosen * (u2 < mask_prob / total)
    random = (chosen - masked) * (u3 < random_prob / (total - mask_prob))
    same   = chosen - masked - random

`draws` and `decide` are separate so that a test can feed Praxis' recorded draws to `decide`
(JAX's random bits differ between versions; the decisions from given bits do not).

Randomness: in TRAIN mode the key comes from the Context, as every other layer's (Praxis'
`next_prng_key`). In EVAL and DECODE there is no key, and the masks must not change from one
eval to the next: each row draws from a fixed key folded with a hash of its own tokens, so an
example is masked the same way whichever batch, eval run, host or microbatch it lands in, and
`python -m pax_eqx.eval` reproduces the numbers of the training run's eval. (Praxis' eval takes
the key its eval program hands in; Paxml's BERT experiments read pre-masked eval examples
instead.)
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.base import Context

_EVAL_SEED = 0x4D4C4D  # "MLM": the fixed key eval rows fold their hash into


@config
class MaskedLmConfig(Config):
    """What fraction of the real tokens a masked LM predicts, and what it shows the model there.

    mask_prob: chosen and replaced by the mask id (Praxis: 0.12).
    random_prob: chosen and replaced by a uniformly random id (Praxis: 0.015).
    same_prob: chosen and left as it is (Praxis: 0.015).
    Their sum (15% by default) is the chosen fraction; it must be in (0, 1), and random_prob +
    same_prob must be > 0 (Praxis asserts both).
    """

    mask_prob: float = 0.12
    random_prob: float = 0.015
    same_prob: float = 0.015

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, ("mask_prob", "random_prob", "same_prob"), ge=0, lt=1, prefix="MaskedLmConfig")
        total = self.total
        if not 0.0 < total < 1.0:
            raise ConfigError(
                f"MaskedLmConfig: mask_prob + random_prob + same_prob = {total:g} must be in (0, 1) (the fraction "
                "of tokens chosen); lower mask_prob, random_prob or same_prob."
            )
        if self.random_prob + self.same_prob <= 0.0:
            raise ConfigError(
                "MaskedLmConfig: random_prob + same_prob = 0 (Praxis' augmenter asserts some chosen tokens are not "
                "masked); set random_prob or same_prob above 0."
            )

    @property
    def total(self) -> float:
        return self.mask_prob + self.random_prob + self.same_prob

    def build(self, *, vocab_size: int, mask_token_id: int) -> MaskedLmAugmenter:
        """The augmenter of a model with `vocab_size` ids whose mask is `mask_token_id`."""
        if not 0 <= mask_token_id < vocab_size:
            raise ConfigError(f"MaskedLmConfig.build: mask_token_id={mask_token_id} is not an id of {vocab_size}.")
        return MaskedLmAugmenter(self.mask_prob, self.random_prob, self.same_prob, vocab_size, mask_token_id)


class Draws(NamedTuple):
    """The random numbers one augmentation reads, each [batch, time]: three uniforms in [0, 1)
    (chosen, masked among chosen, random among the rest) and the random replacement ids."""

    chosen: Float[Array, "batch time"]
    masked: Float[Array, "batch time"]
    random: Float[Array, "batch time"]
    random_ids: Int[Array, "batch time"]


class Choices(NamedTuple):
    """What happens at each position: `masked`, `random` and `same` partition `chosen`."""

    chosen: Bool[Array, "batch time"]
    masked: Bool[Array, "batch time"]
    random: Bool[Array, "batch time"]
    same: Bool[Array, "batch time"]
    random_ids: Int[Array, "batch time"]


class MaskedLmAugmenter(eqx.Module):
    """See the module docstring. No parameters: the probabilities, vocabulary and mask id."""

    mask_prob: float = eqx.field(static=True)
    random_prob: float = eqx.field(static=True)
    same_prob: float = eqx.field(static=True)
    vocab_size: int = eqx.field(static=True)
    mask_token_id: int = eqx.field(static=True)

    def draws(self, key: PRNGKeyArray, shape: tuple[int, ...]) -> Draws:
        """The four draws of one augmentation of a [batch, time] array, from `key`: 32 random bits
        each, from one call of the generator (four calls compiled 1.6x slower on XLA:CPU, per row
        in eval 1.7x), made uniform in [0, 1) as jax.random.uniform does (23 bits of mantissa) and
        ids by a modulus (a bias of vocab_size / 2^32 at most)."""
        bits = jax.random.bits(key, (4, *shape), jnp.uint32)
        uniform = jax.lax.bitcast_convert_type((bits[:3] >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
        return Draws(uniform[0], uniform[1], uniform[2], (bits[3] % jnp.uint32(self.vocab_size)).astype(jnp.int32))

    def decide(self, draws: Draws, paddings: Float[Array, "batch time"]) -> Choices:
        """Praxis' decisions from the draws; padded positions (paddings 1) are never chosen."""
        total = self.mask_prob + self.random_prob + self.same_prob
        chosen = (paddings < 0.5) & (draws.chosen < total)
        masked = chosen & (draws.masked < self.mask_prob / total)
        rest = chosen & ~masked
        random = rest & (draws.random < self.random_prob / (total - self.mask_prob))
        return Choices(chosen, masked, random, rest & ~random, draws.random_ids.astype(jnp.int32))

    def apply(self, ids: Int[Array, "batch time"], choices: Choices) -> Int[Array, "batch time"]:
        """The ids the model sees: the mask id, a random id or the token itself where chosen."""
        ids = jnp.where(choices.masked, jnp.asarray(self.mask_token_id, ids.dtype), ids)
        return jnp.where(choices.random, choices.random_ids.astype(ids.dtype), ids)

    def eval_draws(self, ids: Int[Array, "batch time"]) -> Draws:
        """Draws that depend only on each row's tokens (see the module docstring)."""
        t = ids.shape[-1]
        weights = jnp.arange(1, t + 1, dtype=jnp.uint32) * jnp.uint32(2654435761)  # Knuth's multiplicative hash
        row_hash = jnp.sum(ids.astype(jnp.uint32) * weights, axis=-1)
        base = jax.random.PRNGKey(_EVAL_SEED)
        per_row = jax.vmap(lambda h: self.draws(jax.random.fold_in(base, h), (t,)))(row_hash)
        return Draws(*per_row)

    def __call__(
        self, ids: Int[Array, "batch time"], ctx: Context, *, paddings: Float[Array, "batch time"]
    ) -> tuple[tuple[Int[Array, "batch time"], Bool[Array, "batch time"]], Context]:
        """(the augmented ids, the chosen positions), and the context (its key advanced in TRAIN).
        paddings: 1.0 at padded positions, which are never chosen."""
        if ctx.is_training:
            key, ctx = ctx.next_key()
            draws = self.draws(key, ids.shape)
        else:
            draws = self.eval_draws(ids)
        choices = self.decide(draws, paddings)
        return (self.apply(ids, choices), choices.chosen), ctx
