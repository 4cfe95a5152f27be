"""Hyperparameter search (`python -m pax_eqx.tune`): search spaces declared with experiments,
trials run as real training runs, an Optuna study that resumes and spans machines.

Only the search-space vocabulary is imported here (experiments declare spaces without
importing Optuna); the tuner's modules are `check`, `trial_run`, `study` and `report`.
"""

from pax_eqx.tuning.space import Choice, IntRange, LogUniform, SearchSpace, SearchSpaceError, Uniform, parse_param
