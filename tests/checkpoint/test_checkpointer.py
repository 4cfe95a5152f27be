"""Checkpointer: round trips, keep-N, torn/corrupt/mismatched checkpoints, NaN refusal, disk full."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import equinox as eqx
import grain.checkpoint
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ckpt_states import abstract, assert_same, make_state, mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pax_eqx.checkpoint import (
    CheckpointConfig,
    CheckpointCorruptError,
    Checkpointer,
    CheckpointFallbackWarning,
    CheckpointMismatchError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    NoReadableCheckpointError,
)
from pax_eqx.checkpoint.integrity import manifest_digest

HERE = Path(__file__).parent

# Reading a damaged checkpoint leaves orbax/tensorstore futures whose exceptions nobody awaits;
# asyncio reports them when they are garbage collected ("Future exception was never retrieved",
# "Event loop is closed"). That is orbax's noise, not a failure: keep it out of the test log.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


DATA_1 = {"next_index": 12, "epoch": 0, "seed": 3}
DATA_2 = {"next_index": 24, "epoch": 1, "seed": 3}


def saved(directory: Path, steps=(1, 2), **cfg) -> Checkpointer:
    """A checkpointer with `steps` saved (state seed = step, data state = DATA_<step>)."""
    ckpt = Checkpointer(directory, CheckpointConfig(**cfg))
    for step in steps:
        ckpt.save(step, make_state(step), {"next_index": 12 * step, "epoch": step - 1, "seed": 3}, force=True)
    ckpt.wait_until_finished()
    return ckpt


def restore(directory: Path, width: int = 8, **kw):
    ckpt = Checkpointer(directory, CheckpointConfig())
    try:
        return ckpt.restore(abstract(make_state(0, width=width)), **kw)
    finally:
        ckpt.close()


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_state_and_data(tmp_path, async_save):
    ckpt = saved(tmp_path, steps=(5,), async_save=async_save)
    step, state, data = ckpt.restore(abstract(make_state(0)))
    ckpt.close()
    assert step == 5
    assert_same(state, make_state(5))
    assert type(state) is type(make_state(0))
    assert data == {"next_index": 60, "epoch": 4, "seed": 3}
    # The data state sits in grain's per-process file, as grain writes it.
    assert json.loads((tmp_path / "5" / "data" / "process_0-of-1.json").read_text()) == data


def test_restore_a_given_step_and_without_data(tmp_path):
    saved(tmp_path, steps=(1, 2)).close()
    step, state, data = restore(tmp_path, step=1, restore_data=False)
    assert step == 1 and data is None
    assert_same(state, make_state(1))


def test_no_data_state_restores_as_none(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    ckpt.save(3, make_state(3), force=True)
    assert ckpt.restore(abstract(make_state(0)))[2] is None
    ckpt.close()


def test_data_state_must_be_json(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(TypeError, match="step 3 must be JSON"):
        ckpt.save(3, make_state(3), {"array": np.zeros(2)}, force=True)
    ckpt.close()
    assert ckpt.committed_steps() == []


def test_keeps_the_newest_n(tmp_path):
    ckpt = saved(tmp_path, steps=(1, 2, 3, 4), max_to_keep=2)
    assert ckpt.committed_steps() == [3, 4]
    assert ckpt.latest_step() == 4
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3", "4"]


def test_should_save_by_steps_and_by_time(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path, CheckpointConfig(every_n_steps=5, every_n_seconds=0))
    assert [s for s in range(1, 16) if ckpt.should_save(s)] == [5, 10, 15]
    assert not ckpt.save(7, make_state(7))  # not due, not forced: nothing written
    assert ckpt.save(10, make_state(10))
    assert not ckpt.save(10, make_state(10), force=True)  # already committed (e.g. the final save)
    ckpt.close()
    assert ckpt.committed_steps() == [10]

    clock = [1000.0]
    monkeypatch.setattr("pax_eqx.checkpoint.checkpointer.time.monotonic", lambda: clock[0])
    timed = Checkpointer(tmp_path / "timed", CheckpointConfig(every_n_steps=0, every_n_seconds=60))
    assert not timed.should_save(1)
    clock[0] += 59
    assert not timed.should_save(2)
    clock[0] += 2
    assert timed.should_save(3)
    timed.save(3, make_state(3))
    assert not timed.should_save(4)  # the interval restarts at each save
    clock[0] += 61
    assert timed.should_save(5)
    timed.close()


def test_latest_step_ignores_a_save_killed_midway(tmp_path):
    saved(tmp_path, steps=(1, 2)).close()
    # What a SIGKILL during the save of step 3 leaves behind (orbax's temporary name).
    torn = tmp_path / "3.orbax-checkpoint-tmp-1712345678901234"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "_METADATA").write_text("{not even json")
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    assert ckpt.latest_step() == 2
    step, state, data = ckpt.restore(abstract(make_state(0)))
    assert step == 2
    assert_same(state, make_state(2))
    ckpt.close()
    assert not torn.exists()  # and the leftover is cleaned up when the manager starts


def test_latest_step_counts_only_committed_steps_during_an_async_save(tmp_path):
    ckpt = saved(tmp_path, steps=(1,))
    ckpt.save(2, make_state(2), force=True)
    in_flight_dirs = [p.name for p in tmp_path.iterdir() if "tmp" in p.name]
    # Either the save is still writing into its tmp dir (then it must not count) or it is done.
    assert ckpt.latest_step() == (1 if in_flight_dirs else 2)
    ckpt.wait_until_finished()
    assert ckpt.latest_step() == 2
    ckpt.close()


def test_async_save_does_not_need_the_arrays_after_it_returns(tmp_path):
    """The train loop donates the state to the next step right after `save` returns."""
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    state = make_state(4)
    ckpt.save(4, state, force=True)
    for leaf in jax.tree.leaves(state):
        leaf.delete()
    ckpt.close()
    assert_same(restore(tmp_path)[1], make_state(4))


def _data_files(step_dir: Path) -> list[Path]:
    """The OCDBT files that hold the arrays' bytes (the big ones)."""
    return sorted((step_dir / "state" / "d").iterdir(), key=lambda p: -p.stat().st_size)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _overwrite(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: _truncate(_data_files(d)[0]), id="truncated-array-file"),
        pytest.param(lambda d: _overwrite(_data_files(d)[0]), id="overwritten-array-file"),
        pytest.param(lambda d: _truncate(d / "state" / "_METADATA"), id="truncated-orbax-metadata"),
        pytest.param(lambda d: _overwrite(d / "manifest" / "metadata"), id="overwritten-manifest"),
        pytest.param(lambda d: (d / "data" / "process_0-of-1.json").write_text("{"), id="torn-data-state"),
    ],
)
def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path, damage):
    saved(tmp_path, steps=(1, 2)).close()
    damage(tmp_path / "2")
    with pytest.warns(CheckpointFallbackWarning) as caught:
        step, state, data = restore(tmp_path)
    # Only the fallback's own warnings: `caught` also records any other warning of the moment
    # (orbax's "coroutine ... was never awaited", when the collector happens to run here).
    fallbacks = [w for w in caught if issubclass(w.category, CheckpointFallbackWarning)]
    assert [str(w.message).split(" (")[0].split(" aside")[0] for w in fallbacks] == [
        f"checkpoint {tmp_path / '2'} is unreadable",
        f"set the unreadable checkpoint {tmp_path / '2'}",
    ]
    assert step == 1
    assert_same(state, make_state(1))
    assert data == DATA_1


def test_after_a_fallback_the_unreadable_steps_are_set_aside_and_can_be_saved_again(tmp_path):
    saved(tmp_path, steps=(1, 2, 3), max_to_keep=3).close()
    _overwrite(_data_files(tmp_path / "2")[0])
    _overwrite(_data_files(tmp_path / "3")[0])
    ckpt = Checkpointer(tmp_path, CheckpointConfig(max_to_keep=2))
    with pytest.warns(CheckpointFallbackWarning) as caught:
        step, state, data = ckpt.restore(abstract(make_state(0)))
    assert step == 1
    messages = [str(w.message) for w in caught]
    assert sum("falling back" in m for m in messages) == 2
    assert any(f"set the unreadable checkpoint {tmp_path / '3'} aside as 3.unreadable-" in m for m in messages)
    assert ckpt.committed_steps() == [1]
    # The resumed run writes steps 2 and 3 again; keep-N counts only these readable checkpoints.
    for step in (2, 3):
        assert ckpt.save(step, make_state(10 + step), force=True)
    ckpt.close()
    assert ckpt.committed_steps() == [2, 3]
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["2", "2.unreadable", "3", "3.unreadable"]
    assert_same(restore(tmp_path)[1], make_state(13))


def test_bytes_that_decode_to_wrong_numbers_are_caught_by_the_checksum(tmp_path):
    """A rewritten checksum stands for any damage that still decodes: the arrays are rejected."""
    saved(tmp_path, steps=(1, 2)).close()
    manifest_file = tmp_path / "2" / "manifest" / "metadata"
    manifest = json.loads(manifest_file.read_text())
    entry = next(e for e in manifest["leaves"] if e["path"] == "params/w")
    entry["checksum"] = (entry["checksum"] + 1) % 2**32
    manifest["sha256"] = manifest_digest(manifest)  # resealed: the manifest itself looks intact
    manifest_file.write_text(json.dumps(manifest))
    with pytest.warns(CheckpointFallbackWarning) as caught:
        step, _, _ = restore(tmp_path)
    assert step == 1
    assert "1 restored arrays differ from the checksums written at save time: ['params/w']" in str(caught[0].message)


def test_single_bit_flips_never_restore_wrong_numbers(tmp_path):
    """Flip one bit at spread-out offsets of the array file: each restore is exact or falls back."""
    pristine = tmp_path / "pristine"
    saved(pristine, steps=(1, 2)).close()
    target = _data_files(pristine / "2")[0].relative_to(pristine)
    size = (pristine / target).stat().st_size
    outcomes = set()
    for offset in range(7, size, max(size // 12, 1)):
        trial = tmp_path / f"flip{offset}"
        shutil.copytree(pristine, trial)
        corrupted = bytearray((trial / target).read_bytes())
        corrupted[offset] ^= 0x10
        (trial / target).write_bytes(bytes(corrupted))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointFallbackWarning)
            step, state, _ = restore(trial)
        assert_same(state, make_state(step))
        outcomes.add(step)
    assert 1 in outcomes  # the damage was noticed at least once (else this test tests nothing)


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    saved(tmp_path, steps=(1, 2)).close()
    for step in (1, 2):
        _overwrite(_data_files(tmp_path / str(step))[0])
    with pytest.warns(CheckpointFallbackWarning):
        with pytest.raises(NoReadableCheckpointError, match="none of the 2 committed checkpoints") as info:
            restore(tmp_path)
    assert str(tmp_path / "1") in str(info.value) and str(tmp_path / "2") in str(info.value)


def test_an_explicit_unreadable_step_does_not_fall_back(tmp_path):
    saved(tmp_path, steps=(1, 2)).close()
    _overwrite(_data_files(tmp_path / "2")[0])
    with pytest.raises(CheckpointCorruptError, match=f"{tmp_path / '2'} is unreadable"):
        restore(tmp_path, step=2)
    with pytest.raises(NoReadableCheckpointError, match=r"no committed checkpoint for step 7.*\[1, 2\]"):
        restore(tmp_path, step=7)


def test_empty_directory(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpts", CheckpointConfig())
    assert ckpt.latest_step() is None
    with pytest.raises(NoReadableCheckpointError, match="no committed checkpoint in"):
        ckpt.restore(abstract(make_state(0)))
    ckpt.close()


def test_directory_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="is a file"):
        Checkpointer(tmp_path / "file", CheckpointConfig())


def test_shape_mismatch_names_the_leaf_and_both_shapes(tmp_path):
    saved(tmp_path, steps=(1,)).close()
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    wider = abstract(make_state(0, width=4))
    with pytest.raises(CheckpointMismatchError) as info:
        ckpt.restore(wider)
    message = str(info.value)
    assert "params/w: checkpoint has shape (8, 16), the model expects (4, 16)" in message
    assert "opt_state/0/mu/w: checkpoint has shape (8, 16), the model expects (4, 16)" in message
    assert "params/b" not in message
    ckpt.close()


def test_missing_extra_and_dtype_mismatched_leaves_are_named(tmp_path):
    saved(tmp_path, steps=(1,)).close()
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with_ema = abstract(make_state(0, ema=True))
    with pytest.raises(CheckpointMismatchError, match="ema/w: in the model but not in the checkpoint"):
        ckpt.restore(with_ema)
    base = abstract(make_state(0))
    params = dict(base.params)
    del params["b"]
    params["scale"] = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=params["scale"].sharding)
    changed = eqx.tree_at(lambda s: s.params, base, params)
    with pytest.raises(CheckpointMismatchError) as info:
        ckpt.restore(changed)
    assert "params/scale: checkpoint has dtype bfloat16, the model expects float32" in str(info.value)
    assert "params/b: in the checkpoint but not in the model" in str(info.value)
    ckpt.close()


def _with_value(x: jax.Array, index: int, value: float) -> jax.Array:
    host = np.array(x)
    host[index] = value
    return jax.device_put(host, x.sharding)


def test_refuses_to_save_nan_or_inf(tmp_path):
    ckpt = saved(tmp_path, steps=(1,))
    bad = make_state(2)
    bad = eqx.tree_at(lambda s: s.opt_state[0].mu["b"], bad, _with_value(bad.opt_state[0].mu["b"], 3, np.nan))
    bad = eqx.tree_at(lambda s: s.params["scale"], bad, _with_value(bad.params["scale"], 0, np.inf))
    with pytest.raises(NonFiniteCheckpointError) as info:
        ckpt.save(2, bad, DATA_2, force=True)
    message = str(info.value)
    assert "step 2" in message and "opt_state/0/mu/b" in message and "params/scale" in message
    assert "the newest checkpoint (step 1) is kept" in message
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # nothing else was written


def test_restore_onto_a_different_mesh(tmp_path):
    saved(tmp_path, steps=(3,)).close()  # saved sharded over a (1, 8) mesh
    other = mesh((2, 4))

    def resharded(x):
        if x.ndim == 2:
            return NamedSharding(other, P("data", "model"))
        return NamedSharding(other, P())

    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    step, state, _ = ckpt.restore(abstract(make_state(0), resharded))
    assert step == 3
    assert_same(state, make_state(3))
    w = state.params["w"]
    assert w.sharding == NamedSharding(other, P("data", "model"))
    assert {s.data.shape for s in w.addressable_shards} == {(4, 4)}
    assert state.params["b"].sharding.is_fully_replicated

    single = jax.sharding.SingleDeviceSharding(jax.devices()[5])
    _, on_one, _ = ckpt.restore(abstract(make_state(0), lambda x: single))
    assert_same(on_one, make_state(3))
    assert on_one.params["w"].devices() == {jax.devices()[5]}
    ckpt.close()


def test_restore_target_needs_shardings(tmp_path):
    saved(tmp_path, steps=(1,)).close()
    no_sharding = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_state(0))
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(ValueError, match="restore target leaf step has no sharding"):
        ckpt.restore(no_sharding)
    # Concrete arrays are accepted as the target: their shardings are used.
    assert ckpt.restore(make_state(0))[0] == 1
    ckpt.close()


@pytest.mark.parametrize("async_save", [True, False])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch, async_save):
    ckpt = saved(tmp_path, steps=(1,), max_to_keep=1, async_save=async_save)

    def no_space(self, directory, item=None, args=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    monkeypatch.setattr(grain.checkpoint.CheckpointHandler, "save", no_space)
    with pytest.raises(CheckpointSaveError, match=r"step 2 .* No space left on device.*previous checkpoint \(step 1\)"):
        ckpt.save(2, make_state(2), DATA_2, force=True)
        ckpt.wait_until_finished()
    monkeypatch.undo()
    ckpt.close()
    assert [p.name for p in tmp_path.iterdir() if p.name.isdigit()] == ["1"]
    step, state, data = restore(tmp_path)
    assert step == 1 and data == DATA_1
    assert_same(state, make_state(1))


def test_a_real_write_failure_keeps_the_previous_checkpoint(tmp_path):
    """A subprocess whose file-size limit makes tensorstore's own writes fail (EFBIG) in the
    background thread of an async save."""
    env = dict(os.environ, PYTHONPATH=f"{HERE}:{HERE.parent.parent}", JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, str(HERE / "write_failure_worker.py"), str(tmp_path), "1"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    message = result["message"]
    assert result["error"] == "CheckpointSaveError", message
    assert "step 2" in message and "File too large" in message, message
    assert "the previous checkpoint (step 1) is intact" in message, message
    step, state, _ = restore(tmp_path, width=256)
    assert step == 1
    assert_same(state, make_state(1, width=256))


def test_a_checkpoint_unreadable_for_its_permissions_stops_the_restore_and_is_left_in_place(tmp_path, monkeypatch):
    """EACCES is not damage: no fallback to an older step, nothing renamed aside, an error that
    says to fix the permissions. (Tests run as root, whom permissions do not stop, so the read
    fails as tensorstore reports it, by a stand-in for the restore of the newest step.)"""
    from pax_eqx.checkpoint.errors import CheckpointPermissionError

    saved(tmp_path, steps=(1, 2)).close()
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    read = ckpt._restore_step

    def denied(step, *args):
        if step == 2:
            raise ValueError(f'PERMISSION_DENIED: error opening "{tmp_path}/2/state/d/x": Permission denied')
        return read(step, *args)

    monkeypatch.setattr(ckpt, "_restore_step", denied)
    with pytest.raises(CheckpointPermissionError, match=r"checkpoint .*2 cannot be read: .*Fix the permissions"):
        ckpt.restore(abstract(make_state(0)))
    ckpt.close()
    assert ckpt.committed_steps() == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_keep_n_renames_an_old_step_aside_before_deleting_it(tmp_path, monkeypatch):
    """A kill -9 while keep-N deletes an old step must not leave a half-deleted step directory:
    the step is renamed into deleting/ in one rename, and the files are deleted there."""
    monkeypatch.setattr(Checkpointer, "_empty_deleting", lambda self: None)  # stop before the deletion
    ckpt = saved(tmp_path, steps=(1, 2), max_to_keep=1)
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "deleting"]
    assert (tmp_path / "deleting" / "1" / "state").is_dir()  # moved whole, not yet deleted
    monkeypatch.undo()

    # as a kill -9 in the middle of the deletion leaves it: some files of step 1 gone
    shutil.rmtree(tmp_path / "deleting" / "1" / "state")
    step, state, data = restore(tmp_path)  # the half-deleted directory is not a step
    assert step == 2
    assert_same(state, make_state(2))
    reopened = Checkpointer(tmp_path, CheckpointConfig(max_to_keep=1))
    assert not (tmp_path / "deleting").exists()  # the next writer empties it
    reopened.save(3, make_state(3), DATA_1, force=True)
    reopened.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3"]
