"""The experiment registry, as experiments and users have always imported it.

The mechanism lives in the library (`pax_eqx.command_line.registry`); this module re-exports it so
`from experiments.registry import register` and `experiments.registry.load_experiment(name)`
keep working. The library finds the modules of this package through the `pax_eqx.experiments`
entry point declared in pyproject.toml, which imports every module in `experiments/`: a new
experiment file needs no edit here.
"""

from __future__ import annotations

from pax_eqx.command_line.registry import (
    UnknownExperimentError,
    aliases,
    describe,
    load_entry_points,
    load_experiment,
    names,
    register,
)

__all__ = [
    "UnknownExperimentError",
    "aliases",
    "describe",
    "load_entry_points",
    "load_experiment",
    "names",
    "register",
]
