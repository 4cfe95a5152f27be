"""The job directory: checked before anything is written, and its config.json kept honest.

    DIR/config.json       the resolved experiment (written once a run has started well)
    DIR/checkpoints/      orbax checkpoints (train state + input positions)
    DIR/summaries/{train,eval}/   TensorBoard events
    DIR/metrics.jsonl     one JSON object per logged step
    DIR/plots/*.png       loss and log-perplexity curves
    DIR/train.lock        locked by the one trainer running in DIR (see `exclusive`)
    DIR/train.lock.holder its pid and host, for the message that refuses a second trainer
    DIR/eval_results.jsonl, DIR/summaries/eval_separate/   what separate `eval` runs measured

One trainer at a time: `train` holds an exclusive OS lock on DIR/train.lock (flock, through the
filelock library) for its whole run, so a second trainer on the same DIR is refused at once,
naming the holder's pid and host. The lock dies with its holder (a SIGKILLed or crashed trainer
leaves no stale lock: the file may stay, the lock does not). Eval and decode take no lock: they
only read (checkpoints through a read-only Checkpointer; their results go to their own files).

`prepare` refuses a --job-log-dir that exists, is not empty, and holds nothing pax_eqx writes
(`--job-log-dir /`, a home directory, a source tree): a run would scatter its files among
someone else's.

A second run on the same DIR resumes. If its experiment differs from the saved config in a
field that changes what a checkpoint means (the model, the data tokenizer), it is refused
with the list of changed fields unless `checkpoint.allow_config_change` is set; changes to
run-length or logging fields (num_steps, intervals, ...) are always allowed. Eval and decode
check their experiment against config.json the same way (`check_config`), and never write it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_eqx.config import ConfigError

# Config fields (dotted prefixes) a resumed run may change freely: run length, logging, eval
# settings, the mesh (checkpoints reshard), decoding and profiling, and how much memory a step
# takes (what is recomputed, logits a chunk at a time, the batch in sequential parts): the
# flags the out-of-memory message suggests change no array of the state. So does pipelining:
# a pipelined stack keeps the same [num_layers, ...] weights.
_RESUMABLE = (
    "train.", "checkpoint.", "decode.", "mesh.", "name:", "profile.", "data.eval.", "model.remat_policy:",
    "model.loss_chunk_size:", "learner.num_microbatches:", "model.pipeline.",
)  # fmt: skip
# Fine-tuning from a start point (a step-0 import: parameters and no data positions, see
# checkpoint/start_point.py) also chooses its own learner and data; only the model, and the
# tokenizer that gives the model's ids their meaning, must stay the imported ones.
_FINE_TUNABLE = ("learner.", "data.")
_FIXED_FOR_FINE_TUNING = ("data.tokenizer",)


LOCK_FILE = "train.lock"
HOLDER_FILE = "train.lock.holder"
# What pax_eqx writes into a job dir: a directory holding only these is one of ours (a first run
# that failed early may have left some of them without config.json).
_OURS = frozenset({
    "config.json", "config.json.tmp", "checkpoints", "metrics.jsonl", "summaries", "plots", "tokenizer", "profile",
    "eval_results.jsonl", "eval_separate", LOCK_FILE, HOLDER_FILE,
    "train.log", "command.txt",  # job/run_record.py
    "trial.log",  # the trainer process's output, when the tuner runs it
})  # fmt: skip
# Any one of these makes a directory a job dir, whatever else the user put beside them.
_MARKS = ("config.json", "checkpoints", "metrics.jsonl")


class JobDirError(ConfigError):
    """The job dir cannot be used as given (a user error: exit 2)."""


class JobDirLockWarning(UserWarning):
    """The job dir's file system cannot lock files: a second trainer would not be refused."""


def prepare(job_dir: str | os.PathLike, *, create: bool = True) -> Path:
    """Checks DIR is (or can become) a writable directory; names the problem otherwise."""
    path = Path(job_dir)
    _refuse_unusable_name(path)
    if path.exists() and not path.is_dir():
        raise JobDirError(f"--job-log-dir {str(path)!r} is a file, not a directory; choose another path.")
    if not path.exists():
        if not create:
            raise JobDirError(f"--job-log-dir {str(path)!r} does not exist; train first, or check the path.")
        try:
            path.mkdir(parents=True)
        except OSError as e:
            message = f"--job-log-dir {str(path)!r} cannot be created ({e.strerror}); choose a writable path."
            raise JobDirError(message) from None
    if create and not os.access(path, os.W_OK | os.X_OK):
        raise JobDirError(f"--job-log-dir {str(path)!r} is not writable; fix its permissions or choose another path.")
    _refuse_broken_checkpoints_dir(path)
    if create:
        _refuse_foreign(path)
    return path


def _refuse_unusable_name(path: Path) -> None:
    """A path the run could create but never save into: bytes that are not UTF-8 (tensorstore
    takes UTF-8 paths only: the first save would fail), a name longer than the file system
    allows, or a path longer than it allows (with room for the checkpoint files below it)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape")
        raise JobDirError(
            f"--job-log-dir {raw!r} is not UTF-8 (checkpoints are written through tensorstore, which takes UTF-8 "
            "paths only); choose a path of UTF-8 text."
        ) from None
    existing = next((p for p in [path.absolute(), *path.absolute().parents] if _exists(p)), Path("/"))
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return
    long_name = next((part for part in path.parts if len(os.fsencode(part)) > name_max), None)
    if long_name is not None:
        raise JobDirError(
            f"--job-log-dir {text!r}: the name {long_name[:40]!r}... is {len(os.fsencode(long_name))} bytes, over the "
            f"file system's limit of {name_max}; choose a shorter name."
        )
    room = 200  # checkpoints/<step>/state/d/<hash>, the longest file a run writes below its job dir
    if len(os.fsencode(str(path.absolute()))) + room > path_max:
        raise JobDirError(
            f"--job-log-dir is {len(os.fsencode(str(path.absolute())))} bytes long: with the checkpoint files below "
            f"it (~{room} more) it passes the file system's limit of {path_max}; choose a shorter path."
        )


def _exists(path: Path) -> bool:
    """Path.exists without the OSError a name too long for the file system raises."""
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def _refuse_broken_checkpoints_dir(path: Path) -> None:
    """DIR/checkpoints as a link to nothing, or holding a Paxml run's `checkpoint_<step>` dirs:
    named here, not later as a directory that "exists" or checkpoints that cannot be read."""
    checkpoints = path / "checkpoints"
    if checkpoints.is_symlink() and not checkpoints.exists():
        raise JobDirError(
            f"{str(checkpoints)!r} is a link to {os.readlink(checkpoints)!r}, which does not exist; create that "
            "directory or remove the link."
        )
    if checkpoints.is_dir():
        pax = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("checkpoint_"))
        if pax:
            raise JobDirError(
                f"--job-log-dir {str(path)!r} is a Paxml job dir ({checkpoints.name}/{pax[-1]}); import it into a new "
                f"job dir first: python -m pax_eqx.import_pax --pax-checkpoint {path} --exp NAME --job-log-dir NEW_DIR."
            )


def _refuse_foreign(path: Path) -> None:
    """Raises JobDirError if DIR holds entries but none of the files a job dir has (see module doc)."""
    try:
        entries = sorted(os.listdir(path))
    except OSError as e:
        raise JobDirError(
            f"--job-log-dir {str(path)!r} cannot be listed ({e.strerror}); choose another path."
        ) from None
    ours = [name in _OURS or name.startswith(LOCK_FILE) for name in entries]  # train.lock.holder.<pid>.tmp too
    if not entries or any(name in entries for name in _MARKS) or all(ours):
        return
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise JobDirError(
        f"--job-log-dir {str(path)!r} is not empty and is not a pax_eqx job dir (it holds {shown}, but no "
        "config.json, checkpoints/ or metrics.jsonl); choose a new or empty directory, e.g. "
        f"{str(path / 'my_run')!r}."
    )


@contextlib.contextmanager
def exclusive(path: Path, *, lock: bool = True) -> Iterator[None]:
    """Holds DIR/train.lock for the block: the one trainer of DIR (see module doc).

    Raises JobDirError, naming the holder's pid and host (which the holder writes into
    DIR/train.lock.holder), if another process holds the lock, or if the lock file cannot be
    created. `lock=False` (the other hosts of a multi-host run: process 0 locks for all) holds
    nothing. Both files are removed on the way out, so a job dir a refused run created is left
    empty.
    """
    if not lock:
        yield
        return
    from filelock import FileLock, Timeout

    file, holder = path / LOCK_FILE, path / HOLDER_FILE
    # timeout: a few retries, for the instant in which a finishing trainer removes the file.
    trainer_lock = FileLock(str(file), timeout=0.5)
    try:
        trainer_lock.acquire()
    except Timeout:
        raise JobDirError(
            f"--job-log-dir {str(path)!r} is in use by another training run ({_holder(holder)}); a job dir has one "
            "trainer at a time. Wait for that run to finish (or stop it), or train into another --job-log-dir; "
            "eval and decode may read the job dir meanwhile."
        ) from None
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
            with contextlib.suppress(OSError):
                if file.exists() and file.stat().st_size == 0:  # an empty lock file a full disk let through
                    file.unlink()
            raise JobDirError(
                f"--job-log-dir {str(path)!r}: cannot create its lock file {LOCK_FILE} ({e.strerror}); {_fix_for(e)}."
            ) from None
        warnings.warn(
            f"the file system of --job-log-dir {str(path)!r} cannot lock files ({e.strerror}): a second trainer on "
            "it would not be refused; make sure only one runs.",
            JobDirLockWarning,
            stacklevel=3,
        )
        yield
        return
    try:
        held = os.stat(file)  # the inode we hold: removed on the way out only if it is still this one
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        tmp = holder.with_name(f"{HOLDER_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info) + "\n")
        os.replace(tmp, holder)
    except OSError as e:  # a refused start leaves nothing behind: the holder's temporary file, the lock
        with contextlib.suppress(OSError, NameError):
            tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError, NameError):
            if os.path.samestat(os.lstat(file), held):
                file.unlink()
        trainer_lock.release()
        raise JobDirError(
            f"--job-log-dir {str(path)!r}: cannot write {HOLDER_FILE} ({e.strerror}); {_fix_for(e)}."
        ) from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        with contextlib.suppress(OSError):
            if os.path.samestat(os.lstat(file), held):
                file.unlink()
        trainer_lock.release()


def _fix_for(error: OSError) -> str:
    """What to do about a job dir the OS would not write into, by its reason."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space (or inodes: `df -i`) on its file system, or choose another path"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "fix the directory's permissions, or choose another path"
    if error.errno in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
        return "move aside what is in its place, or choose another path"
    return "choose another path"


def _holder(file: Path) -> str:
    """ "pid 123 on host h, since ..." from the lock file, or what is known when it cannot be read."""
    try:
        info = json.loads(file.read_text())
        return f"pid {info['pid']} on host {info['host']}, running since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its pid and host are not recorded in {file}"


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths (with old -> new values) where two JSON-like configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += config_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def check_config(
    path: Path,
    config: dict[str, Any],
    allow_change: bool,
    *,
    program: str = "resume",
    resumable: bool = True,
    saved: tuple[int, dict[str, Any]] | None = None,
    start_point: bool = False,
) -> list[str]:
    """Compares `config` with DIR/config.json (if any) without writing; returns the changed fields.

    Raises JobDirError listing the fields that change what a checkpoint means (the model, the
    data pipeline, the optimizer) unless `allow_change`. `program` says what was refused
    ("resume", "eval", "decode"). `resumable=False` (no committed checkpoint: a run stopped
    before its first save, by an out-of-memory error say) lets the same experiment's changes
    start afresh; another experiment is still refused: one dir, one experiment. `saved`: (step,
    experiment) from the newest checkpoint, compared instead when config.json is missing (deleted
    by hand): a resume with another data seed is then refused as it would have been.
    `start_point`: DIR's only checkpoint is a step-0 import, so the learner and the data may change too.
    """
    file = path / "config.json"
    where = "saved"
    if file.exists():
        try:
            old = json.loads(file.read_text(encoding="utf-8"))
        except ValueError as e:  # not JSON, or not UTF-8 (UnicodeDecodeError)
            raise JobDirError(f"{file} is not valid JSON ({e}); restore it or use a new --job-log-dir.") from None
    elif saved is not None:
        old, where = saved[1], f"config.json is missing; saved in the step-{saved[0]} checkpoint"
    else:
        return []
    old, config = _decay_ends_resolved(_as_today(old), config)
    changed = config_diff(old, config)
    blocking = [c for c in changed if not c.startswith(_RESUMABLE)]
    if start_point:
        blocking = [c for c in blocking if not c.startswith(_FINE_TUNABLE) or c.startswith(_FIXED_FOR_FINE_TUNING)]
    afresh = not resumable and isinstance(old, dict) and old.get("name") == config.get("name")
    if blocking and not (allow_change or afresh):
        raise JobDirError(
            f"cannot {program} --job-log-dir {str(path)!r}: it holds a run of a different experiment; changed "
            f"fields ({where} -> given):\n  "
            + "\n  ".join(blocking)
            + (
                "\nPass the flags the run was started with, use a new --job-log-dir, or pass "
                if program == "resume"
                else "\nDrop --exp and those flags (the experiment saved in config.json is read), or pass "
            )
            + "--checkpoint.allow-config-change to go ahead anyway."
        )
    return changed


def _decay_ends_resolved(old: Any, new: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`learner.schedule.decay_end` 0 means "at train.num_steps". Where one side says 0 and the
    other a step, the 0 is compared as its run's num_steps: a job dir started when the default
    recipe's decay ended at 2000 (its num_steps) resumes under today's recipe, whose decay follows
    the run, because the two schedules are the same; a run whose schedule would change is still
    refused, naming the step. Both 0 stays 0 == 0 (a longer run may stretch its decay)."""

    def end(config: Any) -> Any:
        schedule = config.get("learner", {}).get("schedule") if isinstance(config, dict) else None
        return schedule.get("decay_end") if isinstance(schedule, dict) else None

    def resolved(config: dict[str, Any]) -> dict[str, Any]:
        steps = config.get("train", {}).get("num_steps")
        learner = {**config["learner"], "schedule": {**config["learner"]["schedule"], "decay_end": steps}}
        return {**config, "learner": learner}

    old_end, new_end = end(old), end(new)
    if old_end == 0 and isinstance(new_end, int) and new_end > 0:
        return resolved(old), new
    if new_end == 0 and isinstance(old_end, int) and old_end > 0:
        return old, resolved(new)
    return old, new


def _as_today(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config.json in today's form: an older pax_eqx's (a flat optimizer, a schedule or
    norm with every kind's fields) read through the configs' migrations and written again, and
    fields added since at their defaults, so only real changes count. As saved when it cannot be
    read (a user's model config that is not importable here: its fields compare as they are)."""
    from pax_eqx.experiment import ExperimentConfig

    try:
        return ExperimentConfig.from_dict(saved).to_dict()
    except (ConfigError, TypeError, ValueError, KeyError):
        return saved


def write_config(path: Path, config: dict[str, Any]) -> None:
    """Writes DIR/config.json atomically (a kill mid-write leaves the old file or the new one)."""
    file = path / "config.json"
    tmp = file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, file)


def write_or_check_config(path: Path, config: dict[str, Any], allow_change: bool) -> list[str]:
    """`check_config`, then `write_config`: a refused run leaves config.json as it was."""
    changed = check_config(path, config, allow_change)
    write_config(path, config)
    return changed
