"""Every Paxml 1.4 experiment has a dry-run plan on its own mesh and the hardware it was written
for, and docs/experiments.md's table of them is the one the planner prints today.

The planner runs over all 90 (shapes only: nothing compiled, no device), through the script
that writes the docs' table (benchmarks/paxml_plans.py).
"""

from __future__ import annotations

import functools

import pytest

from benchmarks import paxml_plans
from pax_eqx.sharding.device_kinds import DEVICE_KINDS


@functools.cache
def rows() -> tuple[paxml_plans.PlanRow, ...]:
    return tuple(paxml_plans.plan_row(cls, module) for cls, module in paxml_plans.paxml_classes().items())


def test_every_paxml_experiment_is_planned_on_the_hardware_it_was_written_for():
    planned = rows()
    assert len(planned) == 90
    for row in planned:
        assert row.params > 0 and row.memory_gib > 0, row
        assert row.device_kind in DEVICE_KINDS, f"{row.paxml_class}: mesh.device_kind is not set"
        assert row.fits is not None, f"{row.paxml_class}: no verdict (the kind's memory was not used)"
    kinds = {r.paxml_class: r.device_kind for r in planned}
    assert kinds["NVIDIA5B"] == "h100" and kinds["C4Spmd32BAdam1xv5_256"] == "tpu_v5e"
    assert kinds["LmCloudSpmdPipeline175B"] == "a100" and kinds["C4SpmdAdam"] == "tpu_v4"


def test_the_docs_table_is_the_planners():
    """Regenerate with `python -m benchmarks.paxml_plans --write` when an experiment or the
    planner changes."""
    doc = paxml_plans.DOC.read_text()
    start, end = doc.index(paxml_plans.BEGIN), doc.index(paxml_plans.END) + len(paxml_plans.END)
    assert doc[start:end] == paxml_plans.markdown(list(rows())), (
        "docs/experiments.md's table of Paxml plans is stale: run python -m benchmarks.paxml_plans --write"
    )


@pytest.mark.parametrize("flag", ["--dry-run-device-memory-gb 16", ""])
def test_a_given_memory_overrides_the_kinds(flag, capsys):
    """`--dry-run` alone judges against the experiment's accelerator (TPU v4: 32 GiB); a memory
    given on the command line wins."""
    from pax_eqx import train

    argv = ["--exp", "BertAdamL4H128", "--data.source", "synthetic", "--dry-run", *flag.split()]
    assert train.main(argv) == 0
    out = capsys.readouterr().out
    assert "512 devices" not in out and "of TPU v4 (mesh.device_kind)" in out
    assert f"fits in {16 if flag else 32} GiB per device" in out
