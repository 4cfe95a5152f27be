"""Read-only Checkpointers (eval, decode beside a trainer), the step a checkpoint claims, the
data state's checksum, and a directory that cannot be written.

A reader must never create, delete or rename anything in the directory (a CheckpointManager
deletes the trainer's `*.orbax-checkpoint-tmp*` save in progress when it opens); it reads the
newest committed step, and if the trainer's keep-N deletes it meanwhile, the newest again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from ckpt_states import abstract, assert_same, make_state

from pax_eqx.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointSaveError,
)
from pax_eqx.checkpoint.integrity import manifest_digest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def data(step: int) -> dict:
    return {"next_index": 12 * step, "epoch": step - 1, "seed": 3}


def saved(directory: Path, steps=(1, 2), **cfg) -> None:
    ckpt = Checkpointer(directory, CheckpointConfig(**cfg))
    for step in steps:
        ckpt.save(step, make_state(step), data(step), force=True)
    ckpt.close()


def restore(directory: Path, **kw):
    ckpt = Checkpointer(directory, CheckpointConfig(), read_only=kw.pop("read_only", False))
    try:
        return ckpt.restore(abstract(make_state(0)), **kw)
    finally:
        ckpt.close()


def listing(directory: Path) -> dict[str, int]:
    """Every path under `directory` with its size and mtime: what a reader must leave unchanged."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


def rewrite_manifest(directory: Path, step: int, change, *, reseal: bool = True) -> None:
    file = directory / str(step) / "manifest" / "metadata"
    manifest = json.loads(file.read_text())
    change(manifest)
    if reseal:
        manifest["sha256"] = manifest_digest(manifest)
    file.write_text(json.dumps(manifest))


def fallback_message(directory: Path, **kw) -> tuple[int, str]:
    with pytest.warns(CheckpointFallbackWarning) as caught:
        step, state, data_state = restore(directory, **kw)
    assert_same(state, make_state(step))
    assert data_state == data(step)
    return step, " | ".join(str(w.message) for w in caught)


# ---------------------------------------------------------------------------- read-only


def test_a_reader_leaves_the_directory_untouched(tmp_path):
    saved(tmp_path, steps=(1, 2, 3))
    torn = tmp_path / "4.orbax-checkpoint-tmp-1234"  # a trainer's save in progress
    torn.mkdir()
    (torn / "partial").write_text("half a checkpoint")
    shutil.rmtree(tmp_path / "3" / "state")  # damaged: the reader skips it but does not set it aside
    before = listing(tmp_path)
    step, message = fallback_message(tmp_path, read_only=True)
    assert step == 2 and f"checkpoint {tmp_path / '3'} is unreadable" in message
    assert listing(tmp_path) == before


def test_a_reader_of_a_missing_directory_creates_nothing_and_cannot_save(tmp_path):
    reader = Checkpointer(tmp_path / "missing", CheckpointConfig(), read_only=True)
    assert reader.latest_step() is None
    with pytest.raises(CheckpointError, match="read-only"):
        reader.save(1, make_state(1), force=True)
    reader.close()
    assert not (tmp_path / "missing").exists()


def test_a_reader_retries_when_the_trainer_deletes_the_checkpoint_it_reads(tmp_path, monkeypatch):
    saved(tmp_path, steps=(1, 2, 3))
    real = Checkpointer._restore_step
    deleted = []

    def keep_n_strikes_mid_read(self, step, abstract_state, restore_data):
        if step == 3 and not deleted:  # the trainer commits 4 and deletes 3 while we read 3
            shutil.copytree(tmp_path / "3", tmp_path / "4")
            rewrite_manifest(tmp_path, 4, lambda m: m.update(step=4))
            shutil.rmtree(tmp_path / "3")
            deleted.append(3)
        return real(self, step, abstract_state, restore_data)

    monkeypatch.setattr(Checkpointer, "_restore_step", keep_n_strikes_mid_read)
    with pytest.warns(CheckpointFallbackWarning, match="was deleted while it was being read") as caught:
        step, state, data_state = restore(tmp_path, read_only=True)
    assert step == 4 and data_state == data(3)  # the newest committed one, read afresh
    assert_same(state, make_state(3))
    assert not any("unreadable" in str(w.message) for w in caught)


# ----------------------------------------------------------------------- the claimed step


def test_a_step_directory_renamed_over_another_is_a_damaged_checkpoint(tmp_path):
    saved(tmp_path, steps=(1, 2))
    shutil.copytree(tmp_path / "2", tmp_path / "3")  # claims step 3, holds step 2
    step, message = fallback_message(tmp_path)
    assert step == 2
    assert "its directory is step 3 but its manifest was written for step 2" in message
    assert any(p.name.startswith("3.unreadable-") for p in tmp_path.iterdir())  # the trainer sets it aside


def test_a_state_whose_step_disagrees_with_the_manifest_is_a_damaged_checkpoint(tmp_path):
    saved(tmp_path, steps=(1, 2))
    rewrite_manifest(tmp_path, 2, lambda m: m.update(state_step=m["state_step"] + 1))
    step, message = fallback_message(tmp_path)
    assert step == 1 and "the restored state's step is 20, its manifest says 21" in message


def test_a_damaged_manifest_falls_back_instead_of_blaming_the_model(tmp_path):
    """A shape digit damaged in the manifest would otherwise read as 'a different model' (exit 2)."""
    saved(tmp_path, steps=(1, 2))
    rewrite_manifest(tmp_path, 2, lambda m: m["leaves"][1].update(shape=[9, 16]), reseal=False)
    step, message = fallback_message(tmp_path)
    assert step == 1 and "its manifest does not match its own checksum" in message


def test_a_damaged_data_iterator_state_is_caught_by_its_checksum(tmp_path):
    """Valid JSON with a wrong position would silently resume at another batch."""
    saved(tmp_path, steps=(1, 2))
    (file,) = (tmp_path / "2" / "data").glob("process_*.json")
    file.write_text(file.read_text().replace('"next_index": 24', '"next_index": 25'))
    step, message = fallback_message(tmp_path)
    assert step == 1 and "the data iterator state of process 0 differs from the checksum" in message
    # Without the data state (eval, decode), the checkpoint is fine.
    step, state, data_state = restore(tmp_path, restore_data=False, read_only=True)
    assert step == 1 and data_state is None  # step 2 was set aside by the fallback above


def test_manifests_without_the_new_fields_still_restore(tmp_path):
    """Checkpoints written before the step, data and manifest digests existed."""
    saved(tmp_path, steps=(1,))
    rewrite_manifest(tmp_path, 1, lambda m: [m.pop(k) for k in ("state_step", "data_sha256", "sha256")], reseal=False)
    step, state, data_state = restore(tmp_path)
    assert step == 1 and data_state == data(1)
    assert_same(state, make_state(1))


# -------------------------------------------------------------- a directory that cannot be written


def _make_unwritable(directory: Path) -> None:
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a file system without chattr +i")
    else:
        directory.chmod(0o555)


def _make_writable(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
    directory.chmod(0o755)


@pytest.mark.parametrize("async_save", [True, False])
def test_an_unwritable_directory_fails_the_save_at_once_and_keeps_the_previous_one(tmp_path, async_save):
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=async_save))
    ckpt.save(1, make_state(1), data(1), force=True)
    ckpt.wait_until_finished()
    _make_unwritable(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(CheckpointSaveError) as info:
            ckpt.save(2, make_state(2), data(2), force=True)
        assert time.monotonic() - start < 5
    finally:
        _make_writable(tmp_path)
    message = str(info.value)
    assert f"cannot write the checkpoint for step 2: the checkpoint directory {tmp_path} cannot be written" in message
    assert "Operation not permitted" in message or "Permission denied" in message
    assert "the previous checkpoint (step 1) is intact" in message
    ckpt.save(2, make_state(2), data(2), force=True)  # writable again: the same checkpointer goes on
    ckpt.close()
    assert restore(tmp_path)[0] == 2


def test_a_directory_replaced_by_a_file_fails_the_save_with_the_cause(tmp_path):
    directory = tmp_path / "ckpts"
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=False))
    shutil.rmtree(directory)
    directory.write_text("not a directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointSaveError, match=r"ckpts cannot be written \(File exists\)"):
            ckpt.save(1, make_state(1), data(1), force=True)
    directory.unlink()
    ckpt.close()
