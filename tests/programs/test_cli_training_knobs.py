"""Pax's training knobs through the command line: frozen variables and early stopping together,
and decoding during training.

Early stopping with min_delta 10 never sees an improvement, so with patience 2 the evals at steps
3 (the first, the best), 6 and 9 stop the run at step 9. It is first run to step 6 only, then
resumed with more steps: it must still stop at 9 (the patience counter survived the restart), save
a checkpoint there, say why, exit 0, and a rerun must not train on."""

import json
import struct

import jax
import numpy as np
import pytest
from tiny import tiny_args

from pax_eqx import train
from pax_eqx.checkpoint import Checkpointer
from pax_eqx.command_line import cli
from pax_eqx.learners.optimizer_configs import SgdConfig
from pax_eqx.learners.variables import param_names
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


def _text_events(directory) -> dict[tuple[str, int], str]:
    """{(tag, step): text} of the TensorBoard text summaries in `directory`."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12 : offset + 12 + length])
            offset += 16 + length
            for value in event.summary.value:
                if value.tensor.string_val:
                    out[(value.tag, event.step)] = value.tensor.string_val[0].decode()
    return out


def test_decoding_during_training_logs_samples_to_metrics_and_tensorboard(tmp_path, capsys):
    job = tmp_path / "job"
    args = tiny_args(job, "--train.decode-interval-steps", "3", "--decode.num-samples", "2")
    assert train.main(args) == 0
    out = capsys.readouterr().out
    assert "step 3: decoding (train.decode_interval_steps):" in out
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    decoded = [r for r in rows if r["split"] == "decode"]
    assert [r["step"] for r in decoded] == [3, 6]
    assert all(len(r["samples"]) == 2 and r["samples"][0].startswith("ROMEO:") for r in decoded)
    texts = _text_events(job / "summaries" / "decode")
    assert {step for _, step in texts} == {3, 6} and len(texts) == 4
    assert texts[next(k for k in texts if k[1] == 6 and k[0].startswith("samples/0"))] == decoded[1]["samples"][0]


def test_decoding_during_training_needs_a_model_that_decodes():
    from pax_eqx.command_line import registry
    from pax_eqx.config import ConfigError

    exp = registry.load_experiment("digits_mlp")
    exp = exp.replace(train=exp.train.replace(decode_interval_steps=10))
    with pytest.raises(ConfigError, match=r"train.decode_interval_steps=10, but the model .* does not decode"):
        exp.validate(data_files=False)


def test_variable_groups_and_frozen_variables_train_sharded_and_plan(tmp_path):
    """Per-variable groups hold optax's masked states: the sharded train step, a checkpoint round
    trip and the dry-run planner all take them."""
    from pax_eqx.learners.optimizers import VariableGroupConfig
    from pax_eqx.programs.plan.dry_run import plan

    exp, _, _ = cli.parse(tiny_args(tmp_path / "job"), "test", "test")
    groups = (VariableGroupConfig(pattern=r".*norm.*", lr_multiplier=0.1, optimizer=SgdConfig()),)
    exp = exp.replace(learner=exp.learner.replace(variable_groups=groups, frozen=(r"embedding\.w",)))
    (tmp_path / "job").mkdir()
    rt = Runtime.create(exp, tmp_path / "job", log=lambda *a: None)
    state = rt.programs.init_state(1)
    before = np.asarray(state.params.embedding.w)
    for _ in range(2):
        state, out = rt.programs.train_step(state, rt.programs.global_batch(rt.input("train").get_next()))
    assert np.isfinite(float(out.metrics["total_loss"].value))
    assert np.asarray(state.params.embedding.w).tobytes() == before.tobytes()
    ckpt = Checkpointer(tmp_path / "job" / "checkpoints")
    ckpt.save(2, state, {}, force=True)
    ckpt.wait_until_finished()
    step, restored, _ = ckpt.restore(rt.programs.abstract_with_shardings(), restore_data=False)
    ckpt.close()
    assert step == 2
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert plan(exp).total_bytes > 0
