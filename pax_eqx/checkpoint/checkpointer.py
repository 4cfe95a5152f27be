"""Checkpointer: orbax's CheckpointManager with the guarantees a long run needs.

    ckpt = Checkpointer(job_dir / "checkpoints", CheckpointConfig(every_n_steps=1000))
    if ckpt.should_save(step):
        ckpt.save(step, train_state, data_iterator.get_state())
    step, train_state, data_state = ckpt.restore(abstract_state_with_shardings)

A step directory `DIR/<step>/` holds three orbax items:
    state/      the train state pytree (orbax StandardSave: OCDBT + zarr, one file set per host)
    manifest/   JSON: every leaf's path, shape, dtype and checksum (see `integrity.py`)
    data/       the data iterator's state, one JSON file per host (see `data_state.py`)

What orbax already guarantees, and we rely on: a step is written into
`DIR/<step>.orbax-checkpoint-tmp-<time>/` and renamed to `DIR/<step>/` only once every host has
written every item, so a kill mid-save (or a full disk) never produces a directory that looks
committed; old steps beyond `max_to_keep` are deleted only after the new one commits; all hosts
call save/restore and orbax coordinates them.

What this wrapper adds:
- refuses to write a state with NaN/Inf in any float leaf (error names the step and the leaves);
- `latest_step()` counts committed steps on disk only, never one still being written;
- restore checks the manifest first, so a checkpoint of a different model fails with the leaf
  path and both shapes, and checks the checksums after, so damaged bytes are noticed;
- a committed newest checkpoint that cannot be read is skipped with a warning naming it, and
  the next newest is tried; if none can be read the restore raises (a run never silently
  starts from scratch). Once an older one is restored, the unreadable ones are renamed
  `<step>.unreadable-<time>` (kept, but no longer steps), so the resumed run can write those
  steps again and keep-N does not count them;
- keep-N first renames an old step into `DIR/deleting/` (atomic), then the files are deleted
  there: a kill -9 during a deletion leaves no half-deleted step for a restore or keep-N to
  meet, and the next start empties `deleting/`;
- save failures (disk full, permissions) raise `CheckpointSaveError` naming the step and the
  directory; the previous checkpoint stays restorable. Before each save, process 0 creates and
  deletes a small file in the directory, so a directory that cannot be written (read-only,
  replaced by a file, no space left for a new entry) fails the save at once with the cause,
  instead of in orbax's background thread, whose failure would leave the save waiting for its
  signals until orbax's timeout (minutes);
- the manifest covers everything a restore reads (integrity.py): the arrays, each host's data
  iterator state, the manifest itself, and the step -- the directory's name, the manifest's
  step and the restored state's step must agree; any disagreement is a damaged checkpoint.

`Checkpointer(directory, cfg, read_only=True)` is for readers of a job dir that a trainer may
be writing at the same time (eval, decode). It opens no CheckpointManager -- a manager deletes
the `*.orbax-checkpoint-tmp*` directories it finds when it opens, which are the trainer's save
in progress -- and never creates, deletes or renames anything: it lists the committed step
directories and reads them with a plain orbax Checkpointer. If the trainer's keep-N deletes
the checkpoint being read, the restore tries the newest committed one again; a damaged
checkpoint is skipped with a warning but not set aside (that is the trainer's job).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import grain.checkpoint
import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from pax_eqx.checkpoint.config import CheckpointConfig
from pax_eqx.checkpoint.data_state import IteratorState, every_host_digest
from pax_eqx.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointMismatchError,
    CheckpointPermissionError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    NoReadableCheckpointError,
    listed,
    one_line,
    permission_denied,
)
from pax_eqx.checkpoint.integrity import (
    build_manifest,
    leaf_path,
    leaf_summaries,
    manifest_problems,
    nonfinite_paths,
    restored_problems,
    state_step,
    structure_mismatches,
)
from pax_eqx.sharding.distributed import all_hosts, from_process_0

_STATE, _MANIFEST, _DATA = "state", "manifest", "data"
_WRITE_CHECK = ".pax_eqx-write-check"
# keep-N renames an old step into this subdirectory (one atomic rename), and we empty it: a kill
# -9 in the middle of a deletion leaves a half-deleted directory here, never a half-deleted step.
_DELETING = "deleting"
# A reader retries when the trainer's keep-N deletes the checkpoint it reads; bounded, in case a
# trainer keeps committing and deleting faster than a restore can read.
_MAX_VANISHED = 20


def _with_shardings(abstract: Any) -> Any:
    """Array leaves -> ShapeDtypeStruct with their sharding; a leaf without one is an error."""

    def convert(path, leaf):
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
            raise ValueError(
                f"restore target leaf {leaf_path(path)} has no sharding; build the abstract state with "
                "jax.ShapeDtypeStruct(shape, dtype, sharding=...) for every leaf (e.g. "
                "Programs.abstract_with_shardings()), so arrays are restored straight onto their devices."
            )
        return leaf

    return jax.tree_util.tree_map_with_path(convert, abstract)


class Checkpointer:
    """Saves and restores (train state, data iterator state) under one directory; see module doc.

    Every host must call `save`, `restore`, `wait_until_finished` and `close` together, with the
    same step (they run collectives). `should_save` with a time interval is also collective.
    """

    def __init__(
        self, directory: str | os.PathLike, cfg: CheckpointConfig = CheckpointConfig(), *, read_only: bool = False
    ):
        self.directory = Path(directory).absolute()
        self.cfg = cfg
        self.read_only = read_only
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(f"checkpoint directory {self.directory} is a file; choose another --job-log-dir.")
        self._reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        self._last_save_time = time.monotonic()
        self._in_flight: int | None = None
        self._closed = False
        self._manager: ocp.CheckpointManager | None = None
        if read_only:
            return
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.max_to_keep or None,
            enable_async_checkpointing=cfg.async_save,
            cleanup_tmp_directories=True,  # drop the leftovers of saves that were killed
            todelete_subdir=_DELETING,
            create=True,
        )
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, options=options, item_names=(_STATE, _MANIFEST, _DATA)
            )
        except OSError as e:
            raise CheckpointError(
                f"cannot use checkpoint directory {self.directory}: {e}; check it is writable."
            ) from e
        self._empty_deleting()  # what a killed run left half deleted

    # ---------------------------------------------------------------- saving

    def should_save(self, step: int) -> bool:
        """Whether `step` is due: a multiple of `every_n_steps`, or `every_n_seconds` elapsed.

        The time test is decided by process 0 and broadcast, so all hosts agree (a host that
        saved alone would wait for the others forever); it is a small collective per call, and
        only runs when `every_n_seconds` is set.
        """
        if self.cfg.every_n_steps and step % self.cfg.every_n_steps == 0:
            return True
        if self.cfg.every_n_seconds:
            due = time.monotonic() - self._last_save_time >= self.cfg.every_n_seconds
            return bool(from_process_0(int(due)))
        return False

    def save(
        self,
        step: int,
        train_state: Any,
        data_state: dict[str, Any] | None = None,
        *,
        force: bool = False,
        config: dict[str, Any] | None = None,
    ) -> bool:
        """Starts writing `step` (async by default) and returns True; False if not due or done.

        Returns once the arrays have been copied off the devices, so the caller may donate or
        overwrite `train_state` right after. `config` (the experiment, JSON) goes into the
        manifest: `saved_config` reads it back when DIR/config.json is lost. Raises
        NonFiniteCheckpointError before writing anything if a float leaf holds NaN/Inf, and
        CheckpointSaveError if the write fails (here or, for an async save, at the next
        `save`/`wait_until_finished`).
        """
        if self._manager is None:
            raise CheckpointError(f"this Checkpointer of {self.directory} is read-only; it cannot save step {step}.")
        if not force and not self.should_save(step):
            return False
        self.wait_until_finished()
        if step in self.committed_steps():
            return False
        self._check_writable(step)
        entries = leaf_summaries(train_state)
        bad = nonfinite_paths(entries)
        if bad:
            latest = self.latest_step()
            kept = f"the newest checkpoint (step {latest}) is kept" if latest is not None else "nothing was written"
            raise NonFiniteCheckpointError(
                f"refusing to save the checkpoint for step {step}: NaN or Inf in {len(bad)} leaves of the train "
                f"state ({kept}):{listed(bad)}"
            )
        data_sha256 = None
        if data_state is not None:
            try:
                json.dumps(data_state)
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"data_state for step {step} must be JSON-serialisable (the iterator's get_state() dict); {e}"
                ) from None
            data_sha256 = every_host_digest(IteratorState(data_state).get_state())
        manifest = build_manifest(
            step,
            entries,
            has_data=data_state is not None,
            state_step=state_step(train_state),
            data_sha256=data_sha256,
            config=config,
        )
        items = {_STATE: ocp.args.StandardSave(train_state), _MANIFEST: ocp.args.JsonSave(manifest)}
        if data_state is not None:
            items[_DATA] = grain.checkpoint.CheckpointSave(IteratorState(data_state))
        try:
            self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        except (OSError, ValueError, RuntimeError) as e:
            self._in_flight = None
            raise self._save_error(step, e) from e
        self._in_flight = step
        self._last_save_time = time.monotonic()
        return True

    def _kept(self) -> str:
        latest = self.latest_step()
        if latest is None:
            return "no earlier checkpoint exists"
        return f"the previous checkpoint (step {latest}) is intact and will be restored"

    def _check_writable(self, step: int) -> None:
        """Process 0 creates, writes and deletes a small file in the directory (see module doc);
        every host raises CheckpointSaveError, naming the directory and the cause, if it could not."""
        error: OSError | None = None
        if jax.process_index() == 0:
            probe = self.directory / _WRITE_CHECK
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(probe, "wb") as f:
                    f.write(b"pax_eqx checks this directory is writable before each save\n")
                probe.unlink()
            except OSError as e:
                error = e
        if all_hosts(error is None):
            return
        cause = f"{error.strerror or type(error).__name__}" if error is not None else "it failed on process 0"
        raise CheckpointSaveError(
            f"cannot write the checkpoint for step {step}: the checkpoint directory {self.directory} cannot be "
            f"written ({cause}); nothing of step {step} was written, {self._kept()}. Make the directory writable "
            "(or free space) and rerun the same command."
        )

    def _save_error(self, step: int, cause: BaseException) -> CheckpointSaveError:
        kept = self._kept()
        return CheckpointSaveError(
            f"saving the checkpoint for step {step} in {self.directory} failed: {one_line(cause)}. "
            f"Its partial files are in a *.orbax-checkpoint-tmp* directory that restore ignores; {kept}. "
            "If the disk is full, free space (or lower checkpoint.max_to_keep) and rerun the same command."
        )

    def wait_until_finished(self) -> None:
        """Blocks until an async save has committed; raises CheckpointSaveError if it failed."""
        if self._manager is None:
            return
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            step, self._in_flight = self._in_flight, None
            raise self._save_error(step if step is not None else -1, e) from e
        self._in_flight = None
        self._empty_deleting()

    def _empty_deleting(self) -> None:
        """Deletes the old steps keep-N renamed into `deleting/` (process 0; the files are no
        longer steps, so a failure here costs disk space, not a checkpoint)."""
        if jax.process_index() == 0:
            shutil.rmtree(self.directory / _DELETING, ignore_errors=True)

    def close(self) -> None:
        """Waits for the last save, then releases orbax's threads. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._manager is None:
            return
        try:
            self.wait_until_finished()
        finally:
            self._manager.close()

    # ------------------------------------------------------------- restoring

    def committed_steps(self) -> list[int]:
        """Steps whose directories are committed on disk, oldest first (never a tmp dir)."""
        if not self.directory.is_dir():
            return []
        try:
            return sorted(ocp.path.step.checkpoint_steps(self.directory))
        except (FileNotFoundError, NotADirectoryError):  # deleted or replaced while it was listed
            return []

    def saved_config(self) -> tuple[int, dict[str, Any]] | None:
        """(step, experiment) from the newest committed checkpoint whose manifest holds one and
        is intact; None when none does (no checkpoint, or all written before configs were kept)."""
        for step in reversed(self.committed_steps()):
            try:
                restored = self._reader.restore(
                    self.directory / str(step), args=ocp.args.Composite(**{_MANIFEST: ocp.args.JsonRestore()})
                )
                manifest = restored[_MANIFEST]
            except Exception:  # noqa: BLE001 -- unreadable: the restore reports it; try an older one
                continue
            if isinstance(manifest, dict) and "config" in manifest and not manifest_problems(manifest, step):
                return step, manifest["config"]
        return None

    def latest_step(self) -> int | None:
        """The newest committed step, or None. A save still in flight does not count."""
        steps = self.committed_steps()
        return steps[-1] if steps else None

    def restore(
        self,
        abstract_train_state: Any,
        step: int | None = None,
        *,
        restore_data: bool = True,
    ) -> tuple[int, Any, dict[str, Any] | None]:
        """Returns (step, train_state, data_state) from the newest readable checkpoint (or `step`).

        `abstract_train_state` is a pytree of jax.ShapeDtypeStruct *with shardings* (or of
        arrays, whose shardings are used): arrays are read straight into those shardings, which
        may be on a different mesh than the one that saved them. `data_state` is None if the
        checkpoint has none or `restore_data` is False (eval and decode do not need it).

        Raises CheckpointMismatchError (leaf path, both shapes) if the checkpoint holds a
        different state, and NoReadableCheckpointError if no committed checkpoint is readable.
        With an explicit `step`, an unreadable checkpoint raises CheckpointCorruptError instead
        of falling back.
        """
        abstract = _with_shardings(abstract_train_state)
        self.wait_until_finished()
        if step is not None:
            if step not in self.committed_steps():
                raise NoReadableCheckpointError(
                    f"no committed checkpoint for step {step} in {self.directory}; "
                    f"committed steps: {self.committed_steps() or 'none'}."
                )
        elif not self.committed_steps():
            raise NoReadableCheckpointError(
                f"no committed checkpoint in {self.directory}; nothing to restore "
                "(train first, or check --job-log-dir)."
            )
        failures, unreadable, tried, vanished = [], [], set(), 0
        while True:
            candidate = self._next_candidate(step, tried)
            if candidate is None:
                break
            tried.add(candidate)
            try:
                state, data_state = self._restore_step(candidate, abstract, restore_data)
                error = None
            except CheckpointMismatchError:
                raise
            except Exception as e:  # a damaged checkpoint can fail anywhere in orbax/tensorstore
                error = e
            if not all_hosts(not permission_denied(error)):  # not damage: nothing to set aside or skip
                raise CheckpointPermissionError(
                    f"checkpoint {self.directory / str(candidate)} cannot be read: "
                    f"{one_line(error) if error else 'permission denied on another host'}. Fix the permissions of "
                    f"{self.directory} (its files must be readable by this user) and rerun."
                ) from error
            if all_hosts(error is None):
                if unreadable:
                    self._set_aside(unreadable)
                return candidate, state, data_state
            where = self.directory / str(candidate)
            if self.read_only and step is None and vanished < _MAX_VANISHED and self._vanished(candidate):
                # The trainer's keep-N deleted it while we read it: not damage. Take the newest again.
                vanished += 1
                warnings.warn(
                    f"checkpoint {where} was deleted while it was being read (the trainer keeps only the newest "
                    "checkpoint.max_to_keep); reading the newest committed checkpoint instead.",
                    CheckpointFallbackWarning,
                    stacklevel=2,
                )
                continue
            reason = one_line(error) if error else "unreadable on another host"
            if step is not None:
                raise CheckpointCorruptError(f"checkpoint {where} is unreadable: {reason}") from error
            failures.append(f"{where}: {reason}")
            unreadable.append(candidate)
            warnings.warn(
                f"checkpoint {where} is unreadable ({reason}); falling back to the next newest checkpoint.",
                CheckpointFallbackWarning,
                stacklevel=2,
            )
        raise NoReadableCheckpointError(
            f"none of the {len(failures)} committed checkpoints in {self.directory} could be read; refusing to "
            f"start from scratch over them. Move the directory aside to start afresh.{listed(failures)}"
        )

    def _next_candidate(self, step: int | None, tried: set[int]) -> int | None:
        """The step to read next, the same on every host: `step` once, or the newest committed step
        not tried yet (listed afresh each time: a trainer may have committed or deleted some)."""
        if step is not None:
            return None if step in tried else step
        remaining = [s for s in reversed(self.committed_steps()) if s not in tried]
        newest = from_process_0(remaining[0] if remaining else -1)
        return None if newest < 0 else newest

    def _vanished(self, step: int) -> bool:
        """Whether `step` is no longer a committed checkpoint (deleted by the trainer's keep-N),
        as process 0 sees it; a deletion still under way is given a moment to finish."""
        gone = False
        if jax.process_index() == 0:
            path = self.directory / str(step)
            gone = not path.exists()
            if not gone:
                time.sleep(0.5)
                gone = not path.exists()
        return bool(from_process_0(int(gone)))

    def _set_aside(self, steps: list[int]) -> None:
        """Renames unreadable checkpoints newer than the one restored to `<step>.unreadable-<time>`.

        Left in place they would still count as committed: the resumed run could not save those
        steps again, and orbax's keep-N would count them and delete good older checkpoints. The
        files are kept (renamed, not deleted) for inspection; the new name is not a step name
        to orbax (no trailing `_<digits>`), so nothing reads or deletes it.
        """
        if self.read_only:
            return  # a reader leaves the directory as it is; the trainer sets them aside
        stamp = time.strftime("%Y%m%dT%H%M%S")
        if jax.process_index() == 0:
            for step in steps:
                source, target = self.directory / str(step), self.directory / f"{step}.unreadable-{stamp}"
                try:
                    source.rename(target)
                except OSError as e:
                    warnings.warn(
                        f"could not rename the unreadable checkpoint {source} aside ({e}); a new checkpoint for "
                        f"step {step} cannot be written until it is moved.",
                        CheckpointFallbackWarning,
                        stacklevel=3,
                    )
                    continue
                warnings.warn(
                    f"set the unreadable checkpoint {source} aside as {target.name} (kept for inspection).",
                    CheckpointFallbackWarning,
                    stacklevel=3,
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("pax_eqx.checkpoint.set_aside")
        self._manager.reload()

    def _restore_step(self, step: int, abstract: Any, restore_data: bool) -> tuple[Any, dict[str, Any] | None]:
        path = self.directory / str(step)
        manifest = self._reader.restore(path, args=ocp.args.Composite(**{_MANIFEST: ocp.args.JsonRestore()}))[_MANIFEST]
        problems = manifest_problems(manifest, step)
        if problems:
            raise CheckpointCorruptError("; ".join(problems))
        problems = structure_mismatches(manifest, abstract)
        if problems:
            raise CheckpointMismatchError(
                f"checkpoint {path} does not match the state being restored "
                f"({len(problems)} differences):{listed(problems)}\n"
                "It was written by a different model or optimizer configuration: restore with the config it was "
                "saved with (DIR/config.json), or start a new --job-log-dir."
            )
        with_data = restore_data and manifest["has_data"]
        if with_data and manifest["process_count"] != jax.process_count():
            raise CheckpointMismatchError(
                f"checkpoint {path} holds data iterator states for "
                f"{manifest['process_count']} processes, but {jax.process_count()} are restoring it: each host's "
                "position in its data shard cannot be remapped. Resume with the same number of processes, or "
                "restore with restore_data=False (the data order then starts over)."
            )
        items = {_STATE: ocp.args.StandardRestore(abstract)}
        if with_data:
            items[_DATA] = grain.checkpoint.CheckpointRestore(IteratorState())
        try:
            restored = self._reader.restore(path, args=ocp.args.Composite(**items))
            state = restored[_STATE]
        except ValueError as e:
            if "tree structures do not match" not in str(e):
                raise
            # The manifest check above matched every array leaf (both ways, shapes and dtypes), so
            # the trees differ in None-valued fields only: an optional sub-module added since the
            # save (a layer's `fp8: None`). Restore in the saved tree's shape, then move each array
            # to its place in today's state by its path.
            items[_STATE] = ocp.args.StandardRestore(_in_saved_shape(path / _STATE, abstract))
            restored = self._reader.restore(path, args=ocp.args.Composite(**items))
            state = _by_path(restored[_STATE], abstract)
        data = restored[_DATA] if with_data else None
        problems = restored_problems(manifest, state, data.raw if data is not None else None)
        if problems:
            raise CheckpointCorruptError("; ".join(problems))
        return state, data.state if data is not None else None


def _in_saved_shape(item_dir: Path, abstract: Any) -> Any:
    """The saved state's tree (nested dicts and lists, None where it saved None) with `abstract`'s
    leaf of the same path at each array."""
    saved = ocp.StandardCheckpointer().metadata(item_dir).item_metadata
    ours = {leaf_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    flat, treedef = jax.tree_util.tree_flatten_with_path(saved, is_leaf=lambda x: x is None)
    return jax.tree_util.tree_unflatten(treedef, [None if leaf is None else ours[leaf_path(p)] for p, leaf in flat])


def _by_path(restored: Any, abstract: Any) -> Any:
    """`restored` (in the saved tree's shape) rebuilt in `abstract`'s structure, leaf by path."""
    found = {leaf_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    return jax.tree_util.tree_unflatten(treedef, [found[leaf_path(p)] for p, _ in flat])
