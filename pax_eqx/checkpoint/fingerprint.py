"""A checkpoint's parameters, fingerprinted from its manifest without reading an array.

    params_fingerprint(job_dir / "checkpoints", step)   -> "sha256 hex"

The manifest (integrity.py) lists every leaf of the saved train state with its path, shape,
dtype and checksum. The fingerprint is the SHA-256 of those entries for the parameters (and
their EMA, which eval and export read where a learner keeps one): two checkpoints have the same
fingerprint exactly when they hold the same parameter bits (up to the 32-bit checksums). A LoRA
run records its base's fingerprint and refuses a base that changed since (`programs/lora_base.py`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orbax.checkpoint as ocp

from pax_eqx.checkpoint.errors import CheckpointError
from pax_eqx.checkpoint.integrity import manifest_problems

_PARAMS = ("params/", "ema/")


def params_fingerprint(directory: Path, step: int) -> str:
    """SHA-256 of the parameter entries of step `step`'s manifest under `directory` (a job dir's
    checkpoints/); CheckpointError when the manifest cannot be read or is damaged."""
    entries = [e for e in read_manifest(directory, step)["leaves"] if e["path"].startswith(_PARAMS)]
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(directory: Path, step: int) -> dict:
    """Step `step`'s manifest under `directory`, checked; CheckpointError when unreadable or damaged."""
    where = Path(directory) / str(step)
    try:
        restored = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
            where, args=ocp.args.Composite(manifest=ocp.args.JsonRestore())
        )
        manifest = restored["manifest"]
    except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many kinds; the message says which
        raise CheckpointError(f"cannot read the manifest of checkpoint {where}: {e}") from e
    problems = manifest_problems(manifest, step)
    if problems:
        raise CheckpointError(f"checkpoint {where} is damaged: {'; '.join(problems)}")
    return manifest
