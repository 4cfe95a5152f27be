"""XLA's temporaries of a padded language-model gradient, per attention mask mode and remat.

Padded rows are where attention has query rows without a key (a padded query under Praxis'
masks, a left-padded one at position 0 otherwise); `layers.attention_kernels` keeps their
gradients Praxis' (zero) with a custom backward that stores only a [batch, 1, q, 1] flag per
layer. This prints the compiled step's temporaries (`memory_analysis().temp_size_in_bytes`, on
any backend), so a change to the kernel's masking shows what it costs:

    python -m benchmarks.padded_step_memory [--batch 8] [--seq 256] [--layers 4]
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.layers.base import Context
from pax_eqx.models.language_model import LanguageModelConfig


def padded_batch(batch: int, seq: int) -> dict[str, jax.Array]:
    """Every row's second half padded, and the first row left-padded too (segment 0 = padding)."""
    paddings = np.zeros((batch, seq), np.float32)
    paddings[:, seq // 2 :] = 1
    paddings[0, :5] = 1
    ids = jnp.zeros((batch, seq), jnp.int32)
    segment_ids = jnp.asarray((1 - paddings).astype(np.int32))
    return dict(ids=ids, labels=ids, weights=jnp.asarray(1 - paddings), segment_ids=segment_ids)


def temp_bytes(mask_mode: str, remat: str, batch: int, seq: int, layers: int) -> int:
    base = LanguageModelConfig()
    block = base.block.replace(attention=base.block.attention.replace(mask_mode=mask_mode, implementation="xla"))
    cfg = base.replace(
        vocab_size=256, max_seq_len=seq, model_dims=128, hidden_dims=512, num_heads=4, num_layers=layers,
        block=block, remat_policy=remat,
    )  # fmt: skip
    params, static = eqx.partition(cfg.build(jax.random.PRNGKey(0)), eqx.is_array)
    data = padded_batch(batch, seq)

    def loss(params):
        model = eqx.combine(params, static)
        hidden, _ = model.compute_predictions(data, Context())
        return model.compute_loss(hidden, data)["avg_xent"][0]

    return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    platform = jax.devices()[0].platform
    print(f"padded LM gradient, batch {args.batch} x seq {args.seq}, {args.layers} scanned layers, on {platform}")
    for remat in ("none", "full"):
        for mode in ("pax_eqx", "praxis"):
            n = temp_bytes(mode, remat, args.batch, args.seq, args.layers)
            print(f"  remat {remat:<5} mask_mode {mode:<8} XLA temporaries {n:>13,} bytes")


if __name__ == "__main__":
    main()
