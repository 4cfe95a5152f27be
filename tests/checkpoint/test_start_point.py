"""A step-0 checkpoint without data positions (an import) is a start point: a fine-tuning run
reads its parameters and non-trainable state alone, into a state whose optimizer differs."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from ckpt_states import abstract, assert_same, make_state

from pax_eqx.checkpoint import CheckpointConfig, Checkpointer, CheckpointMismatchError
from pax_eqx.checkpoint.start_point import restore_start_point, start_point_manifest


def _save(directory, steps, data=None):
    ckpt = Checkpointer(directory, CheckpointConfig())
    for step in steps:
        ckpt.save(step, make_state(step // 10), data, force=True)
    ckpt.wait_until_finished()
    ckpt.close()
    return Checkpointer(directory, read_only=True).committed_steps()


def test_parameters_are_read_into_a_state_with_another_optimizer(tmp_path):
    committed = _save(tmp_path, (0,))
    manifest = start_point_manifest(tmp_path, committed)
    assert manifest is not None
    saved = make_state(0)
    # The fine-tuning run's learner keeps no moments (SGD): its optimizer state is another tree.
    run_state = eqx.tree_at(lambda s: s.opt_state, make_state(0), (jnp.zeros((), jnp.int32),))
    read = restore_start_point(tmp_path, manifest, abstract(run_state))
    assert set(read) == {"params", "nt_state"}
    assert_same(read["params"], saved.params)
    assert_same(read["nt_state"], saved.nt_state)
    for ours, wanted in zip(jax.tree.leaves(read["params"]), jax.tree.leaves(saved.params), strict=True):
        assert ours.sharding == wanted.sharding  # read straight into the run's shardings


def test_only_a_lone_step_0_without_data_is_a_start_point(tmp_path):
    assert start_point_manifest(tmp_path / "a", _save(tmp_path / "a", (0, 10))) is None  # trained past it
    assert start_point_manifest(tmp_path / "b", _save(tmp_path / "b", (10,))) is None
    assert start_point_manifest(tmp_path / "c", _save(tmp_path / "c", (0,), {"next_index": 3})) is None  # trained data
    assert start_point_manifest(tmp_path / "d", []) is None


def test_another_model_is_refused_with_the_leaf_and_both_shapes(tmp_path):
    manifest = start_point_manifest(tmp_path, _save(tmp_path, (0,)))
    wider = make_state(0, width=12)
    with pytest.raises(CheckpointMismatchError, match=r"params/w: checkpoint has shape \(8, 16\), the model expects"):
        restore_start_point(tmp_path, manifest, abstract(wider))


def test_damaged_parameter_bytes_are_noticed(tmp_path):
    manifest = start_point_manifest(tmp_path, _save(tmp_path, (0,)))
    leaf = next(e for e in manifest["leaves"] if e["path"] == "params/b")
    leaf["checksum"] = (leaf["checksum"] + 1) % (1 << 32)
    with pytest.raises(Exception, match="differ from the checksums"):
        restore_start_point(tmp_path, manifest, abstract(make_state(0)))


def test_fine_tuning_may_change_the_learner_and_data_but_not_the_model_or_tokenizer(tmp_path):
    from experiments.registry import load_experiment
    from pax_eqx.data.tokenizers import TokenizerJsonConfig
    from pax_eqx.job.job_dir import JobDirError, check_config, write_config

    saved = load_experiment("shakespeare_char")
    write_config(tmp_path, saved.to_dict())
    tuned = saved.replace(
        learner=saved.learner.replace(learning_rate=1e-5), data=saved.data.replace(seq_len=saved.data.seq_len // 2)
    )
    changed = check_config(tmp_path, tuned.to_dict(), False, start_point=True)
    assert {c.split(":")[0] for c in changed} == {"learner.learning_rate", "data.seq_len"}
    with pytest.raises(JobDirError, match="learner.learning_rate"):  # a resumed run keeps its learner
        check_config(tmp_path, tuned.to_dict(), False)
    tokenizer = TokenizerJsonConfig(path="tok.json", eos_token="</s>")
    with pytest.raises(JobDirError, match=r"data\.tokenizer"):
        check_config(
            tmp_path, saved.replace(data=saved.data.replace(tokenizer=tokenizer)).to_dict(), False, start_point=True
        )
    with pytest.raises(JobDirError, match=r"model\.num_layers"):
        check_config(
            tmp_path, saved.replace(model=saved.model.replace(num_layers=1)).to_dict(), False, start_point=True
        )
