"""What a job dir keeps of how it was made: DIR/command.txt and DIR/train.log.

    command.txt   one block per start (a resume adds one): the command line, the working
                  directory, the time, the code's git commit (and whether the tree had
                  uncommitted changes) and the versions of the packages that decide the numbers
    train.log     the trainer's log lines (banner, a progress line per summary, evals, warnings,
                  the sample, the closing block), appended across resumes, each start headed by
                  a rule with its time; the progress lines are the piped output's, written on
                  a terminal too (where the bar shows them), and no line is wrapped

Both are written once the run has validated, taken the job dir's lock and restored (or
started) its state, like config.json: a refused start leaves neither behind. metrics.jsonl's
rows carry their own wall time (summaries.writer).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pax_eqx.job.errors import RunError

COMMAND_FILE = "command.txt"
LOG_FILE = "train.log"
_PACKAGES = ("pax_eqx", "jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", "grain", "tyro", "numpy")


def record_command(job_dir: Path, argv: Sequence[str] | None, program: str = "python -m pax_eqx.train") -> None:
    """Appends this start's block to DIR/command.txt."""
    command = shlex.join([*program.split(), *(sys.argv[1:] if argv is None else argv)])
    lines = [
        f"# started {_now()}",
        f"$ {command}",
        f"cwd: {os.getcwd()}",
        f"code: {code_version()}",
        f"python {platform.python_version()}; " + "; ".join(f"{p} {_version(p)}" for p in _PACKAGES),
    ]
    _append(job_dir / COMMAND_FILE, "\n".join(lines) + "\n\n")


def tee_to_log(job_dir: Path, log: Callable[[str], None]) -> Callable[[str], None]:
    """`log`, also appending each line to DIR/train.log (headed by this start's rule)."""
    _append(job_dir / LOG_FILE, f"===== {_now()} =====\n")
    to_file = log_file(job_dir)

    def both(line: str) -> None:
        log(line)
        to_file(line)  # as it is: `log` may wrap it for a terminal, the file never does

    return both


def log_file(job_dir: Path) -> Callable[[str], None]:
    """Appends a line to DIR/train.log only (the progress lines, which the terminal shows in its bar)."""
    path = job_dir / LOG_FILE

    def append(line: str) -> None:
        _append(path, f"{line}\n")

    return append


def _append(path: Path, text: str) -> None:
    """Appends `text`; a full disk or a read-only job dir is one RunError naming the file."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise RunError(
            f"writing {path} failed ({e.strerror or e}); free space (or fix the permissions) and rerun the same "
            "command to resume from the newest checkpoint."
        ) from e


def code_version() -> str:
    """The git commit of the checkout pax_eqx runs from (`+ uncommitted changes` when the tree
    differs from it), or why there is none."""
    here = Path(__file__).resolve().parent
    try:
        commit = _git(here, "rev-parse", "HEAD")
        dirty = _git(here, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return f"pax_eqx {_version('pax_eqx')} (not a git checkout)"
    return f"git {commit}" + (" + uncommitted changes" if dirty else "")


def _git(where: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")
