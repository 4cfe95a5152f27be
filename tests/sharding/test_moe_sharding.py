"""A Mixture-of-Experts LM with its experts sharded (expert -> fsdp) on 8 fake CPU devices trains
to the single-device losses, and the compiled step moves tokens to experts by all-to-all.

Tolerance: as in test_spmd_equivalence, the sharded programs sum in another order (partial sums
per shard, then collectives), so float32 losses differ by rounding only; 5 AdamW steps stay
within 2e-5 relative. The routing (top-2, capacity) is discrete, but no logit sits near a tie
for these seeds, so every run routes every token the same way.
"""

import functools

import jax
import pytest
from spmd_common import MODEL, global_batches, losses, programs_for
from tolerances import assert_same_math

from pax_eqx.layers import MoEFeedForwardConfig
from pax_eqx.sharding.mesh import MeshConfig

# Layers 0 (MoE, 8 experts) and 1 (dense): one scanned [MoE, dense] block.
MOE_MODEL = MODEL.replace(moe_layer_interval=2, moe=MoEFeedForwardConfig(num_experts=8, load_balance_loss_weight=0.1))


@functools.cache
def _reference() -> tuple[float, ...]:
    return tuple(losses(MeshConfig(), devices=jax.devices()[:1], model=MOE_MODEL))


@pytest.mark.parametrize("ici", [(1, 8, 1), (2, 2, 2)])
def test_expert_sharded_losses_equal_single_device(ici):
    reference = _reference()
    got = losses(MeshConfig(ici_mesh_shape=ici), model=MOE_MODEL)
    assert_same_math(got, reference, rtol=2e-5)
    assert reference[-1] < reference[0]


def test_experts_are_sharded_on_fsdp_and_the_step_has_all_to_all():
    programs = programs_for(MeshConfig(ici_mesh_shape=(1, 8, 1)), model=MOE_MODEL)
    state = programs.init_state(0)
    moe = state.params.stack.layers[0].moe
    assert moe.wi.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None, None)  # [layers, expert, ...]
    assert moe.wi.addressable_shards[0].data.shape == (1, 1, 32, 64)  # one expert per device
    assert moe.gate.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)  # the router: embed
    batch = programs.global_batch(next(global_batches()))
    hlo = programs.train_step.lower(state, batch).compile().as_text()
    assert "all-to-all" in hlo
