"""The dry run's per-device memory against XLA's own, checked against XLA:CPU.

For each configuration the real train step (`Programs.train_step`: the run's own jit with its state
and batch shardings and donation) is lowered on the 8 fake CPU devices and compiled, not run; XLA's
`memory_analysis()` gives the per-device bytes of its arguments (parameters, optimizer state,
batch), outputs not aliased to them, and temporaries (gradients, activations, collectives' buffers).
The planner (`dry_run.plan`) must land within 25% of their sum for every configuration; the median
error is printed (`pytest -s`) and recorded in docs/sharding.md.

Shapes: a scanned stack (`repeat`) of width 512 on 64-token rows and float32, so that the arrays --
parameters, Adam's moments, gradients and the saved activations -- are tens of MiB a device and XLA's
fixed buffers do not decide the ratio; attention is XLA's (no cuDNN on a CPU), which the planner
knows (`attention.implementation xla`).
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import pytest

from experiments import registry
from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.plan.dry_run import plan
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.mesh import build_mesh
from pax_eqx.sharding.rules import batch_sharding

TOLERANCE = 0.25


def lm(name: str = "shakespeare_char", mesh=(1, 8, 1), remat="full", micro=1, chunk=0, batch=32, layers=4, **model):
    exp = registry.load_experiment(name)
    m = exp.model
    attention = m.block.attention.replace(implementation="xla")
    m = m.replace(
        repeat=True, num_layers=layers, model_dims=512, hidden_dims=2048, num_heads=8, vocab_size=2048,
        max_seq_len=64, remat_policy=remat, loss_chunk_size=chunk, block=m.block.replace(attention=attention), **model,
    )  # fmt: skip
    return exp.replace(
        model=m,
        mesh=exp.mesh.replace(ici_mesh_shape=mesh),
        learner=exp.learner.replace(num_microbatches=micro),
        data=exp.data.replace(seq_len=64, train=exp.data.train.replace(batch_size=batch)),
        train=exp.train.replace(fprop_dtype="float32"),
    )


CONFIGS = {
    "data 8, remat full": lm(mesh=(8, 1, 1)),
    "data 4 tensor 2": lm(mesh=(4, 1, 2)),
    "data 2 tensor 4, dots_with_no_batch_dims": lm(mesh=(2, 1, 4), remat="dots_with_no_batch_dims_saveable"),
    "tensor 8": lm(mesh=(1, 1, 8)),
    "data 2 fsdp 2 tensor 2": lm(mesh=(2, 2, 2)),
    "data 8, remat none": lm(mesh=(8, 1, 1), remat="none"),
    "data 8, save_qkv_context_and_out_proj": lm(mesh=(8, 1, 1), remat="save_qkv_context_and_out_proj"),
    "data 8, 2 microbatches": lm(mesh=(8, 1, 1), micro=2, batch=64),
    "data 8, loss chunk 16": lm(mesh=(8, 1, 1), chunk=16, batch=64),
    "MoE, 8 experts": lm("shakespeare_moe", mesh=(8, 1, 1), moe_hidden_dims=1024),
    # FSDP alone and the pipeline were strict xfails (-64%, -56%; circular -33%) while the compiled
    # step was not the planned layout: the layers put no sharding constraint on activations (FSDP
    # alone all-reduced whole-batch [tokens, hidden] activations on every device), and the pipeline's
    # backward kept one copy of a stage's weights per iteration. With sharding.activations and the
    # stage weights sliced where they are loop-invariant (GPipe) or inside each layer's remat
    # (circular), the plan counts what remains: a layer gathered over fsdp with its gradient, and a
    # pipeline's gradient sum of the stage weights.
    "fsdp 8 alone": lm(mesh=(1, 8, 1)),
    "pipelined, 2 stages x data 4": lm("shakespeare_pipelined", mesh=(2, 4, 1, 1), batch=64),
    "circular pipeline, 2 rounds": lm(
        "shakespeare_pipelined",
        mesh=(2, 4, 1, 1),
        batch=64,
        pipeline=PipelineConfig(num_stages=2, num_microbatches=4, circular_repeat=2),
    ),
}
ERRORS: dict[str, float] = {}


def xla_bytes(exp) -> int:
    """Per-device bytes XLA:CPU assigns the compiled train step: arguments + outputs not aliased
    to them (the donated state is) + temporaries."""
    mesh = build_mesh(exp.mesh)
    programs = Programs(build_task(exp), mesh, exp.mesh.rules)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        programs.abstract_state,
        programs.state_shardings,
    )
    rows = batch_sharding(mesh, exp.mesh.rules, 2)
    shape = (exp.data.train.batch_size, exp.data.seq_len)
    kinds = {"ids": jnp.int32, "labels": jnp.int32, "weights": jnp.float32, "segment_ids": jnp.int32,
             "segment_pos": jnp.int32}  # fmt: skip
    batch = {k: jax.ShapeDtypeStruct(shape, t, sharding=rows) for k, t in kinds.items()}
    m = programs.train_step.lower(state, batch).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_planned_memory_is_within_25_percent_of_xla_cpu(name):
    exp = CONFIGS[name]
    planned, compiled = plan(exp).total_bytes, xla_bytes(exp)
    error = planned / compiled - 1
    ERRORS[name] = error
    print(f"\n{name}: planned {planned / 2**20:.1f} MiB, XLA:CPU {compiled / 2**20:.1f} MiB, {error:+.1%}")
    assert abs(error) <= TOLERANCE, f"{name}: planned {planned:,} B vs XLA:CPU {compiled:,} B ({error:+.1%})"


def test_median_error_against_xla_cpu():
    """Runs after the configurations (same module, in order): the median of |planned / XLA - 1|."""
    if len(ERRORS) < len(CONFIGS):
        pytest.skip("run with the configurations (the whole file)")
    median = statistics.median(abs(e) for e in ERRORS.values())
    print(f"\nmedian |error| over {len(ERRORS)} configurations, checked against XLA:CPU: {median:.1%}")
    assert median <= TOLERANCE
