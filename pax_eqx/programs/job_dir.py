"""The job directory: checked before anything is written, and its config.json kept honest.

    DIR/config.json       the resolved experiment (written once a run has started well)
    DIR/checkpoints/      orbax checkpoints (train state + input positions)
    DIR/summaries/{train,eval}/   TensorBoard events
    DIR/metrics.jsonl     one JSON object per logged step
    DIR/plots/*.png       loss and log-perplexity curves

A second run on the same DIR resumes. If its experiment differs from the saved config in a
field that changes what a checkpoint means (the model, the data tokenizer), it is refused
with the list of changed fields unless `checkpoint.allow_config_change` is set; changes to
run-length or logging fields (num_steps, intervals, ...) are always allowed. Eval and decode
check their experiment against config.json the same way (`check_config`), and never write it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pax_eqx.config import ConfigError

# Config fields (dotted prefixes) a resumed run may change freely: run length, logging, eval
# settings, the mesh (checkpoints reshard), decoding and profiling.
_RESUMABLE = ("train.", "checkpoint.", "decode.", "mesh.", "name:", "profile.", "data.eval.")


class JobDirError(ConfigError):
    """The job dir cannot be used as given (a user error: exit 2)."""


def prepare(job_dir: str | os.PathLike, *, create: bool = True) -> Path:
    """Checks DIR is (or can become) a writable directory; names the problem otherwise."""
    path = Path(job_dir)
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
    return path


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths (with old -> new values) where two JSON-like configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += config_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def check_config(path: Path, config: dict[str, Any], allow_change: bool, *, program: str = "resume") -> list[str]:
    """Compares `config` with DIR/config.json (if any) without writing; returns the changed fields.

    Raises JobDirError listing the fields that change what a checkpoint means (the model, the
    data pipeline, the optimizer) unless `allow_change`. `program` says what was refused
    ("resume", "eval", "decode").
    """
    file = path / "config.json"
    if not file.exists():
        return []
    try:
        old = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise JobDirError(f"{file} is not valid JSON ({e}); restore it or use a new --job-log-dir.") from None
    changed = config_diff(old, config)
    blocking = [c for c in changed if not c.startswith(_RESUMABLE)]
    if blocking and not allow_change:
        raise JobDirError(
            f"cannot {program} --job-log-dir {str(path)!r}: it holds a run of a different experiment; changed "
            "fields (saved -> given):\n  "
            + "\n  ".join(blocking)
            + "\nPass the flags the run was started with, use a new --job-log-dir, or pass "
            "--checkpoint.allow-config-change to go ahead anyway."
        )
    return changed


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
