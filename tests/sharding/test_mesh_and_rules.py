"""Mesh construction (ICI x DCN) and the logical-axis rules, on 8 fake CPU devices."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from pax_eqx.models import LanguageModelConfig
from pax_eqx.sharding.logical import logical_axes
from pax_eqx.sharding.mesh import MeshConfig, _outer_inner_grid, build_mesh
from pax_eqx.sharding.rules import param_shardings, parse_rules, spec_for


def test_mesh_shape_must_match_devices():
    with pytest.raises(ValueError, match=r"mesh.ici_mesh_shape \(1, 4, 1\).*8 are available"):
        build_mesh(MeshConfig(ici_mesh_shape=(1, 4, 1)))
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(2, 2, 2)))
    assert dict(mesh.shape) == {"stage": 1, "data": 2, "fsdp": 2, "context": 1, "tensor": 2}


def test_a_four_entry_shape_leads_with_the_stage_axis():
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(2, 2, 1, 2)))
    assert mesh.axis_names == ("stage", "data", "fsdp", "context", "tensor")
    assert dict(mesh.shape) == {"stage": 2, "data": 2, "fsdp": 1, "context": 1, "tensor": 2}
    # ICI and DCN shapes of different lengths: the 3-entry one has stage 1.
    assert MeshConfig(ici_mesh_shape=(1, 2, 2, 1), dcn_mesh_shape=(2, 1, 1)).shape == (1, 4, 2, 1, 1)
    with pytest.raises(ValueError, match=r"mesh.ici_mesh_shape must be 3 .*, 4 .* or 5 .*got \(2, 2\)"):
        MeshConfig(ici_mesh_shape=(2, 2)).validate()


def test_stage_across_dcn_is_outermost():
    """With the stage factor on DCN, the two stages are the two granules (processes/slices):
    only stage-to-stage traffic crosses the slow network."""
    devices = list(range(8))
    grid = _outer_inner_grid(devices, (1, 2, 2, 1, 1), (2, 1, 1, 1, 1))
    assert set(grid[0].ravel()) == {0, 1, 2, 3} and set(grid[1].ravel()) == {4, 5, 6, 7}


def test_dcn_is_the_outer_factor_of_each_axis():
    devices = list(range(8))
    grid = _outer_inner_grid(devices, (1, 2, 2), (2, 1, 1))
    # Devices 0-3 form DCN granule 0, 4-7 granule 1: the data axis crosses granules.
    assert grid.shape == (2, 2, 2)
    assert set(grid[0].ravel()) == {0, 1, 2, 3} and set(grid[1].ravel()) == {4, 5, 6, 7}
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 2, 2), dcn_mesh_shape=(2, 1, 1)))
    assert dict(mesh.shape) == {"stage": 1, "data": 2, "fsdp": 2, "context": 1, "tensor": 2}


def test_spec_for_rules_and_divisibility():
    table = parse_rules(())
    shape = {"data": 2, "fsdp": 2, "tensor": 2}
    assert spec_for(("embed", "mlp"), (16, 32), shape, table) == P("fsdp", "tensor")
    assert spec_for(("layers", "embed", "heads", "kv"), (3, 16, 4, 8), shape, table) == P(None, "fsdp", "tensor", None)
    # 3 heads do not split over 2: replicated rather than an error.
    assert spec_for(("embed", "heads", "kv"), (16, 3, 8), shape, table) == P("fsdp", None, None)
    # A mesh axis is used once per array.
    assert spec_for(("embed", "embed"), (16, 16), shape, table) == P("fsdp", None)
    # The stacked layers' axis goes to the stage axis where there is one.
    staged = {"stage": 2, **shape}
    assert spec_for(("layers", "embed", "mlp"), (4, 16, 32), staged, table) == P("stage", "fsdp", "tensor")
    custom = parse_rules(("embed=", "vocab=fsdp+tensor"))
    assert spec_for(("vocab", "embed"), (8, 16), shape, custom) == P(("fsdp", "tensor"), None)


def test_bad_rule_is_reported():
    with pytest.raises(ValueError, match="mesh.rules"):
        parse_rules(("embed->fsdp",))
    with pytest.raises(ValueError, match="unknown mesh axes"):
        parse_rules(("embed=model",))


def test_param_shardings_cover_every_weight():
    cfg = LanguageModelConfig(vocab_size=16, max_seq_len=8, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4)
    model = jax.eval_shape(lambda: cfg.build(jax.random.key(0)))
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 4, 2)))
    shardings = param_shardings(model, mesh)
    axes = logical_axes(model)
    w_q = shardings.stack.layers.attention.w_q
    assert axes.stack.layers.attention.w_q == ("layers", "embed", "heads", "kv")
    assert w_q.spec == P(None, "fsdp", "tensor", None)
    assert shardings.embedding.w.spec == P("tensor", "fsdp")
    leaves = jax.tree.leaves(model)
    assert len(jax.tree.leaves(shardings)) == len(leaves)


def test_unnamed_weight_is_an_error():
    import equinox as eqx
    import jax.numpy as jnp

    class Bad(eqx.Module):
        w: jax.Array

        def param_axes(self):
            return {}

    with pytest.raises(ValueError, match="no logical axis names"):
        logical_axes(Bad(jnp.zeros((2, 2))))


def test_adafactor_factored_statistics_keep_their_parameters_other_axes():
    """Adafactor keeps, per matrix, a row and a column statistic (the matrix's shape less one
    dimension) and (1,) placeholders: each takes the parameter's spec less the dropped dimension,
    where Adam's moments take it whole. (t5_1_1_small's init failed on a rank-2 spec for a rank-1
    statistic before.)"""
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding

    from pax_eqx.sharding.rules import opt_state_shardings

    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 4, 2)))
    params = {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32), "b": jax.ShapeDtypeStruct((512,), jnp.float32)}
    p_sh = {"w": NamedSharding(mesh, P("fsdp", "tensor")), "b": NamedSharding(mesh, P("tensor"))}
    factored = {((256,), ("fsdp",)), ((512,), ("tensor",)), ((1,), ())}  # w's row and column; b's placeholders
    whole = {((256, 512), ("fsdp", "tensor")), ((512,), ("tensor",))}
    for optimizer, expected in [
        (optax.adafactor(1e-3, min_dim_size_to_factor=128), factored),
        (optax.adamw(1e-3), whole),
    ]:
        state = jax.eval_shape(optimizer.init, params)
        shardings = opt_state_shardings(optimizer, state, params, p_sh, mesh)
        leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
        pairs = list(zip(jax.tree.leaves(state), leaves))
        assert expected <= {(a.shape, tuple(s.spec)) for a, s in pairs}
        for a, s in pairs:
            jax.device_put(jnp.zeros(a.shape, a.dtype), s)  # every sharding fits its leaf
