"""sharding.activations: activations constrained by logical name, and nothing on one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec

from pax_eqx.sharding.activations import activation_rules, activation_spec, axes_taken, constrain
from pax_eqx.sharding.mesh import MeshConfig, build_mesh


def mesh(ici):
    cfg = MeshConfig(ici_mesh_shape=ici)
    return build_mesh(cfg, jax.devices()[: cfg.num_devices])


def test_the_rules_place_batch_on_the_data_axes_and_mlp_on_tensor():
    with jax.set_mesh(mesh((2, 2, 2))), activation_rules():
        assert activation_spec(("batch", "seq", "mlp"), (8, 16, 64)) == PartitionSpec(("data", "fsdp"), None, "tensor")
        assert activation_spec(("batch", "seq", None), (8, 16, 64)) == PartitionSpec(("data", "fsdp"), None, None)
        # 6 rows do not split 4 ways: replicated, as a weight's indivisible dimension is
        assert activation_spec(("batch", "seq", None), (6, 16, 64)) == PartitionSpec(None, None, None)


def test_the_runs_rules_apply():
    with jax.set_mesh(mesh((2, 2, 2))), activation_rules(("batch=data", "seq=fsdp")):
        assert activation_spec(("batch", "seq", None), (8, 16, 64)) == PartitionSpec("data", "fsdp", None)


def test_a_taken_axis_is_left_to_the_vmapped_dimension():
    with jax.set_mesh(build_mesh(MeshConfig(ici_mesh_shape=(2, 4, 1, 1)))), activation_rules():
        assert activation_spec(("batch", None), (8, 4)) == PartitionSpec(("data", "stage"), None)
        with axes_taken("stage"):
            assert activation_spec(("batch", None), (8, 4)) == PartitionSpec("data", None)


def test_nothing_is_constrained_on_one_device_or_without_rules():
    x = jnp.ones((4, 8))
    with jax.set_mesh(mesh((1, 1, 1))), activation_rules():
        assert activation_spec(("batch", None), x.shape) is None
        assert constrain(x, ("batch", None)) is x
        # and nothing is bound: the traced program is the unconstrained one
        assert "sharding_constraint" not in str(jax.make_jaxpr(lambda a: constrain(a, ("batch", None)))(x))
    with jax.set_mesh(mesh((8, 1, 1))):  # a mesh but no rules: a user's own jit of a layer
        assert constrain(x, ("batch", None)) is x


def test_a_constraint_shards_the_traced_array():
    with jax.set_mesh(mesh((8, 1, 1))), activation_rules():
        f = jax.jit(lambda a: constrain(a * 2, ("batch", None)))
        out = f(jnp.ones((16, 8)))
    assert out.sharding.spec[0] == "data" and out.sharding.shard_shape(out.shape) == (2, 8)


def test_names_must_match_the_arrays_dimensions():
    with jax.set_mesh(mesh((8, 1, 1))), activation_rules(), pytest.raises(ValueError, match="2 logical names"):
        activation_spec(("batch", None), (4, 8, 16))


def test_is_split_says_whether_a_context_axis_splits_the_sequence():
    """What attention asks before choosing cuDNN: a sequence over a context axis is XLA's."""
    from pax_eqx.sharding.activations import is_split

    assert not is_split("seq")  # no rules, no mesh
    with jax.set_mesh(mesh((1, 2, 1, 4, 1))), activation_rules():
        assert is_split("seq") and is_split("batch") and not is_split("kv_seq")
    with jax.set_mesh(mesh((2, 2, 2))), activation_rules():
        assert not is_split("seq")
