"""Errors of a run that started well and then failed: `python -m pax_eqx.*` exits 1 on them.

A bad input (flag, field, path, data file, job dir) is reported before anything runs and exits
2 (pax_eqx.command_line.entry); these are the failures that can only happen mid-run. Each message
says at which step, why, and which checkpoint a rerun of the same command resumes from.

pax_eqx's error types, the only exceptions the entry points print as one `error:` line:

    exit 2  ConfigError (pax_eqx.config; a ValueError) -- a bad flag, field, value, data file
              JobDirError (pax_eqx.job.job_dir)    -- a job dir that cannot be used
              UnknownExperimentError (pax_eqx.command_line.registry) -- a bad --exp
            CheckpointMismatchError (pax_eqx.checkpoint) -- a checkpoint of another model
    exit 1  RunError (here): NonFiniteLossError, DataPipelineError
            CheckpointError (pax_eqx.checkpoint): a checkpoint that cannot be written or read

Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import traceback


class RunError(RuntimeError):
    """A run failed mid-way; the checkpoints it wrote before the failure are intact."""


class NonFiniteLossError(RunError):
    """The loss or gradient norm became NaN/Inf and learner.skip_nonfinite is off."""


class DataPipelineError(RunError):
    """An input raised (or ran out) mid-run."""


def raised_at(error: BaseException) -> str:
    """ " (raised in fn, file:line)" for the innermost frame of `error`'s traceback, or ""."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" (raised in {frame.name}, {frame.filename}:{frame.lineno})"
