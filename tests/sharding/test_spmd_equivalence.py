"""Sharded training == unsharded training, on 8 fake CPU devices.

Five AdamW steps of a small LM on the meshes the issue names must give the losses of one
device. Tolerance: the sharded programs reduce in a different order (partial sums per shard,
then an all-reduce), so float32 results differ by rounding only; 5 steps of Adam on losses
around 3.0 stay within 2e-5 relative.
"""

import jax
import pytest
from spmd_common import LEARNER, losses, programs_for
from tolerances import assert_same_math

from pax_eqx.sharding.mesh import MeshConfig
from pax_eqx.sharding.rules import param_shardings


@pytest.fixture(scope="module")
def reference():
    return losses(MeshConfig(), devices=jax.devices()[:1])


@pytest.mark.parametrize(
    "ici,dcn",
    [
        ((8, 1, 1), (1, 1, 1)),
        ((1, 8, 1), (1, 1, 1)),
        ((1, 1, 8), (1, 1, 1)),
        ((2, 2, 2), (1, 1, 1)),
        ((1, 2, 2), (2, 1, 1)),
    ],
)
def test_sharded_losses_equal_single_device(reference, ici, dcn):
    got = losses(MeshConfig(ici_mesh_shape=ici, dcn_mesh_shape=dcn))
    assert_same_math(got, reference, rtol=2e-5)
    assert reference[-1] < reference[0]


def test_parameters_are_sharded_as_the_rules_say():
    programs = programs_for(MeshConfig(ici_mesh_shape=(2, 2, 2)))
    state = programs.init_state(0)
    expected = param_shardings(state.params, programs.mesh)
    for leaf, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), (leaf.shape, leaf.sharding, want)
    w_in = state.params.stack.layers.ff_in.linear.w
    assert w_in.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    # Adam moments follow their parameters.
    mu = jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
    assert any(getattr(s, "mu", None) is not None for s in mu)


def test_microbatched_step_equals_full_batch():
    full = losses(MeshConfig(ici_mesh_shape=(2, 2, 2)))
    micro = losses(MeshConfig(ici_mesh_shape=(2, 2, 2)), learner=LEARNER.replace(num_microbatches=2))
    assert_same_math(micro, full, rtol=2e-5)
