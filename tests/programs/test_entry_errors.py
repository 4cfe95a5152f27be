"""Only pax_eqx's own error types become one `error:` line; anything else keeps its traceback.

`entry.run` is what every `python -m pax_eqx.<program>` calls. A user error (ConfigError and its
subclasses, a checkpoint of another model) exits 2, a run that failed mid-way (RunError,
CheckpointError) or ran out of memory exits 1, each as one line. A bare ValueError or
FileNotFoundError is not ours to explain: caught, a bug in pax_eqx would read as the user's
mistake, so it must escape with its traceback (docs/design.md, "Failing well"). `--verbose` (or
PAX_EQX_VERBOSE=1) prints the traceback before the one line and keeps the exit status.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import jax
import pytest

from experiments.registry import load_experiment
from pax_eqx import programs
from pax_eqx.checkpoint import CheckpointError
from pax_eqx.checkpoint.errors import CheckpointMismatchError
from pax_eqx.command_line import entry
from pax_eqx.command_line.registry import UnknownExperimentError
from pax_eqx.config import ConfigError
from pax_eqx.job.errors import NonFiniteLossError
from pax_eqx.job.job_dir import JobDirError

pytestmark = pytest.mark.usefixtures("entry_hooks_restored")  # it calls entry.run in this process


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
        "from pax_eqx.command_line import entry\n"
        "def main():\n"
        "    raise ValueError('a bug, not a user error')\n"
        "entry.run(main)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: a bug, not a user error")
    assert "error: a bug" not in result.stderr


def test_the_entry_module_imports_nothing_heavy():
    """A program prints its first line before JAX, orbax and tyro load (they take seconds)."""
    code = (
        "import sys, pax_eqx.command_line.entry; print(sorted(m for m in ('jax', 'orbax', 'tyro') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize("how", ["flag", "PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK"])
def test_verbose_prints_the_traceback_and_keeps_the_exit_status(capsys, monkeypatch, how):
    def main() -> int:
        if how == "flag":
            entry.set_verbose()  # what cli.parse does with --verbose
        raise ConfigError("train.num_steps must be > 0, got 0.")

    if how != "flag":
        monkeypatch.setenv(how, "1")
    with pytest.raises(SystemExit) as info:
        entry.run(main)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith(
        "pax_eqx.config.ConfigError: train.num_steps must be > 0, got 0.\nerror: train.num_steps must be > 0, got 0.\n"
    )


def test_verbose_is_reset_by_the_next_run(capsys):
    def main() -> int:
        raise ConfigError("bad")

    entry.set_verbose()
    with pytest.raises(SystemExit):
        entry.run(main)
    assert capsys.readouterr().err == "error: bad\n"


OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."


@pytest.mark.parametrize(
    "error, says",
    [
        (jax.errors.JaxRuntimeError(OOM), f"error: out of device memory ({OOM}); "),
        (
            jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm."
            ),
            "error: out of device memory (RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory",
        ),
        (MemoryError(), "error: out of host memory (MemoryError); "),
        (MemoryError("Unable to allocate 8.00 GiB for an array"), "error: out of host memory (MemoryError: Unable"),
    ],
    ids=["device", "compile", "host", "host-numpy"],
)  # fmt: skip
def test_out_of_memory_is_one_line_with_the_estimate_and_the_flags(capsys, error, says):
    exp = load_experiment("gpt3_xl")

    def main() -> int:
        entry.note_run("python -m pax_eqx.train", exp, None)  # what cli.parse does
        raise error

    with pytest.raises(SystemExit) as info:
        entry.run(main, memory_planner=programs.planned_bytes)  # what train's __main__ does
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(says), err
    assert "the planner (--dry-run) estimates 57.50 GiB per device for gpt3_xl" in err  # docs/sharding.md's number
    assert "a smaller --data.train.batch-size (now 16)" in err
    assert "--model.remat-policy full (now dots_with_no_batch_dims_saveable: " in err
    assert "--model.loss-chunk-size 512 (now 0: " in err and "--learner.num-microbatches 2 (now 1: " in err
    assert err.endswith("; no checkpoint had been written; nothing else is lost.\n")


def test_out_of_memory_when_planning_fails_too(capsys, monkeypatch):
    """The estimate is a courtesy: if the planner raises, the line comes without it."""
    from pax_eqx.programs.plan import dry_run

    monkeypatch.setattr(dry_run, "plan", lambda exp: 1 / 0)
    exp = load_experiment("shakespeare_char")

    def main() -> int:
        entry.note_run("python -m pax_eqx.eval", exp, None)
        raise jax.errors.JaxRuntimeError(OOM)

    with pytest.raises(SystemExit) as info:
        entry.run(main, memory_planner=programs.planned_bytes)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "planner" not in err
    assert f"error: out of device memory ({OOM}); to use less memory: a smaller --data.eval.batch-size (now 12)" in err


def test_an_xla_error_that_is_not_out_of_memory_keeps_its_traceback(capsys):
    error = jax.errors.JaxRuntimeError("INTERNAL: a compiler bug")
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        entry.run(raising(error))
    assert info.value is error
    assert "error:" not in capsys.readouterr().err


def test_a_wrapped_out_of_memory_is_found_through_its_cause():
    try:
        try:
            raise MemoryError()
        except MemoryError as e:
            raise RuntimeError("orbax failed to save") from e
    except RuntimeError as outer:
        assert isinstance(entry.out_of_memory(outer), MemoryError)
    assert entry.out_of_memory(RuntimeError("RESOURCE_EXHAUSTED")) is None  # not JAX's error type


def test_benign_library_records_are_dropped_unless_verbose(caplog):
    """orbax logs 'Metadata file does not exist' on every resume; a user cannot act on it."""

    def main() -> int:
        absl = logging.getLogger("absl")
        absl.warning("Metadata file does not exist: /j/checkpoints/20/state/_CHECKPOINT_METADATA")
        absl.warning("Disk is slow: 3 s for step 20")  # not benign: kept
        return 0

    with pytest.raises(SystemExit) as info, caplog.at_level(logging.WARNING, logger="absl"):
        entry.run(main)
    assert info.value.code == 0
    assert [r.getMessage() for r in caplog.records] == ["Disk is slow: 3 s for step 20"]
