"""Imports point down: the import-linter contracts of pyproject.toml (`[tool.importlinter]`) hold.

The floors (docs/design.md, "The house"): config -> layers, learners, data, summaries, sharding
-> models, checkpoint -> tasks -> experiment -> programs -> entry points, experiments,
benchmarks. Sharding and checkpoint are services (arrays, shardings, paths in; no task, no
experiment config), and the library finds `experiments` only through the registry's entry
point. `lint-imports` reads every import, including those inside functions, so a lazy import
cannot hide an upward arrow. The second test proves the contracts bite: the same check on a
copy of the tree with one bad import added must fail and name the contract.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def lint(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at `cwd` (its own pax_eqx, experiments and benchmarks come first
    on sys.path, ahead of the editable install)."""
    return subprocess.run([*LINT, "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "file, bad_import, contract",
    [
        ("pax_eqx/sharding/mesh.py", "from pax_eqx.tasks import task", "never import tasks, experiment or programs"),
        (
            "pax_eqx/checkpoint/config.py",
            "from pax_eqx import experiment",
            "never import tasks, experiment or programs",
        ),
        ("pax_eqx/command_line/cli.py", "import experiments.shakespeare", "pax_eqx never imports experiments"),
        ("pax_eqx/tasks/task.py", "from pax_eqx.experiment import ExperimentConfig", "tasks never import"),
        ("pax_eqx/models/model.py", "from pax_eqx.tasks import task", "floors: imports point down"),
    ],
)
def test_a_bad_import_breaks_a_contract(tmp_path, file, bad_import, contract):
    for name in ("pax_eqx", "experiments", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / file, "a") as f:  # inside a function: lazy imports count too
        f.write(f"\n\ndef _upward():\n    {bad_import}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert contract in " ".join(result.stdout.split()), result.stdout
