"""Checkpoints: orbax CheckpointManager holding the train state and the data iterator state.

    from pax_eqx.checkpoint import Checkpointer, CheckpointConfig

    reader = Checkpointer(job_dir / "checkpoints", cfg, read_only=True)   # eval, decode: beside a trainer

The directory layout, the commit protocol, the fallback past damaged checkpoints and what a
read-only Checkpointer promises a trainer writing the same directory are in checkpointer.py.
"""

from pax_eqx.checkpoint.checkpointer import Checkpointer
from pax_eqx.checkpoint.config import CheckpointConfig
from pax_eqx.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointMismatchError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    NoReadableCheckpointError,
)
from pax_eqx.checkpoint.integrity import all_finite, leaf_summaries
