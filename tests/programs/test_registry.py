"""The experiment registry finds experiments through the `pax_eqx.experiments` entry point.

The library never imports the top-level `experiments` package by name (imports point down);
every module of a package an entry point names is imported, so a new experiment file needs no
registry edit. Each check runs in a fresh process: this one has long imported everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pax_eqx.command_line import registry
from pax_eqx.config import ConfigError


def python(code: str, **kwargs) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, **kwargs
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_every_module_of_experiments_is_loaded_through_the_entry_point():
    out = python(
        """
        import pkgutil, sys
        from pax_eqx.command_line import registry
        assert not [m for m in sys.modules if m.split(".")[0] == "experiments"]  # nothing before asked
        names = registry.names()
        import experiments
        modules = [m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")]
        print(sorted(m for m in modules if "experiments." + m not in sys.modules), "shakespeare_char" in names)
        """
    )
    assert out == "[] True"


def test_the_entry_points_do_not_import_experiments_until_an_experiment_is_asked_for():
    out = python(
        """
        import sys
        import pax_eqx.train, pax_eqx.eval, pax_eqx.decode, pax_eqx.inspect_data, pax_eqx.tune
        print([m for m in sys.modules if m.split(".")[0] in ("experiments", "benchmarks")])
        """
    )
    assert out == "[]"


def test_a_package_of_ones_own_registers_through_its_entry_point(tmp_path):
    """A distribution declaring `[pax_eqx.experiments] mine = my_exps`: a module added to the
    package is found with no edit anywhere else."""
    dist = tmp_path / "my_exps-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-exps\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pax_eqx.experiments]\nmine = my_exps\n")
    (tmp_path / "my_exps").mkdir()
    (tmp_path / "my_exps" / "__init__.py").write_text("")
    (tmp_path / "my_exps" / "tiny.py").write_text(
        textwrap.dedent(
            '''
            from experiments.shakespeare import shakespeare_char
            from pax_eqx.command_line.registry import register

            @register("my_tiny", aliases=("MyTiny",))
            def my_tiny():
                """A user's experiment from a package of their own."""
                return shakespeare_char().replace(name="")
            '''
        )
    )
    out = python(
        """
        from pax_eqx.command_line import registry
        print(registry.load_experiment("MyTiny").name, "my_tiny" in registry.names())
        """,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out == "my_tiny True"


def test_an_unknown_experiment_is_a_user_error():
    with pytest.raises(registry.UnknownExperimentError, match="Did you mean 'shakespeare_char'") as info:
        registry.load_experiment("shakespeare_chars")
    assert isinstance(info.value, ConfigError)
    with pytest.raises(ConfigError, match="cannot import module"):
        registry.load_experiment("no_such_package.module.attr")


def test_experiments_registry_is_the_librarys_registry():
    import experiments.registry

    assert experiments.registry.register is registry.register
    assert experiments.registry.load_experiment is registry.load_experiment
    assert experiments.registry.UnknownExperimentError is registry.UnknownExperimentError


def test_an_install_without_the_entry_point_says_so(monkeypatch):
    """A stale install (from before the entry point) finds no experiments: the error says why
    and how to fix it, instead of listing an empty registry."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_ALIASES", {})
    monkeypatch.setattr(registry, "_loaded", True)
    with pytest.raises(registry.UnknownExperimentError, match="no experiments are registered.*pip install -e"):
        registry.load_experiment("shakespeare_char")
