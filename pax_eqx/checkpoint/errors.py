"""What can go wrong with a checkpoint: the errors and the warning the Checkpointer raises.

One family, so a caller catches every checkpoint failure with `CheckpointError` and tells the
kinds apart by class (`pax_eqx.command_line.entry` maps a mismatch to exit 2, the rest to exit 1).
`listed` and `one_line` shape their messages: a long list cut to its first lines, an
orbax/tensorstore exception cut to one readable line.
"""

from __future__ import annotations

import re

_MAX_LISTED = 12
_TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec(\[\d+\])?='.*?'\]", re.DOTALL)


class CheckpointError(RuntimeError):
    """Base of the errors below."""


class NonFiniteCheckpointError(CheckpointError):
    """The train state to save holds NaN or Inf."""


class CheckpointSaveError(CheckpointError):
    """Writing a checkpoint failed (disk full, permissions, ...); earlier checkpoints are intact."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint holds a different state (shapes, dtypes, leaves) than the one to restore."""


class CheckpointCorruptError(CheckpointError):
    """A committed checkpoint could not be read back, or read back different bytes."""


class CheckpointPermissionError(CheckpointError):
    """A committed checkpoint's files could not be opened for their permissions: not damage, so
    nothing is set aside or skipped; the user fixes the permissions."""


def permission_denied(error: BaseException | None) -> bool:
    """Whether `error` (or what it was raised from) is the OS refusing access: a PermissionError,
    or tensorstore's PERMISSION_DENIED status inside a library's exception text."""
    while error is not None:
        if isinstance(error, PermissionError) or "PERMISSION_DENIED" in str(error) or "Permission denied" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


class NoReadableCheckpointError(CheckpointError):
    """No committed checkpoint in the directory could be restored."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint was unreadable; an older one was restored instead."""


def listed(items: list[str]) -> str:
    """`items` one per indented line, for the end of a message; past the first few, a count."""
    shown = items[:_MAX_LISTED]
    more = f"\n  ... and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return "\n  " + "\n  ".join(shown) + more


def one_line(error: BaseException, head: int = 200, tail: int = 300) -> str:
    """One line of an exception: tensorstore's JSON specs dropped, then its start and end kept
    (the OS error -- "No space left on device" -- comes last)."""
    text = _TENSORSTORE_SPEC.sub("", f"{type(error).__name__}: {error}")
    text = " ".join(text.split())
    return text if len(text) <= head + tail else f"{text[:head]} ... {text[-tail:]}"
