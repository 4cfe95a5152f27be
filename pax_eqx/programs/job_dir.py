"""The job directory: checked before anything is written, and its config.json kept honest.

    DIR/config.json       the resolved experiment (written on the first run)
    DIR/checkpoints/      orbax checkpoints (train state + data iterator state)
    DIR/summaries/{train,eval}/   TensorBoard events
    DIR/metrics.jsonl     one JSON object per logged step
    DIR/plots/*.png       loss and log-perplexity curves

A second run on the same DIR resumes. If its experiment differs from the saved config in a
field that changes what a checkpoint means (the model, the data tokenizer), it is refused
with the list of changed fields unless `checkpoint.allow_config_change` is set; changes to
run-length or logging fields (num_steps, intervals, ...) are always allowed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Config fields (dotted prefixes) a resumed run may change freely: run length, logging, eval
# settings, the mesh (checkpoints reshard), decoding and profiling.
_RESUMABLE = ("train.", "checkpoint.", "decode.", "mesh.", "name:", "profile.", "data.eval.")


class JobDirError(ValueError):
    """The job dir cannot be used as given."""


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


def write_or_check_config(path: Path, config: dict[str, Any], allow_change: bool) -> list[str]:
    """Writes DIR/config.json on a fresh job; on resume, refuses incompatible changes.

    Returns the list of changed fields (empty on a fresh job). The file is rewritten only
    after the check passed, atomically, so a refused run leaves it as it was.
    """
    file = path / "config.json"
    changed: list[str] = []
    if file.exists():
        try:
            old = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise JobDirError(f"{file} is not valid JSON ({e}); restore it or use a new --job-log-dir.") from None
        changed = config_diff(old, config)
        blocking = [c for c in changed if not c.startswith(_RESUMABLE)]
        if blocking and not allow_change:
            raise JobDirError(
                f"--job-log-dir {str(path)!r} holds a run with a different experiment; changed fields:\n  "
                + "\n  ".join(blocking)
                + "\nUse a new --job-log-dir, or pass --checkpoint.allow-config-change to resume anyway."
            )
    tmp = file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, file)
    return changed
