"""Tuners of one SQLite study claim trials one at a time across processes (DIR/claim.lock).

SQLite reads a trial's state outside the transaction that writes it, so two tuners claiming at
once could take the same waiting trial, or requeue a dead worker's trial twice; then two
trainers race for one job dir. The end-to-end case (a killed tuner, two tuners resuming its
study) is tests/tuning/test_tune_cli.py; here, the lock itself: a claim waits while another
process's lock is held, and a database server's storage (which locks rows) takes none.
"""

from __future__ import annotations

import contextlib
import threading

import optuna
from filelock import FileLock

from experiments import registry
from pax_eqx.tuning.space import LogUniform, SearchSpace
from pax_eqx.tuning.study import CLAIM_LOCK, Tuner, _claim_lock


def _tuner(study: optuna.Study, study_dir) -> Tuner:
    space = SearchSpace({"learner.learning_rate": LogUniform(1e-4, 1e-2)})
    base = registry.load_experiment("shakespeare_char")
    return Tuner(study, "shakespeare_char", space, base, [], study_dir, 2, heartbeat_seconds=30, log=lambda _: None)


def test_a_claim_waits_for_another_processs_claim_of_a_sqlite_study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    tuner = _tuner(study, tmp_path)
    other = FileLock(tmp_path / CLAIM_LOCK)  # another open file: flock treats it as another process
    other.acquire()
    claimed = []
    claiming = threading.Thread(target=lambda: claimed.append(tuner._claim()))
    claiming.start()
    claiming.join(1.0)
    assert claiming.is_alive() and not claimed  # waiting on the lock, nothing asked of the study
    assert study.get_trials() == []
    other.release()
    claiming.join(30)
    assert not claiming.is_alive()
    trial, values = claimed[0]
    assert trial.number == 0 and set(values) == {"learner.learning_rate"}


def test_only_a_sqlite_study_takes_the_file_lock(tmp_path):
    """A database server's storage locks its rows and is shared by hosts a file lock would not
    reach (here: any storage but SQLite's, in memory)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    assert isinstance(_claim_lock(optuna.create_study(), tmp_path), contextlib.nullcontext)
    sqlite = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert isinstance(_claim_lock(sqlite, tmp_path), FileLock)
