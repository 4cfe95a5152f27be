"""Pax's training knobs through the command line: frozen variables and early stopping together.

Early stopping with min_delta 10 never sees an improvement, so with patience 2 the evals at steps
3 (the first, the best), 6 and 9 stop the run at step 9. It is first run to step 6 only, then
resumed with more steps: it must still stop at 9 (the patience counter survived the restart), save
a checkpoint there, say why, exit 0, and a rerun must not train on."""

import json

import jax
import numpy as np
from tiny import tiny_args

from pax_eqx import train
from pax_eqx.checkpoint import Checkpointer
from pax_eqx.learners.variables import param_names
from pax_eqx.programs import cli
from pax_eqx.programs.runtime import Runtime

KNOBS = (
    "--learner.frozen", r"stack\.layers\.0\.attention\..*",
    "--train.early-stopping.metric", "total_loss", "--train.early-stopping.patience", "2",
    "--train.early-stopping.min-delta", "10",
)  # fmt: skip


def _params(job, args, step) -> dict[str, np.ndarray]:
    exp, _, _ = cli.parse(args, "test", "test")
    rt = Runtime.create(exp, job, log=lambda *a: None)
    reader = Checkpointer(job / "checkpoints", read_only=True)
    _, state, _ = reader.restore(rt.programs.abstract_with_shardings(), step, restore_data=False)
    reader.close()
    leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    return dict(zip(param_names(state.params), leaves, strict=True))


def test_frozen_variables_and_early_stopping_through_a_restart(tmp_path, capsys):
    job = tmp_path / "job"
    args = tiny_args(job, *KNOBS)
    assert train.main([*args, "--train.num-steps", "6"]) == 0
    capsys.readouterr()
    assert train.main([*args, "--train.num-steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "Resuming" in out and "step 6" in out
    assert "Stopping early at step 9: eval total_loss has not improved by more than 10 for 2 evals" in out
    assert "(train.early_stopping); saved a checkpoint." in out
    steps = sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 9
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 9
    # A rerun does not train on.
    assert train.main([*args, "--train.num-steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "stopped early at step 9" in out and "nothing to do" in out
    # The frozen attention kept its bits from step 3 to step 9; the rest trained.
    at3, at9 = _params(job, args, 3), _params(job, args, 9)
    frozen = [n for n in at3 if n.startswith("stack.layers.0.attention.")]
    assert frozen
    for name in at3:
        same = at3[name].tobytes() == at9[name].tobytes()
        assert same == (name in frozen), name
