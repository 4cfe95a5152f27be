"""Only pax_eqx's own error types become one `error:` line; anything else keeps its traceback.

`entry.run` is what every `python -m pax_eqx.<program>` calls. A user error (ConfigError and its
subclasses, a checkpoint of another model) exits 2, a run that failed mid-way (RunError,
CheckpointError) exits 1, each as one line. A bare ValueError or FileNotFoundError is not ours
to explain: caught, a bug in pax_eqx would read as the user's mistake, so it must escape with
its traceback (docs/design.md, "Failing well").
"""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest

from pax_eqx.checkpoint import CheckpointError
from pax_eqx.checkpoint.checkpointer import CheckpointMismatchError
from pax_eqx.config import ConfigError
from pax_eqx.programs import entry
from pax_eqx.programs.errors import NonFiniteLossError
from pax_eqx.programs.job_dir import JobDirError
from pax_eqx.programs.registry import UnknownExperimentError


@pytest.fixture(autouse=True)
def _restore_process_hooks(monkeypatch):
    """entry.run sets process-wide hooks (warning format, unraisable hook, a log filter)."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.delenv("PAX_EQX_TRACEBACK", raising=False)
    yield
    for library in ("absl", "asyncio"):
        logging.getLogger(library).removeFilter(entry._drop_traceback)


def raising(error: BaseException):
    def main() -> int:
        raise error

    return main


@pytest.mark.parametrize(
    "error, code",
    [
        (ConfigError("train.num_steps must be > 0, got 0."), 2),
        (JobDirError("--job-log-dir 'x' is a file, not a directory; choose another path."), 2),
        (UnknownExperimentError("--exp 'nope' is not a registered experiment."), 2),
        (CheckpointMismatchError("checkpoint 8 does not match the state being restored."), 2),
        (NonFiniteLossError("total_loss is nan at step 9."), 1),
        (CheckpointError("saving the checkpoint for step 10 failed."), 1),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_our_errors_are_one_line_and_an_exit_status(capsys, error, code):
    with pytest.raises(SystemExit) as info:
        entry.run(raising(error))
    assert info.value.code == code
    err = capsys.readouterr().err
    assert err == f"error: {error}\n"
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "error",
    [
        ValueError("operands could not be broadcast together with shapes (4,) (3,)"),
        FileNotFoundError(2, "No such file or directory", "/tmp/some/internal/cache"),
        PermissionError(13, "Permission denied", "/proc/whatever"),
        NotADirectoryError(20, "Not a directory", "/etc/hostname/x"),
        KeyError("ids"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_that_is_not_ours_keeps_its_traceback(capsys, error):
    """A ValueError raised by a bug in pax_eqx (or in a library under it) is not a user error:
    it escapes entry.run unchanged, so Python prints its traceback and exits 1, not 2."""
    with pytest.raises(type(error)) as info:
        entry.run(raising(error))
    assert info.value is error
    assert "error:" not in capsys.readouterr().err


def test_a_real_command_keeps_the_traceback_of_an_unexpected_error(tmp_path):
    """The same through a real process: exit 1 with Python's traceback, no `error:` line."""
    code = (
        "from pax_eqx.programs import entry\n"
        "def main():\n"
        "    raise ValueError('a bug, not a user error')\n"
        "entry.run(main)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: a bug, not a user error")
    assert "error: a bug" not in result.stderr
