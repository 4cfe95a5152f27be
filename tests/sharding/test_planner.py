"""The dry-run planner's memory estimate against memory measured on a GPU.

Peak memory of `python -m benchmarks.mfu --exp NAME [override]` on one H100 80GB (jax 0.11.2,
`peak_bytes_in_use` in GiB; docs/performance.md, "H100"). The planner knows nothing of XLA's
buffer assignment; its formula (pax_eqx/models/lm_plan.py) must still land within 6% of
what XLA allocated, so that "fits" means fits.
"""

import pytest

from experiments import registry
from pax_eqx.models.lm_plan import flash_attention
from pax_eqx.programs.plan.dry_run import plan

MEASURED_H100_GIB = [
    ("gpt3_xl", {}, 54.3),
    ("gpt3_xl_unrolled", {}, 55.9),
    ("gpt3_xl_unrolled", {"batch": 8}, 37.6),
    ("gpt3_xl_unrolled", {"batch": 20}, 65.0),
    ("gpt3_xl_unrolled", {"remat": "full"}, 31.9),
]


@pytest.mark.parametrize("name, change, measured", MEASURED_H100_GIB, ids=lambda v: str(v))
def test_planned_memory_is_within_6_percent_of_the_h100_peak(name, change, measured):
    exp = registry.load_experiment(name)
    if "batch" in change:
        exp = exp.replace(data=exp.data.replace(train=exp.data.train.replace(batch_size=change["batch"])))
    if "remat" in change:
        exp = exp.replace(model=exp.model.replace(remat_policy=change["remat"]))
    assert flash_attention(exp.model, exp.train.fprop_dtype)  # bf16, head dim 128: cuDNN on the H100, no S x S scores
    planned = plan(exp, device_memory_gb=80.0).total_bytes / 1024**3
    assert planned == pytest.approx(measured, rel=0.06)


def test_attention_in_xla_adds_the_scores():
    exp = registry.load_experiment("gpt3_xl")
    xla = exp.replace(
        model=exp.model.replace(block=exp.model.block.replace(attention=exp.model.block.attention.replace(
            implementation="xla")))
    )  # fmt: skip
    assert not flash_attention(xla.model, xla.train.fprop_dtype)
    scores = 16 * 16 * 2048 * 2048 * 4  # batch x heads x S x S float32, one array of one layer's
    # the backward of one layer holds 4 of them (logits, probabilities and their gradients; lm_plan.LAYER_SCORES)
    assert plan(xla).total_bytes - plan(exp).total_bytes == 4 * scores
