"""A user's `--exp` that fails to import or to run fails in one line, through the real command line.

`python -m pax_eqx.train --exp mypkg.exps.NAME` for each way a user's experiment goes wrong:
the error is `error: --exp NAME: <exception type>: <message> (in FILE:LINE)` on stderr, exit 2,
no traceback, nothing written; `--verbose` (or PAX_EQX_VERBOSE=1) prints the traceback of the
user's exception before the same line, with the same exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EXPS = """
from experiments.shakespeare import shakespeare_char


def needs_arg(n):
    return shakespeare_char()


def not_config():
    return {"model": 1}


def misspelt_field():
    exp = shakespeare_char()
    return exp.replace(model=exp.model.replace(num_layer=2))


def raises():
    raise RuntimeError("a bug in my experiment")


VALUE = 3
"""


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user")
    pkg = root / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "exps.py").write_text(EXPS)
    (pkg / "raises_at_import.py").write_text("import os\n\nSETTINGS = {}['missing']\n")
    (pkg / "bad_syntax.py").write_text("def f(:\n    pass\n")
    (pkg / "missing_dependency.py").write_text("import no_such_dependency_of_mine\n")
    return root


def train(user_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK")}
    environment.update(PYTHONPATH=os.pathsep.join([str(user_dir), str(REPO)]), JAX_PLATFORMS="cpu")
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", *args, "--job-log-dir", str(user_dir / "job")],
        cwd=user_dir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "target, line",
    [
        (
            "mypkg.raises_at_import.f",
            "--exp 'mypkg.raises_at_import.f': KeyError: 'missing' (in mypkg/raises_at_import.py:3)",
        ),
        (
            "mypkg.exps.needs_arg",
            "--exp 'mypkg.exps.needs_arg': TypeError: needs_arg() missing 1 required positional argument: 'n' "
            "(in mypkg/exps.py:5)",
        ),
        (
            "mypkg.exps.not_config",
            "--exp 'mypkg.exps.not_config': TypeError: not_config() returned a dict, not an ExperimentConfig "
            "(in mypkg/exps.py:9)",
        ),
        ("mypkg.exps.raises", "--exp 'mypkg.exps.raises': RuntimeError: a bug in my experiment (in mypkg/exps.py:19)"),
        (
            "mypkg.exps.misspelt_field",
            "--exp 'mypkg.exps.misspelt_field': ConfigError: LanguageModelConfig has no field 'num_layer'. Did you "
            "mean 'num_layers'?",
        ),
        (
            "mypkg.exps.need_arg",
            "--exp 'mypkg.exps.need_arg': AttributeError: module 'mypkg.exps' has no attribute 'need_arg'; did you "
            "mean mypkg.exps.needs_arg? (in mypkg/exps.py)",
        ),
        (
            "mypkg.exps.VALUE",
            "--exp 'mypkg.exps.VALUE': TypeError: mypkg.exps.VALUE is an int, not an ExperimentConfig or a function "
            "returning one (in mypkg/exps.py)",
        ),
        ("mypkg.bad_syntax.f", "--exp 'mypkg.bad_syntax.f': SyntaxError: "),
        (
            "mypkg.missing_dependency.f",
            "--exp 'mypkg.missing_dependency.f': ModuleNotFoundError: No module named 'no_such_dependency_of_mine' "
            "(in mypkg/missing_dependency.py:1)",
        ),
        ("mypkg.exps", "--exp 'mypkg.exps': 'mypkg.exps' is a module, not an experiment;"),
        ("mypkg.no_module.f", "--exp 'mypkg.no_module.f': cannot import module 'mypkg.no_module'"),
    ],
    ids=[
        "raises-at-import",
        "wrong-signature",
        "not-a-config",
        "raises",
        "misspelt-field",
        "missing-attribute",
        "a-value-not-a-config",
        "syntax-error",
        "missing-dependency",
        "a-module",
        "missing-module",
    ],  # fmt: skip
)
def test_a_failing_user_experiment_is_one_line_and_exit_2(user_dir, target, line):
    result = train(user_dir, "--exp", target)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [row for row in result.stderr.splitlines() if row.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: " + line), result.stderr
    assert not (user_dir / "job").exists()


def test_the_misspelt_field_points_at_the_users_line(user_dir):
    """The frame named is the user's (exps.py:15), not pax_eqx's config.py that raised."""
    result = train(user_dir, "--exp", "mypkg.exps.misspelt_field")
    assert result.stderr.rstrip().endswith("(in mypkg/exps.py:15)"), result.stderr


@pytest.mark.parametrize("how", ["--verbose", "PAX_EQX_VERBOSE=1"])
def test_verbose_prints_the_users_traceback_and_keeps_the_exit_status(user_dir, how):
    args, env = (["--verbose"], {}) if how == "--verbose" else ([], {"PAX_EQX_VERBOSE": "1"})
    result = train(user_dir, "--exp", "mypkg.exps.raises", *args, env=env)
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert 'raise RuntimeError("a bug in my experiment")' in result.stderr  # the user's own frame
    assert result.stderr.rstrip().splitlines()[-1] == (
        "error: --exp 'mypkg.exps.raises': RuntimeError: a bug in my experiment (in mypkg/exps.py:19)"
    )


def test_an_entry_point_module_that_raises_at_import_is_one_line(user_dir, tmp_path):
    """A package of one's own registered through the `pax_eqx.experiments` entry point, whose
    module raises when the registry imports it: every `--exp` names the module and the entry point."""
    dist = tmp_path / "broken_exps-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-exps\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pax_eqx.experiments]\nmine = broken_exps\n")
    (tmp_path / "broken_exps").mkdir()
    (tmp_path / "broken_exps" / "__init__.py").write_text("")
    (tmp_path / "broken_exps" / "tiny.py").write_text(
        textwrap.dedent(
            """
            from pax_eqx.command_line.registry import register

            LAYERS = int("two")
            """
        )
    )
    result = train(user_dir, "--exp", "shakespeare_char", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "error: --exp 'shakespeare_char': ValueError: invalid literal for int() with base 10: 'two' (in "
    )
    assert (
        "broken_exps/tiny.py:4), while importing the experiments of the 'pax_eqx.experiments' entry point 'mine'"
        in (result.stderr)
    )
