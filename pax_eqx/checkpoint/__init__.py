"""Checkpoints: orbax CheckpointManager holding the train state and the data iterator state.

    from pax_eqx.checkpoint import Checkpointer, CheckpointConfig

The directory layout, the commit protocol and the fallback past damaged checkpoints are in
checkpointer.py.
"""

from pax_eqx.checkpoint.checkpointer import (
    CheckpointCorruptError,
    Checkpointer,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointMismatchError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    NoReadableCheckpointError,
)
from pax_eqx.checkpoint.config import CheckpointConfig
from pax_eqx.checkpoint.integrity import all_finite, leaf_summaries
